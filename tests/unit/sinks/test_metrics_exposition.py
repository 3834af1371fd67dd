"""Rendering: the fast text equals prometheus_client's, the series caps hold."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from support.metric_records import (
    T0,
    Clock,
    gpu,
    lifecycle,
    parsed,
    pods,
    populated,
    sample,
    value,
    worker,
)

from sinks.prometheus.collector import exposition
from sinks.prometheus.metrics import WorkerMetrics

HEALTH = {
    "throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"],
    "remapped_rows": {"correctable": 1, "uncorrectable": 0, "pending": True, "failed": False},
    "pcie_replays": 3, "ecc_dbe": 2, "xid_errors": [79],
}  # fmt: skip


def test_the_fast_exposition_says_what_prometheus_client_says() -> None:
    metrics = populated()
    fast, reference = exposition(metrics.registry), generate_latest(metrics.registry)
    assert parsed(fast) == parsed(reference)
    names = {name for name, _, _ in parsed(fast)}
    # every family of docs/DESIGN.md §5, the cap's own, firing alerts, the example's
    # ECC count (0): its GPU has ECC, the four capacity families and the example pod's cost
    # per step
    assert len(names) == 24
    assert "gpuwatch_pod_cost_per_unit_usd" in names
    assert b'pod="we\\"ird\\\\pod"' in fast
    metrics.observe_sample(sample("n1", T0 + 1000, [gpu("GPU-1", 3.0, **HEALTH)], {}))
    fast, reference = exposition(metrics.registry), generate_latest(metrics.registry)
    assert parsed(fast) == parsed(reference)
    assert len({name for name, _, _ in parsed(fast)}) == 29  # and the GPU health families


def test_values_read_back_through_a_fresh_registry() -> None:
    metrics = populated()
    text = parsed(generate_latest(metrics.registry))
    pod = {"namespace": "ml", "node": "n1", "pod": "train-0", "team": "vision"}
    running = tuple(sorted((pod | {"state": "running"}).items()))
    assert ("gpuwatch_pod_state", running, 1.0) in text
    assert value(metrics, "gpuwatch_cost_usd_total", namespace="ml", team="vision") == 0.0658
    assert value(metrics, "gpuwatch_gpu_unallocated_access", node="n1", gpu="GPU-1", model="H100")


def test_other_collectors_of_the_registry_are_exposed_too() -> None:
    registry = CollectorRegistry()
    WorkerMetrics(registry, clock=Clock())
    Counter("gpuwatch_test_other", "another collector", registry=registry).inc(7)
    assert ("gpuwatch_test_other_total", (), 7.0) in parsed(exposition(registry))


def test_a_second_worker_metrics_on_one_registry_is_refused() -> None:
    metrics = worker()
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        WorkerMetrics(metrics.registry)


def test_the_pod_cap_holds_under_100k_distinct_pods_and_counts_what_it_refused() -> None:
    metrics = worker()  # the default cap: 50 000 pods
    for record in pods(100_000):
        metrics.observe_lifecycle(record)
    text = exposition(metrics.registry)
    assert text.count(b"\ngpuwatch_pod_state{") == 50_000
    assert value(metrics, "gpuwatch_metrics_tracked", kind="pod") == 50_000
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="pod") == 50_000


def test_finished_pods_make_room_for_new_ones_at_the_cap() -> None:
    metrics = worker(max_pod_series=1000)
    for record in pods(5000, to="finished"):
        metrics.observe_lifecycle(record)
    metrics.observe_lifecycle(lifecycle("live", to="running", pod="live-0"))
    assert value(metrics, "gpuwatch_metrics_tracked", kind="pod") == 1000
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="pod") == 0
    assert value(metrics, "gpuwatch_pod_state", namespace="ml", pod="live-0", team="vision",
                 node="n1", state="running") == 1  # fmt: skip


def test_gpu_and_label_set_caps() -> None:
    metrics = worker(max_gpu_series=2, max_label_sets=3)
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1"), gpu("GPU-2"), gpu("GPU-3")], {}))
    for topic in ("a", "b", "c", "d", "a"):
        metrics.count_event(topic)
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="gpu") == 1
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="label_set") == 1
    assert value(metrics, "gpuwatch_events_total", topic="a") == 2
    assert value(metrics, "gpuwatch_events_total", topic="d") is None
