"""Bad input goes to the deadletter topic with its reason, late input is counted, work goes on."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from worker_fixtures import (
    S,
    StartWorker,
    aligned_t0,
    decoded,
    pod_event,
    produce,
    scenario,
    wait_for,
)

from gpuwatch import kafka
from schemas import DEADLETTER, GPU_WINDOWS, K8S_NODES, K8S_PODS, NVML_SAMPLES
from schemas.settings import Settings

pytestmark = pytest.mark.integration


def bad_inputs(settings: Settings, t0: int, sample: Any) -> list[tuple[str, bytes | None, str]]:
    """(topic, value, a piece of the reason) of messages no worker can process."""
    prefix = settings.kafka.topic_prefix
    samples, pods, nodes = (spec.full_name(prefix) for spec in (NVML_SAMPLES, K8S_PODS, K8S_NODES))
    good = msgspec.to_builtins(sample)
    gpu = good["gpus"][0]
    pod = msgspec.to_builtins(pod_event("u-1", "p", ts=t0, rv=1, node="n", created_at=t0))

    def variant(base: dict[str, Any], **changes: Any) -> bytes:
        return json.dumps({**base, **changes}).encode()

    return [
        (samples, b"not json {", "not JSON"),
        (samples, variant(pod), "expected 'gpuwatch.nvml.sample/v1'"),
        (samples, variant(good, schema="gpuwatch.nvml.sample/v2"), "unknown major version"),
        (samples, variant(good, ts=t0 // 1000), "seconds instead of milliseconds"),
        (samples, variant(good, gpus=[{**gpu, "power_w": 50_000.0}]), "power_w 50000.0"),
        (samples, variant(good, gpus=[{**gpu, "util_pct": 250.0}]), "util_pct"),
        (samples, None, "tombstone"),
        (pods, variant(pod, started_at=t0 - 3_600 * S), "started_at"),
        (pods, variant(pod, node=None), "phase Running without a node"),
        (nodes, b"\xff\xfe binary", "not JSON"),
    ]


def test_bad_messages_go_to_the_deadletter_topic_and_the_worker_goes_on(
    scoped: Settings, start_worker: StartWorker
) -> None:
    case = scenario(scoped, aligned_t0())
    bad = bad_inputs(scoped, case.t0, case.samples[0])
    producer = kafka.producer(scoped.kafka, acks="all")
    try:
        sent = [
            producer.send(topic, key=b"gwtest-node-a", value=value).get(timeout=30)
            for topic, value, _ in bad
        ]
    finally:
        producer.close()
    produce(scoped, case.messages)
    # A node first seen after the partition's stream time passed its window by more than
    # the revision horizon (10 s here: its window closed at 70 s, stream time is at 89 s):
    # late, left out and counted. (Within the horizon it would be that window's first copy.)
    first = case.samples[5]
    gpus = tuple(
        msgspec.structs.replace(g, uuid=f"GPU-late-{i}", processes=())
        for i, g in enumerate(first.gpus)
    )
    late = msgspec.structs.replace(first, node="gwtest-node-late", gpus=gpus, allocations=())
    partition = sent[0].partition  # the key of every bad sample is node a's
    samples_topic = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
    produce(scoped, [(samples_topic, b"gwtest-node-late", NVML_SAMPLES.encode(late), partition)])
    worker = start_worker(scoped, env={"GPUWATCH_REVISION_HORIZON_S": "10"})

    def letters_in() -> list[Any]:
        letters = decoded(scoped, DEADLETTER)
        return letters if len(letters) >= len(bad) else []

    letters = wait_for("the dead letters", letters_in, worker)
    windows = wait_for("the good samples' windows", lambda: decoded(scoped, GPU_WINDOWS), worker)
    worker.stop()
    assert worker.process.returncode == 0, worker.log
    assert len(letters) == len(bad)
    by_place = {(d.source_topic, d.partition, d.offset): d for d in letters}
    for (topic, value, reason), meta in zip(bad, sent, strict=True):
        letter = by_place[(topic, meta.partition, meta.offset)]
        assert reason in letter.error, (topic, letter.error)
        assert letter.raw_bytes() == (value or b"")
        assert letter.key == "gwtest-node-a"
    assert {w.window_start for w in windows} == {case.t0}
    assert len(windows) == 2  # node a's two GPUs; nothing of the late node
    counters = worker.counters()
    assert counters["deadletter"] == len(bad)
    assert counters["late"] == 1
