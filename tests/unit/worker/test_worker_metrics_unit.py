"""The worker's /metrics without a server: its pipeline counters and the stream's alerts, as the
processors emit them; the pod and GPU metrics are the metrics sink's."""

from __future__ import annotations

import msgspec

from gpuwatch.harness.examples import example
from gpuwatch.run.worker_sinks import WorkerSinks, pipeline_counts
from schemas.alert import Alert
from schemas.nvml_sample import NvmlSample
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
    assert get("gpuwatch_pod_state", state | {"state": "stalled"}) is None  # `sink metrics`
    assert pipeline_counts(counters)["gpuwatch_duplicate_events"] == {(): 1.0}


def test_delivery_failures_are_served_by_topic_and_reason() -> None:
    counters = Counters()
    counters.delivery_failures[("t.attribution", "MessageSizeTooLargeError")] = 2
    get = WorkerSinks(Settings(), counters).registry.get_sample_value
    labels = {"topic": "t.attribution", "reason": "MessageSizeTooLargeError"}
    assert get("gpuwatch_delivery_failures_total", labels) == 2


def test_the_worker_counts_and_shows_the_alerts_it_emits_and_reads_the_lag() -> None:
    sinks = WorkerSinks(Settings(), Counters(), wall=lambda: 1_764_412_100.0)
    alert = msgspec.convert(example("gpuwatch.alert/v1"), Alert)
    sinks.on_record(alert)
    get = sinks.registry.get_sample_value
    counted = {"alertname": alert.name, "severity": alert.severity, "status": alert.status}
    assert get("gpuwatch_alerts_total", counted) == 1
    sample = msgspec.convert(example("gpuwatch.nvml.sample/v1"), NvmlSample)
    sinks.on_sample(sample)
    lag = 1_764_412_100.0 - (sample.ts + sample.interval_ms) / 1000
    assert get("gpuwatch_pipeline_lag_seconds", {}) == max(0.0, lag)
    gpu = {"node": sample.node, "gpu": sample.gpus[0].uuid, "model": sample.gpus[0].model}
    assert get("gpuwatch_gpu_utilization_ratio", gpu) is None  # `sink metrics`
