"""`gpuwatch worker`, `gpuwatch sink redis` and `gpuwatch sink metrics`: Redis comes up late
and converges; the metrics sink shows the pods, the worker its pipeline and alerts; the
worker runs without any Redis."""

from __future__ import annotations

import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
from support import free_port
from worker_fixtures import (
    FINISH_S,
    QUEUED_UID,
    StartWorker,
    aligned_t0,
    decoded,
    pod_event,
    produce,
    scenario,
    wait_for,
)

from gpuwatch.harness.examples import example
from schemas import ALERTS, ATTRIBUTION, K8S_PODS, NVML_SAMPLES, POD_LIFECYCLE, NvmlSample
from schemas.settings import Settings

pytestmark = pytest.mark.integration

S = 1000


@pytest.fixture
def late_redis(tmp_path: Path) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    """A port for a Redis of this test alone, and the servers started on it (stopped after)."""
    started: list[subprocess.Popen[bytes]] = []
    yield free_port(), started
    for server in started:
        server.terminate()
        server.wait(timeout=10)


def start_redis(port: int, tmp_path: Path) -> subprocess.Popen[bytes]:
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(tmp_path)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` whose labels include `labels`."""
    found = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            found.append(float(value))
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def test_the_worker_fills_redis_once_it_comes_up_and_serves_the_pods_on_metrics(
    scoped: Settings, start_worker: StartWorker, late_redis: tuple[int, list[Any]], tmp_path: Path
) -> None:
    redis_port, servers = late_redis
    metrics_port = free_port()
    case = scenario(scoped, aligned_t0())
    t0, training, idle = case.t0, case.training.uid, case.idle.uid
    produce(scoped, case.messages)
    sink_port, exporter_port = free_port(), free_port()
    env = {
        "GPUWATCH_WORKER_SINKS": "true",
        "GPUWATCH_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "GPUWATCH_METRICS_PORT": str(metrics_port),
        "GPUWATCH_SINK_METRICS_PORT": str(sink_port),
        "GPUWATCH_SINK_EXPORTER_PORT": str(exporter_port),
    }
    worker = start_worker(scoped, env=env)
    sink = start_worker(scoped, "sink", env=env, sink="redis")
    exporter = start_worker(scoped, "exporter", env=env, sink="metrics")

    # Redis is not there yet: the stream is processed all the same, /metrics shows it.
    wait_for("the training pod's two windows", lambda: len(decoded(scoped, ATTRIBUTION)) >= 3)
    text = wait_for(
        "the stalled pod on the metrics sink",
        lambda: (t := metrics_text(exporter_port)) and 'state="stalled"' in t and t,
        exporter,
    )
    assert sample_value(text, "gpuwatch_pod_state", pod=case.idle.name, state="stalled") == 1.0
    assert sample_value(text, "gpuwatch_pod_state", pod="queued-0", state="queued") == 1.0
    attributions = decoded(scoped, ATTRIBUTION)
    cost = {ns: sum(a.cost_usd for a in attributions if a.namespace == ns) for ns in ("ml",)}
    wait_for(
        "every window's cost on the metrics sink",
        lambda: (
            sample_value(metrics_text(exporter_port), "gpuwatch_cost_usd_total", namespace="ml")
            == pytest.approx(cost["ml"])
        ),
        exporter,
    )
    text = metrics_text(metrics_port)  # the worker's own: pipeline and alerts, no pods
    samples_topic = f"{scoped.kafka.topic_prefix}nvml.samples"
    assert sample_value(text, "gpuwatch_events_total", topic=samples_topic) == 90.0
    assert sample_value(text, "gpuwatch_deadletter_total") is None
    assert sample_value(text, "gpuwatch_late_events_total") == 0.0
    assert sample_value(text, "gpuwatch_pod_state", pod=case.idle.name, state="stalled") is None
    firing = sample_value(text, "gpuwatch_alert_firing", alertname="PodStalled", pod=case.idle.name)
    assert firing == 1.0
    wait_for("the sink to notice Redis is away", lambda: "Redis unavailable" in sink.log, sink)
    assert "Redis" not in worker.log  # the worker never needs it

    # Redis comes up: everything the worker made reaches it, nothing skipped.
    servers.append(start_redis(redis_port, tmp_path))
    client = redis.Redis(port=redis_port, decode_responses=True)

    def pod(uid: str) -> dict[str, str]:
        try:
            return client.hgetall(f"gpuwatch:pod:{uid}")  # type: ignore[return-value]
        except redis.ConnectionError:
            return {}

    wait_for(
        "the pods' state in Redis",
        lambda: pod(training).get("state") == "finished" and pod(idle).get("state") == "stalled",
        sink,
        timeout_s=60,
    )
    # Every window of every pod is in the totals, to the nano-dollar.
    for uid in (training, idle):
        mine = [a for a in decoded(scoped, ATTRIBUTION) if a.uid == uid]
        want = sum(Decimal(str(a.cost_usd)) for a in mine)
        assert Decimal(pod(uid)["cost_usd"]) == pytest.approx(want, abs=Decimal("1e-8"))
    assert pod(training)["reason"] == "Completed"
    assert int(pod(training)["state_since"]) == t0 + FINISH_S * 1000
    assert pod(QUEUED_UID)["state"] == "queued"
    assert client.zscore("gpuwatch:state:stalled", idle) == t0 + 45_000
    firing = client.hgetall("gpuwatch:alerts:firing")
    names = sorted(value.split('"name":"')[1].split('"')[0] for value in firing.values())
    assert names == ["GpuIdleAllocated", "PodQueuedTooLong", "PodStalled"]
    # The idle pod's timeline: its two transitions and the PodStalled alert.
    timeline = client.xrange(f"gpuwatch:timeline:{idle}")
    changes = [c for c in decoded(scoped, POD_LIFECYCLE) if c.uid == idle]
    alerts = [a for a in decoded(scoped, ALERTS) if a.subject.uid == idle]
    assert (len(changes), len(alerts)) == (2, 1)
    assert len(timeline) == 3, timeline
    # The idle pod's GPU: live state from the samples, idle since the first sample.
    (uuid,) = case.idle.gpu_uuids
    gpu = wait_for(
        "the idle GPU's live state",
        lambda: (g := client.hgetall(f"gpuwatch:gpu:{uuid}")) and "util_pct" in g and g,
        sink,
    )
    assert gpu["node"] == case.node
    assert int(gpu["idle_since"]) == t0
    assert idle in gpu["pods"]
    sink_text = metrics_text(sink_port)
    assert sample_value(sink_text, "gpuwatch_sink_samples_total") == 90.0
    assert sample_value(sink_text, "gpuwatch_sink_rejected_total") == 0.0
    worker.stop()
    sink.stop()
    exporter.stop()
    assert worker.process.returncode == 0, worker.log
    assert sink.process.returncode == 0, sink.log
    assert exporter.process.returncode == 0, exporter.log
    assert "rejected=0" in sink.log


def time_sliced(settings: Settings, t0: int, node: str, seconds: int) -> list[Any]:
    """Three pods time-slicing one GPU, each process at SM 30 % (the device at 90 %): pod
    events at t0 - 5 s, then `seconds` node samples 1 s apart, as messages to produce."""
    gpu_uuid = f"GPU-{uuid.uuid4()}"
    pods = [(str(uuid.uuid4()), f"slice-{i}") for i in range(3)]
    created = t0 - 60 * S
    events = [
        pod_event(uid, name, ts=t0 - 5 * S, rv=10 + i, node=node, created_at=created)
        for i, (uid, name) in enumerate(pods)
    ]
    raw = example("gpuwatch.nvml.sample/v1")
    reading = raw["gpus"][0] | {"uuid": gpu_uuid, "sharing": "time-slicing", "util_pct": 90.0}
    process = reading["processes"][0]
    reading["processes"] = [
        process | {"pid": 100 + i, "pod_uid": uid, "sm_pct": 30.0, "mem_bytes": 10 * 2**30}
        for i, (uid, _) in enumerate(pods)
    ]
    reading["mem_used_bytes"] = 30 * 2**30
    allocation = raw["allocations"][0]
    allocations = [
        allocation | {"pod_uid": uid, "pod": name, "device_ids": [gpu_uuid]} for uid, name in pods
    ]
    pods_topic = K8S_PODS.full_name(settings.kafka.topic_prefix)
    samples_topic = NVML_SAMPLES.full_name(settings.kafka.topic_prefix)
    messages: list[Any] = [(pods_topic, e.uid.encode(), K8S_PODS.encode(e), None) for e in events]
    for second in range(seconds):
        sample = raw | {"node": node, "ts": t0 + second * S, "seq": second + 1}
        sample |= {"gpus": [reading], "allocations": allocations}
        value = NVML_SAMPLES.encode(msgspec.convert(sample, NvmlSample))
        messages.append((samples_topic, node.encode(), value, None))
    return messages


def test_a_time_sliced_pods_share_after_a_backlog_is_its_own_not_k_times_it(
    scoped: Settings, start_worker: StartWorker
) -> None:
    """The metrics sink and the worker start on a backlog: the worker writes each pod's
    usage before its lifecycle and windows, and the sink reads them in that order. Each pod
    shows its own share (SM 30 %), as a sink running live does, not its windows' used over
    allocated seconds (3 x 30 %: a GPU's seconds count a third to each of 3 sharers)."""
    produce(scoped, time_sliced(scoped, aligned_t0(), "gwtest-sliced", 150))
    port = free_port()
    exporter = start_worker(
        scoped, "exporter", env={"GPUWATCH_SINK_EXPORTER_PORT": str(port)}, sink="metrics"
    )
    worker = start_worker(scoped)
    wait_for("two windows of each pod", lambda: len(decoded(scoped, ATTRIBUTION)) >= 6, worker)
    cost = sum(a.cost_usd for a in decoded(scoped, ATTRIBUTION))

    def served(name: str, **labels: str) -> float | None:
        try:
            return sample_value(metrics_text(port), name, **labels)
        except OSError:  # not serving yet
            return None

    wait_for(
        "every window on the metrics sink",
        lambda: served("gpuwatch_cost_usd_total", namespace="ml") == pytest.approx(cost),
        exporter,
    )
    shares = [served("gpuwatch_pod_gpu_share_ratio", pod=f"slice-{i}") for i in range(3)]
    assert shares == [pytest.approx(0.3)] * 3
