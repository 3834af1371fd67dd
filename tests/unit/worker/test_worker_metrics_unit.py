"""The worker's /metrics without a server: values counted as the processors emit them."""

from __future__ import annotations

import msgspec

from gpuwatch.run.worker_sinks import WorkerSinks, pipeline_counts
from schemas.examples import example
from schemas.pod_lifecycle import PodLifecycle
from schemas.settings import Settings
from streams.processors.outputs import Counters


def transition(uid: str, ts: int = 1_764_412_000_000) -> PodLifecycle:
    raw = example("gpuwatch.pod.lifecycle/v1") | {"uid": uid, "ts": ts}
    return msgspec.convert(raw, PodLifecycle)


def test_metrics_count_emitted_values_and_pipeline_counters() -> None:
    counters = Counters(late=3, duplicates=1)
    counters.by_topic["t.nvml.samples"] = 7
    counters.dead_by[("t.k8s.pods", "json")] = 2
    sinks = WorkerSinks(Settings(), counters)
    sinks.on_record(transition("u1"))
    sinks.on_record({"not": "a record"})  # ignored
    get = sinks.registry.get_sample_value
    assert get("gpuwatch_events_total", {"topic": "t.nvml.samples"}) == 7
    assert get("gpuwatch_deadletter_total", {"topic": "t.k8s.pods", "reason": "json"}) == 2
    assert get("gpuwatch_late_events_total", {}) == 3
    state = {"namespace": "ml", "pod": "train-0", "team": "vision", "node": "gpu-node-17"}
    assert get("gpuwatch_pod_state", state | {"state": "stalled"}) == 1  # the example's
    assert pipeline_counts(counters)["gpuwatch_duplicate_events"] == {(): 1.0}
