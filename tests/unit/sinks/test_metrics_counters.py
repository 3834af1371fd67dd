"""Counters: replay-safe cost, waste and idle seconds, sums over workers, events and alerts."""

from __future__ import annotations

import zlib

import pytest
from support.metric_records import (
    T0,
    S,
    alert,
    attribution,
    lifecycle,
    series,
    value,
    window,
    worker,
)

from schemas.attribution import Attribution
from schemas.gpu_window import GpuWindow
from sinks.prometheus.metrics import WorkerMetrics

TEAM = {"namespace": "ml", "team": "vision"}
MINUTE = 60 * S


def test_a_replayed_attribution_window_adds_its_cost_once() -> None:
    metrics = worker()
    metrics.observe_attribution(attribution(start=T0, cost_usd=1.5, waste_usd=0.5))
    metrics.observe_attribution(attribution(start=T0, cost_usd=1.5, waste_usd=0.5))
    metrics.observe_attribution(attribution(start=T0 + MINUTE, cost_usd=2.0, waste_usd=0.0))
    metrics.observe_attribution(attribution(start=T0, cost_usd=1.5, waste_usd=0.5))
    assert value(metrics, "gpuwatch_cost_usd_total", **TEAM) == 3.5
    assert value(metrics, "gpuwatch_waste_usd_total", **TEAM) == 0.5


def test_windows_of_different_pods_and_teams_count_apart() -> None:
    metrics = worker()
    metrics.observe_attribution(attribution("u1", start=T0, cost_usd=1.0))
    metrics.observe_attribution(attribution("u2", start=T0, cost_usd=2.0))
    metrics.observe_attribution(
        attribution("u3", start=T0, cost_usd=4.0, labels={"team": "nlp"}, namespace="research")
    )
    assert value(metrics, "gpuwatch_cost_usd_total", **TEAM) == 3.0
    assert value(metrics, "gpuwatch_cost_usd_total", namespace="research", team="nlp") == 4.0


def test_idle_seconds_split_allocated_and_not_and_a_replayed_window_adds_once() -> None:
    metrics = worker()
    labels = {"node": "n1", "gpu": "GPU-1", "model": "H100"}
    metrics.observe_gpu_window(window(start=T0, idle_seconds=50.0, allocated_idle_seconds=20.0))
    metrics.observe_gpu_window(window(start=T0, idle_seconds=50.0, allocated_idle_seconds=20.0))
    metrics.observe_gpu_window(window(start=T0 + MINUTE, idle_seconds=10.0))
    idle = "gpuwatch_gpu_idle_seconds_total"
    assert value(metrics, idle, **labels, allocated="true") == 20.0 + 36.0
    assert value(metrics, idle, **labels, allocated="false") == 30.0 + 0.0


def records() -> list[Attribution | GpuWindow]:
    """Half an hour of windows of 40 pods in 2 namespaces and 10 GPUs, with duplicates."""
    out: list[Attribution | GpuWindow] = []
    for minute in range(30):
        start = T0 + minute * MINUTE
        for i in range(40):
            ns = "ml" if i % 2 else "research"
            out.append(attribution(f"pod-{i}", start, namespace=ns, cost_usd=0.01 * (i + 1)))
        out.extend(window(f"GPU-{g}", start, allocated_idle_seconds=g) for g in range(10))
    return out + out[: len(out) // 3]  # at-least-once: a third delivered again


def feed(metrics: WorkerMetrics, record: Attribution | GpuWindow) -> None:
    """Route a record to its observe method."""
    if isinstance(record, GpuWindow):
        metrics.observe_gpu_window(record)
    else:
        metrics.observe_attribution(record)


def totals(workers: list[WorkerMetrics], name: str) -> dict[str, float]:
    """Sum over workers of a counter by namespace (cost) or allocated (idle), as PromQL would."""
    out: dict[str, float] = {}
    for metrics in workers:
        for family in metrics.registry.collect():
            for sample in family.samples:
                if sample.name == name:
                    key = sample.labels.get("namespace") or sample.labels["allocated"]
                    out[key] = out.get(key, 0.0) + sample.value
    return out


def test_sums_over_workers_of_their_own_partitions_equal_one_worker_seeing_all() -> None:
    alone, parts = worker(), [worker(), worker(), worker()]
    for record in records():
        key = record.uuid if isinstance(record, GpuWindow) else record.uid
        feed(alone, record)
        feed(parts[zlib.crc32(key.encode()) % 3], record)
    for name in ("gpuwatch_cost_usd_total", "gpuwatch_gpu_idle_seconds_total"):
        expected = totals([alone], name)
        assert totals(parts, name) == pytest.approx(expected)
    # 30 windows x (0.02 + 0.04 + ... + 0.40) for ml (odd i); the duplicates added nothing.
    assert totals([alone], "gpuwatch_cost_usd_total")["ml"] == pytest.approx(30 * 4.2)


def test_pod_series_summed_over_workers_count_each_pod_once() -> None:
    parts = [worker(), worker()]
    for i in range(10):
        parts[i % 2].observe_lifecycle(lifecycle(f"u{i}", to="running", pod=f"p{i}"))
    assert sum(len(series(m, "gpuwatch_pod_state")) for m in parts) == 10


def test_alert_messages_count_once_per_fingerprint_and_event_time() -> None:
    metrics = worker()
    for message in (alert("f1"), alert("f1"), alert("f2"), alert("f1", "resolved", T0 + S)):
        metrics.observe_alert(message)
    labels = {"alertname": "GpuIdleAllocated", "severity": "warning"}
    assert value(metrics, "gpuwatch_alerts_total", **labels, status="firing") == 2
    assert value(metrics, "gpuwatch_alerts_total", **labels, status="resolved") == 1


def test_events_dead_letters_and_lag() -> None:
    metrics = worker()
    metrics.count_event("gpuwatch.nvml.samples")
    metrics.count_event("gpuwatch.nvml.samples", 41)
    metrics.count_deadletter("gpuwatch.k8s.pods", "schema")
    metrics.set_lag(-3.0)
    assert value(metrics, "gpuwatch_events_total", topic="gpuwatch.nvml.samples") == 42
    assert value(metrics, "gpuwatch_deadletter_total", topic="gpuwatch.k8s.pods", reason="schema")
    assert value(metrics, "gpuwatch_pipeline_lag_seconds") == 0.0  # clock skew, not negative lag
    metrics.set_lag(12.5)
    assert value(metrics, "gpuwatch_pipeline_lag_seconds") == 12.5


def test_no_lag_is_exported_before_the_worker_sets_one() -> None:
    assert value(worker(), "gpuwatch_pipeline_lag_seconds") is None


IDLE = "gpuwatch_gpu_idle_seconds_total"
GPU_1 = {"node": "n1", "gpu": "GPU-1", "model": "H100"}


def counted(metrics: WorkerMetrics) -> tuple[float | None, ...]:
    """Cost, waste and idle seconds (allocated, not) as exported."""
    return (
        value(metrics, "gpuwatch_cost_usd_total", **TEAM),
        value(metrics, "gpuwatch_waste_usd_total", **TEAM),
        value(metrics, IDLE, **GPU_1, allocated="true"),
        value(metrics, IDLE, **GPU_1, allocated="false"),
    )


def first_and_revised() -> tuple[list[Attribution | GpuWindow], list[Attribution | GpuWindow]]:
    """A pod's and a GPU's window as first emitted (revision 0) and revised (revision 1:
    data that came after it closed added cost, waste and idle seconds), with the window
    after it in between."""
    first: list[Attribution | GpuWindow] = [
        attribution(start=T0, cost_usd=1.0, waste_usd=0.25),
        window(start=T0, idle_seconds=30.0, allocated_idle_seconds=20.0),
    ]
    revised: list[Attribution | GpuWindow] = [
        attribution(start=T0, cost_usd=1.5, waste_usd=0.5, revision=1),
        window(start=T0, idle_seconds=45.0, allocated_idle_seconds=25.0, revision=1),
    ]
    return first, revised


def test_a_revision_moves_the_counters_by_its_difference_and_a_lower_one_by_nothing() -> None:
    first, revised = first_and_revised()
    later = [
        attribution(start=T0 + MINUTE, cost_usd=2.0, waste_usd=0.0),
        window(start=T0 + MINUTE, idle_seconds=0.0, allocated_idle_seconds=0.0),
    ]
    metrics, alone = worker(), worker()
    for record in [*first, *later, *revised, *first, *revised]:  # redeliveries of both
        feed(metrics, record)
    for record in [*revised, *later]:
        feed(alone, record)
    assert counted(metrics) == counted(alone) == (3.5, 0.5, 25.0, 20.0)


def test_a_revision_read_before_the_first_copy_counts_once() -> None:
    first, revised = first_and_revised()
    metrics = worker()
    for record in [*revised, *first]:
        feed(metrics, record)
    assert counted(metrics) == (1.5, 0.5, 25.0, 20.0)


def test_a_revision_that_lowers_a_figure_leaves_the_counter_as_it_was() -> None:
    """Counters never go down (a drop reads as a reset): the higher figure stays counted,
    and a later revision counts from there."""
    metrics = worker()
    feed(metrics, attribution(start=T0, cost_usd=1.0, waste_usd=0.5))
    feed(metrics, attribution(start=T0, cost_usd=1.25, waste_usd=0.25, revision=1))
    assert counted(metrics)[:2] == (1.25, 0.5)
    feed(metrics, attribution(start=T0, cost_usd=1.5, waste_usd=0.75, revision=2))
    assert counted(metrics)[:2] == (1.5, 0.75)


def test_a_revision_past_the_horizon_or_the_cap_adds_nothing() -> None:
    """What was counted is kept for the revision horizon (event time behind the newest
    window) and for at most `max_counted_windows` windows; a revision of a window
    forgotten is not counted, rather than the window counted twice."""
    metrics = worker(revision_horizon_s=120, max_counted_windows=100)
    for minute in range(4):  # T0 .. T0 + 3 min: T0 starts more than 2 min before the newest
        feed(metrics, attribution(start=T0 + minute * MINUTE, cost_usd=1.0))
    feed(metrics, attribution(start=T0, cost_usd=5.0, revision=1))
    feed(metrics, attribution(start=T0 + MINUTE, cost_usd=2.0, revision=1))
    assert value(metrics, "gpuwatch_cost_usd_total", **TEAM) == 5.0

    capped = worker(max_counted_windows=2)
    for uid in ("u1", "u2", "u3"):
        feed(capped, attribution(uid, start=T0, cost_usd=1.0))
    for uid in ("u1", "u2", "u3"):
        feed(capped, attribution(uid, start=T0, cost_usd=2.0, revision=1))
    assert value(capped, "gpuwatch_cost_usd_total", **TEAM) == 5.0  # u1 forgotten
