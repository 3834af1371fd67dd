"""`gpuwatch replay --pod/--gpu/--node` on the real broker, over records made by hand."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import RunCli
from topic_io import topic_scopes
from worker_fixtures import aligned_t0, produce

from gpuwatch import kafka
from gpuwatch.harness.examples import GPU_0, GPU_1, POD_UID, POD_UID_2, example
from gpuwatch.kafka import TopicPartition
from schemas import (
    ALERTS,
    ATTRIBUTION,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    Alert,
    Attribution,
    NvmlSample,
    PodLifecycle,
    TopicSpec,
)
from schemas.settings import Settings

pytestmark = pytest.mark.integration

S, MIN, GIB = 1000, 60_000, 1 << 30
NODE = "gpu-node-17"
USED = [10.0, 50.0, 40.0, 5.0, 0.0]  # the five windows of train-0, [t0 + k min, + 1 min)
IDLE = [50.0, 5.0, 10.0, 55.0, 60.0]
WASTE = [0.0548, 0.0055, 0.011, 0.0603, 0.0658]
UTILS = [60.0 + (i % 5) * 10 for i in range(30)]  # samples t0 + 20 s .. t0 + 49 s
LOST_SEQ = 10  # this sample never arrived


def lifecycle(uid: str, ts: int, old: str | None, new: str, reason: str | None) -> PodLifecycle:
    data = example("gpuwatch.pod.lifecycle/v1")
    name = "train-0" if uid == POD_UID else "other-0"
    data.update(uid=uid, pod=name, ts=ts, from_state=old, to_state=new, reason=reason)
    return msgspec.convert(data, PodLifecycle)


def window(t0: int, k: int) -> Attribution:
    data = example("gpuwatch.attribution/v1")
    start = t0 + k * MIN
    data.update(window_start=start, window_end=start + MIN, ts=start + MIN)
    data.update(used_gpu_seconds=USED[k], idle_gpu_seconds=IDLE[k], waste_usd=WASTE[k])
    data.update(state="running" if k < 3 else "stalled")
    return msgspec.convert(data, Attribution)


def alert(ts: int, status: str) -> Alert:
    data = example("gpuwatch.alert/v1")
    data.update(name="PodStalled", status=status, ts=ts, since=ts, fingerprint="stall-train-0")
    data["subject"] = {"kind": "pod", "uid": POD_UID, "uuid": None, "node": NODE}
    data["labels"] = {"namespace": "ml", "pod": "train-0", "node": NODE}
    data["summary"] = f"ml/train-0 {status}"
    return msgspec.convert(data, Alert)


def sample(t0: int, i: int) -> NvmlSample:
    data = example("gpuwatch.nvml.sample/v1")
    gpu0 = data["gpus"][0]
    gpu0.update(util_pct=UTILS[i], mem_used_bytes=(10 + i) * GIB)
    gpu1 = {**gpu0, "uuid": GPU_1, "index": 1, "util_pct": 3.0, "mem_used_bytes": 70 * GIB}
    mine = data["allocations"][0]
    other = {**mine, "pod_uid": POD_UID_2, "pod": "other-0", "device_ids": [GPU_1]}
    data.update(seq=i + 1, ts=t0 + (20 + i) * S, gpus=[gpu0, gpu1], allocations=[mine, other])
    return msgspec.convert(data, NvmlSample)


def moved(line: str) -> str:
    """`queued -> running (reason)` of a lifecycle line of the table."""
    return line.split(" lifecycle ", 1)[1].strip().split("  ")[0]


@dataclass
class Incident:
    """The scope the records went to and the start of their range."""

    settings: Settings
    t0: int

    def args(self, *more: str) -> list[str]:
        return ["--from", str(self.t0), "--to", str(self.t0 + 5 * MIN), *more]


def message(settings: Settings, spec: TopicSpec[Any], value: Any) -> tuple[Any, ...]:
    key = spec.key_of(value).encode()
    return (spec.full_name(settings.kafka.topic_prefix), key, spec.encode(value), None)


@pytest.fixture(scope="module")
def incident(stack: Settings) -> Iterator[Incident]:
    """ml/train-0 queued before the range, running at +20 s, stalled at +200 s, done at +290 s."""
    with topic_scopes(stack) as new_scope:
        scoped, t0 = new_scope(), aligned_t0()
        values: list[tuple[TopicSpec[Any], Any]] = [
            (POD_LIFECYCLE, lifecycle(POD_UID, t0 - 10 * MIN, None, "queued", "Unschedulable")),
            (POD_LIFECYCLE, lifecycle(POD_UID, t0 + 20 * S, "queued", "running", None)),
            (POD_LIFECYCLE, lifecycle(POD_UID_2, t0 + 30 * S, None, "running", None)),
            (POD_LIFECYCLE, lifecycle(POD_UID, t0 + 200 * S, "running", "stalled", "Idle")),
            (POD_LIFECYCLE, lifecycle(POD_UID, t0 + 290 * S, "stalled", "finished", "Completed")),
            (ALERTS, alert(t0 + 200 * S, "firing")),
            (ALERTS, alert(t0 + 290 * S, "resolved")),
            *((ATTRIBUTION, window(t0, k)) for k in range(5)),
            (ATTRIBUTION, window(t0, 1)),  # delivered twice
            *((NVML_SAMPLES, sample(t0, i)) for i in range(30) if i + 1 != LOST_SEQ),
        ]
        produce(scoped, [message(scoped, spec, value) for spec, value in values])
        yield Incident(scoped, t0)


def test_the_pod_story_lists_its_transitions_windows_alerts_and_samples(
    incident: Incident, run_cli: RunCli
) -> None:
    code, out, err = run_cli(incident.settings, "--pod", "ml/train-0", *incident.args())
    assert code == 0, err
    lines = out.splitlines()
    assert f"  uid {POD_UID}" in lines
    events = [line.split("  ")[1:3] for line in lines if line.startswith("20")]
    assert [kind.strip() for kind, _ in events] == [
        "lifecycle",  # +20 s
        "window",  # +60 s
        "window",
        "window",
        "lifecycle",  # +200 s: the transition, then the alert it raised
        "alert",
        "window",  # +240 s
        "lifecycle",  # +290 s
        "alert",
        "window",  # +300 s: the last window ends at --to
    ]
    transitions = [line for line in lines if "lifecycle" in line]
    assert [moved(t) for t in transitions] == [
        "queued -> running",
        "running -> stalled (Idle)",
        "stalled -> finished (Completed)",
    ]
    assert "before the range" not in out  # the queued transition at t0 - 10 min is left out
    for k in range(5):
        assert f"used {USED[k]:.1f} of 60.0 GPU-s  idle {IDLE[k]:.1f}" in out
    assert (
        f"attribution: 5 pod windows, allocated 300.0 GPU-s, used {sum(USED):.1f}, idle "
        f"{sum(IDLE):.1f}, cost ${5 * 0.0658:.4f}, waste ${sum(WASTE):.4f}"
    ) in lines
    (row,) = [line for line in lines if line.startswith(GPU_0)]
    kept = [u for i, u in enumerate(UTILS) if i + 1 != LOST_SEQ]
    cells = row.split("  ")
    cells = [c.strip() for c in cells if c.strip()]
    assert cells[1:] == [
        NODE,
        "NVIDIA H100 80GB HBM3",
        str(len(kept)),
        f"{sum(kept) / len(kept):.1f}%",
        f"{max(kept):.1f}%",
        f"{39:.1f} GiB / 79.6 GiB",  # the last sample: (10 + 29) GiB
        "1",  # seq 10 is missing
    ]
    assert not any(line.startswith(GPU_1) for line in lines)  # the other pod's GPU


def test_json_and_the_plot(incident: Incident, run_cli: RunCli, tmp_path: Path) -> None:
    png = tmp_path / "train-0.png"
    args = incident.args("--json", "--plot", str(png))
    code, out, err = run_cli(incident.settings, "--pod", "ml/train-0", *args)
    assert code == 0, err
    events = json.loads(out)
    t0 = incident.t0
    assert [(e["kind"], (e["ts"] - t0) // S) for e in events] == [
        ("lifecycle", 20),
        ("samples", 20),
        ("attribution", 60),
        ("attribution", 120),
        ("attribution", 180),
        ("lifecycle", 200),
        ("alert", 200),
        ("attribution", 240),
        ("lifecycle", 290),
        ("alert", 290),
        ("attribution", 300),
    ]
    stalled = events[5]["record"]
    assert (stalled["uid"], stalled["from_state"], stalled["to_state"]) == (
        POD_UID,
        "running",
        "stalled",
    )
    assert [e["record"]["used_gpu_seconds"] for e in events if e["kind"] == "attribution"] == USED
    assert events[1]["record"]["count"] == 29
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in err
    assert "(29 samples)" in err


def test_the_gpu_and_node_stories(incident: Incident, run_cli: RunCli) -> None:
    code, out, err = run_cli(incident.settings, "--gpu", GPU_1, *incident.args())
    assert code == 0, err
    assert "  pods ml/other-0" in out
    assert "ml/other-0 (0d4e9b71)  new -> running" in out
    (row,) = [line for line in out.splitlines() if line.startswith(GPU_1)]
    assert " 29 " in row
    assert "3.0%" in row
    code, out, err = run_cli(incident.settings, "--node", NODE, *incident.args())
    assert code == 0, err
    assert sum(line.startswith("GPU-") for line in out.splitlines()) == 2
    assert out.count(" lifecycle ") == 4


def test_an_unknown_pod_exits_1_and_says_what_was_searched(
    incident: Incident, run_cli: RunCli
) -> None:
    code, out, err = run_cli(incident.settings, "--pod", "ml/nope-0", *incident.args())
    assert (code, out) == (1, "")
    assert "unknown pod ml/nope-0" in err
    prefix = incident.settings.kafka.topic_prefix
    for topic in ("pod.lifecycle", "attribution", "alerts", "k8s.pods", "nvml.samples"):
        assert f"{prefix}{topic}" in err


def test_an_empty_range_exits_1(incident: Incident, run_cli: RunCli) -> None:
    t0 = incident.t0
    early = ["--from", str(t0 - 120 * MIN), "--to", str(t0 - 60 * MIN)]
    code, out, err = run_cli(incident.settings, "--pod", "ml/train-0", *early)
    assert (code, out) == (1, "")
    assert "empty range: nothing recorded between" in err
    backwards = ["--from", str(t0), "--to", str(t0 - MIN)]
    code, _, err = run_cli(incident.settings, "--pod", "ml/train-0", *backwards)
    assert code == 1
    assert "is not before --to" in err


def test_a_range_older_than_retention_says_the_earliest_time_left(
    new_scope: Any, run_cli: RunCli
) -> None:
    scoped, t0 = new_scope(), aligned_t0()
    topic = POD_LIFECYCLE.full_name(scoped.kafka.topic_prefix)
    old = lifecycle(POD_UID, t0, None, "running", None)
    new = lifecycle(POD_UID, t0 + 5 * MIN, "running", "stalled", "Idle")
    produce(scoped, [(topic, b"k", POD_LIFECYCLE.encode(v), 0) for v in (old, new)])
    admin = kafka.admin(scoped.kafka)
    try:
        admin.delete_records({TopicPartition(topic, 0): 1})  # what retention would do
    finally:
        admin.close()
    span = ["--from", str(t0), "--to", str(t0 + 2 * MIN)]
    code, out, err = run_cli(scoped, "--pod", "ml/train-0", *span)
    assert (code, out) == (1, "")
    assert "older than the topics' retention" in err
    later = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime((t0 + 5 * MIN) / 1000))
    assert f"the earliest time available is {later} UTC" in err


def test_records_written_before_their_event_time_are_found(new_scope: Any, run_cli: RunCli) -> None:
    """A simulation faster than real time writes event times ahead of the wall clock."""
    scoped, t0 = new_scope(), aligned_t0()
    topic = POD_LIFECYCLE.full_name(scoped.kafka.topic_prefix)
    written = int(time.time() * 1000) - 120 * MIN  # two hours before their event times
    producer = kafka.producer(scoped.kafka, acks="all")
    try:
        for i, (old, new) in enumerate([(None, "queued"), ("queued", "running")]):
            value = POD_LIFECYCLE.encode(lifecycle(POD_UID, t0 + i * MIN, old, new, None))
            producer.send(topic, key=b"k", value=value, partition=0, timestamp_ms=written + i)
        producer.flush(timeout=30)
    finally:
        producer.close()
    code, out, err = run_cli(scoped, "--pod", "ml/train-0", "--from", str(t0), "--to", "now")
    assert code == 0, err
    moves = [moved(line) for line in out.splitlines() if " lifecycle " in line]
    assert moves == ["new -> queued", "queued -> running"]
