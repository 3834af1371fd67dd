"""Helpers of the worker tests: a simulated cluster on a fake clock, Kafka in and out, polling."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka.errors import CoordinatorNotAvailableError
from support import WaitTimeoutError, wait_until
from topic_io import consume_all

from gpuwatch import kafka
from gpuwatch.harness.simulate.gpus import SimReader, WorkloadKind
from gpuwatch.harness.simulate.node import SimPod, SimPods, simple_node
from producers.agent.loop import NodeAgent
from schemas import (
    ALERTS,
    ATTRIBUTION,
    GPU_WINDOWS,
    K8S_PODS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    K8sPod,
    NvmlSample,
    TopicSpec,
)
from schemas.settings import Settings

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
STOPPED = re.compile(r"worker stopped events=(\d+) deadletter=(\d+) late=(\d+) duplicates=(\d+)")
S = 1000
WINDOW_MS = 60 * S
TICKS = 90  # 90 s of samples: the first window [t0, t0 + 60 s) closes at t0 + 70 s
FINISH_S = 75  # the training pod ends then; its windows close at t0 + 85 s
QUEUED_UID = "99999999-0000-4000-8000-000000000001"
WORKER_ENV = {
    "GPUWATCH_STALL_AFTER_S": "45",  # the idle pod stalls within the 90 s
    "GPUWATCH_QUEUED_ALERT_AFTER_S": "30",  # the queued pod fires within them too
}

Message = tuple[str, bytes | None, bytes, int | None]
"""(topic, key, value, partition) to produce; partition None: by key."""
StartWorker = Callable[..., "Worker"]
"""The `start_worker` fixture: `start(settings, instance="w1", env=None, sink=None) -> Worker`
(with `sink="redis"` or `"metrics"`, a `gpuwatch sink ...` process instead of a worker)."""


class FakeClock:
    """The agent's clocks, moved by hand: event time is whatever the test says."""

    def __init__(self, start_s: float) -> None:
        self.now = start_s

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


@dataclass
class Scenario:
    """A node with a training and an idle pod, a queued pod, and every message of 90 s."""

    t0: int
    node: str
    training: SimPod
    idle: SimPod
    samples: list[NvmlSample]
    messages: list[Message] = field(default_factory=list)


def aligned_t0() -> int:
    """A window start ten minutes ago: recent, so no sanity check rejects it."""
    return (int(time.time() * 1000) - 600 * S) // WINDOW_MS * WINDOW_MS


def scenario(settings: Settings, t0: int, node: str = "gwtest-node-a") -> Scenario:
    """Pod events at t0 - 5 s, then 90 samples 1 s apart; the training pod ends at t0 + 75 s.

    The queued pod is Unschedulable from t0. Messages come in event-time order, topic by
    topic as a live cluster would send them: pod events first, samples after.
    """
    clock = FakeClock(t0 / S)
    kinds: tuple[WorkloadKind, ...] = ("training", "idle")
    agent, reader, pods, raw = recording_agent(node, clock, len(kinds), seed=7, mix=kinds)
    by_kind = {pod.container: pod for pod in pods.pods.values()}
    training, idle = by_kind["training"], by_kind["idle"]
    created = t0 - 60 * S
    events = [
        pod_event(p.uid, p.name, ts=t0 - 5 * S, rv=10 + i, node=node, created_at=created)
        for i, p in enumerate((training, idle))
    ]
    events.append(pod_event(QUEUED_UID, "queued-0", ts=t0, rv=20, node=None, created_at=t0))
    samples = []
    for second in range(TICKS):
        if second == FINISH_S:
            _end(reader, pods, training)
            events.append(
                pod_event(
                    training.uid,
                    training.name,
                    ts=t0 + FINISH_S * S,
                    rv=30,
                    node=node,
                    phase="Succeeded",
                    created_at=created,
                    type_="MODIFIED",
                )
            )
        clock.now += 1.0
        samples.append(agent.tick())
    pods_topic = K8S_PODS.full_name(settings.kafka.topic_prefix)
    samples_topic = NVML_SAMPLES.full_name(settings.kafka.topic_prefix)
    messages: list[Message] = [
        (pods_topic, e.uid.encode(), K8S_PODS.encode(e), None) for e in events
    ]
    messages += [(samples_topic, key, value, None) for key, value in raw]
    return Scenario(t0, node, training, idle, samples, messages)


def recording_agent(
    node: str,
    clock: FakeClock,
    gpus: int,
    *,
    seed: int,
    mix: tuple[WorkloadKind, ...] | None = None,
) -> tuple[NodeAgent, SimReader, SimPods, list[tuple[bytes, bytes]]]:
    """A node agent on simulated GPUs sampling every second of `clock`, and the list of
    (key, value) it publishes to."""
    kw = {} if mix is None else {"mix": mix}
    reader, pods = simple_node(node, gpus, seed=seed, now=clock.time, **kw)
    raw: list[tuple[bytes, bytes]] = []
    agent = NodeAgent(
        node=node,
        reader=reader,
        resolver=pods,
        allocations=pods,
        publish=lambda key, value: raw.append((key, value)),
        interval_s=1.0,
        clock=clock,
    )
    return agent, reader, pods, raw


def _end(reader: SimReader, pods: SimPods, pod: SimPod) -> None:
    """The pod's process exits and the kubelet frees its GPU."""
    for pid in [pid for pid, uid in pods.pids.items() if uid == pod.uid]:
        reader.remove_workload(pid)
    pods.remove(pod.uid)


def pod_event(
    uid: str,
    name: str,
    *,
    ts: int,
    rv: int,
    node: str | None,
    created_at: int,
    phase: str | None = None,
    type_: str = "ADDED",
) -> K8sPod:
    """A `k8s.pods` value: Running on `node`, Pending and unschedulable without one."""
    phase = phase or ("Running" if node else "Pending")
    running, done = phase == "Running", phase in ("Succeeded", "Failed")
    container = {
        "name": "main",
        "state": "running" if running else "terminated" if done else "waiting",
        "reason": "Completed" if done else None,
        "exit_code": 0 if done else None,
        "restarts": 0,
    }
    condition = {
        "type": "PodScheduled",
        "status": "True" if node else "False",
        "reason": None if node else "Unschedulable",
        "message": None if node else "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
    }
    message = {
        "schema": "gpuwatch.k8s.pod/v1",
        "type": type_,
        "ts": ts,
        "resource_version": str(rv),
        "uid": uid,
        "namespace": "ml",
        "name": name,
        "node": node,
        "phase": phase,
        "created_at": created_at,
        "scheduled_at": created_at + S if node else None,
        "started_at": created_at + 2 * S if node else None,
        "finished_at": ts if done else None,
        "gpu_request": {"nvidia.com/gpu": 1},
        "conditions": [condition],
        "containers": [container] if node else [],
        "labels": {"team": "vision"},
        "owner": {"kind": "Job", "name": name},
        "priority_class": None,
        "queue": None,
    }
    return K8S_PODS.decode(json.dumps(message))


def produce(settings: Settings, messages: list[Message]) -> None:
    """Send messages in order, acknowledged by all replicas."""
    producer = kafka.producer(settings.kafka, acks="all")
    try:
        for topic, key, value, partition in messages:
            producer.send(topic, key=key, value=value, partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close()


def decoded(settings: Settings, spec: TopicSpec[Any]) -> list[Any]:
    """Every value of a topic, decoded through its codec."""
    records = consume_all(settings, spec.full_name(settings.kafka.topic_prefix))
    return [spec.decode(record.value) for record in records]


Identities = dict[str, dict[tuple[Any, ...], list[Any]]]
"""Derived topic -> record identity -> every copy of it."""

KEYS: dict[str, tuple[Any, Callable[[Any], tuple[Any, ...]]]] = {
    "pod.lifecycle": (POD_LIFECYCLE, lambda c: (c.uid, c.ts, c.to_state)),
    "alerts": (ALERTS, lambda a: (a.fingerprint, a.status, a.ts)),
    "attribution": (ATTRIBUTION, lambda a: (a.uid, a.window_start)),
    "gpu.windows": (GPU_WINDOWS, lambda w: (w.uuid, w.window_start)),
}


def identities(settings: Settings) -> Identities:
    """Every record of the derived topics, grouped by its identity."""
    out: Identities = {}
    for name, (spec, key) in KEYS.items():
        grouped: dict[tuple[Any, ...], list[Any]] = {}
        for value in decoded(settings, spec):
            grouped.setdefault(key(value), []).append(value)
        out[name] = grouped
    return out


def finished(settings: Settings) -> bool:
    """All the scenario's windows and alerts are out (3 attributions, 2 GPU windows, 3 alerts)."""
    return (
        len({(a.uid, a.window_start) for a in decoded(settings, ATTRIBUTION)}) >= 3
        and len(decoded(settings, GPU_WINDOWS)) >= 2
        and len({a.fingerprint for a in decoded(settings, ALERTS)}) >= 3
    )


def assert_same_records(got: Settings, want: Settings) -> None:
    """Every identity of `want` is in `got`, each copy equal to `want`'s one record."""
    expected, actual = identities(want), identities(got)
    for topic, records in expected.items():
        assert sorted(actual[topic]) == sorted(records), topic
        for identity, (record,) in records.items():
            for copy in actual[topic][identity]:
                diff = {
                    name: (getattr(copy, name), value)
                    for name, value in msgspec.structs.asdict(record).items()
                    if getattr(copy, name) != value
                }
                assert diff == {}, (topic, identity)


def run_alone(settings: Settings, start: StartWorker, messages: list[Message]) -> Worker:
    """The scenario's `messages` on `settings`' topics, worked off by one worker undisturbed
    (running on)."""
    produce(settings, messages)
    worker = start(settings, "alone")
    wait_for("the undisturbed run", lambda: finished(settings), worker)
    return worker


def moved(messages: list[Message], old: Settings, new: Settings) -> list[Message]:
    """`messages` made for `old`'s topics, for `new`'s (the topic names differ by prefix)."""
    before, after = old.kafka.topic_prefix, new.kafka.topic_prefix
    return [(after + topic.removeprefix(before), *rest) for topic, *rest in messages]


def group_members(settings: Settings) -> int:
    """Members of the worker's consumer group now (0 while it is rebalancing).

    A broker just started has no group coordinator for a moment: that is 0 members too.
    """
    admin = kafka.admin(settings.kafka)
    try:
        group = admin.describe_groups([settings.kafka.app_id])[settings.kafka.app_id]
    except CoordinatorNotAvailableError:
        return 0
    finally:
        admin.close()
    return len(group["members"]) if group["group_state"] == "Stable" else 0


@dataclass
class Worker:
    """A `gpuwatch worker` subprocess writing its log to a file; `stop()` ends it."""

    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        """What the worker logged so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Signal the worker (SIGTERM: commit and leave; SIGKILL: a crash), wait, the log."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.log

    def counters(self) -> dict[str, int]:
        """The counters of the worker's last line, after a SIGTERM."""
        found = STOPPED.search(self.log)
        assert found is not None, self.log
        names = ("events", "deadletter", "late", "duplicates")
        return dict(zip(names, (int(g) for g in found.groups()), strict=True))


def spawn_worker(
    settings: Settings,
    log_path: Path,
    instance: str = "w1",
    env: dict[str, str] | None = None,
    *,
    sink: str | None = None,
) -> Worker:
    """Start a `gpuwatch worker` process on the settings' topics, `env` over WORKER_ENV; with
    `sink`, a `gpuwatch sink <sink>` process on them."""
    env = {
        **os.environ,
        **WORKER_ENV,
        # Redis and /metrics are tested on their own (test_worker_sinks.py): several
        # workers of these tests would otherwise share a Redis database and a port.
        "GPUWATCH_WORKER_SINKS": "false",
        **(env or {}),
        "GPUWATCH_TOPIC_PREFIX": settings.kafka.topic_prefix,
        "GPUWATCH_APP_ID": settings.kafka.app_id,
        "GPUWATCH_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
        "GPUWATCH_KAFKA_PARTITIONS": str(settings.kafka.partitions),
    }
    argv = [str(GPUWATCH), "worker", "--tick-interval", "0.5", "--session-timeout", "6"]
    argv += ["--instance", instance]
    if sink is not None:
        argv = [str(GPUWATCH), "sink", sink]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Worker(process, log_path)


@contextmanager
def worker_starter(log_dir: Path) -> Iterator[StartWorker]:
    """`start(settings, instance="w1", env=None, sink=None)`: workers (or sinks) logging to
    `log_dir`, all stopped (SIGTERM) on the way out."""
    started: list[Worker] = []

    def start(
        settings: Settings,
        instance: str = "w1",
        env: dict[str, str] | None = None,
        *,
        sink: str | None = None,
    ) -> Worker:
        kind = "worker" if sink is None else f"sink-{sink}"
        log_path = log_dir / f"{kind}-{len(started)}-{instance}.log"
        started.append(spawn_worker(settings, log_path, instance, env, sink=sink))
        return started[-1]

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


def wait_for(
    what: str, check: Callable[[], Any], worker: Worker | None = None, timeout_s: float = 45.0
) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s`, or as soon as
    `worker` exits, with the worker's log."""

    def checked() -> Any:
        result = check()
        if not result and worker is not None and worker.process.poll() is not None:
            pytest.fail(f"the worker exited while waiting for {what}:\n{worker.stop()}")
        return result

    try:
        return wait_until(checked, timeout_s=timeout_s, what=what, interval_s=0.2)
    except WaitTimeoutError as exc:
        detail = "" if worker is None else f"\nworker log:\n{worker.stop()}"
        pytest.fail(f"{exc}{detail}")
