"""Many clusters into one exporter: a `cluster` label keeps their pods, GPUs and alerts apart."""

from __future__ import annotations

from typing import Any

import msgspec
from support.metric_records import (
    T0,
    S,
    attribution,
    gpu,
    lifecycle,
    sample,
    series,
    usage,
    value,
    window,
    worker,
)

from gpuwatch.harness.examples import example
from schemas.alert import Alert
from schemas.nvml_sample import NvmlSample
from sinks.prometheus.collector import FAMILIES
from sinks.prometheus.metrics import WorkerMetrics

CLUSTERS = ("east", "west")
POD = {"namespace": "ml", "pod": "train-0", "team": "vision", "node": "n1"}  # in both
GPU = {"node": "n1", "model": "H100"}  # GPU index 0 of node n1, in both
PIPELINE = {  # the worker's own families: no cluster
    "gpuwatch_pipeline_lag_seconds", "gpuwatch_events", "gpuwatch_deadletter",
    "gpuwatch_late_events", "gpuwatch_duplicate_events", "gpuwatch_samples_missing",
    "gpuwatch_metrics_series_dropped", "gpuwatch_metrics_tracked",
    "gpuwatch_work_units_dropped",
    "gpuwatch_revisions",
    "gpuwatch_late_applied_events",
    "gpuwatch_delivery_failures",
    "gpuwatch_alignment_paused_partitions",
    "gpuwatch_alignment_pauses",
    "gpuwatch_alignment_released",
}  # fmt: skip


def in_cluster(cluster: str, s: NvmlSample) -> NvmlSample:
    return msgspec.structs.replace(s, cluster=cluster)


def node_alert(cluster: str | None, node: str = "n1") -> Alert:
    """NodeTelemetryMissing of `node` in `cluster` (None: a message naming no cluster)."""
    raw: dict[str, Any] = example("gpuwatch.alert/v1") | {
        "name": "NodeTelemetryMissing", "fingerprint": f"nt-{cluster}-{node}",
        "severity": "critical", "labels": {"node": node},
        "subject": {"kind": "node", "uid": None, "uuid": None, "node": node},
    }  # fmt: skip
    if cluster is not None:
        raw |= {"cluster": cluster}
        raw["labels"] = raw["labels"] | {"cluster": cluster}
    return msgspec.convert(raw, Alert)


def fed_two_clusters() -> WorkerMetrics:
    """The same pod name, node name and GPU index in two clusters (uids and uuids differ)."""
    metrics = worker()
    for c in CLUSTERS:
        uid, uuid = f"uid-{c}", f"GPU-{c}-0"
        metrics.observe_lifecycle(lifecycle(uid, to="running", ts=T0, cluster=c))
        metrics.observe_usage(usage(uid, ts=T0 + S))
        metrics.observe_attribution(attribution(uid, start=T0, cluster=c, cost_usd=2.0))
        metrics.observe_gpu_window(window(uuid, T0, cluster=c))
        reading = gpu(uuid, 80.0 if c == "east" else 10.0, pods=(uid,), index=0)
        metrics.observe_sample(in_cluster(c, sample("n1", T0, [reading], {uid: [uuid]})))
        metrics.observe_alert(node_alert(c))
    return metrics


def test_every_pod_gpu_and_alert_family_has_a_cluster_label_and_pipeline_ones_none() -> None:
    labelled = {name for name, (_, _, labels) in FAMILIES.items() if "cluster" in labels}
    assert labelled == set(FAMILIES) - PIPELINE


def test_the_same_pod_node_and_gpu_index_in_two_clusters_are_two_series_each() -> None:
    metrics = fed_two_clusters()
    for c in CLUSTERS:
        assert value(metrics, "gpuwatch_pod_state", **POD, cluster=c, state="running") == 1.0
        gpu_labels = GPU | {"gpu": f"GPU-{c}-0", "cluster": c}
        util = 0.8 if c == "east" else 0.1
        assert value(metrics, "gpuwatch_gpu_utilization_ratio", **gpu_labels) == util
        assert value(metrics, "gpuwatch_gpu_allocated", **gpu_labels) == 1.0
        idle = "gpuwatch_gpu_idle_seconds_total"
        assert value(metrics, idle, **gpu_labels, allocated="true") == 36.0
        cost = {"namespace": "ml", "team": "vision", "cluster": c}
        assert value(metrics, "gpuwatch_cost_usd_total", **cost) == 2.0
    for name in ("gpuwatch_pod_state", "gpuwatch_pod_gpu_share_ratio",
                 "gpuwatch_pod_gpu_memory_bytes", "gpuwatch_gpu_utilization_ratio",
                 "gpuwatch_alert_firing"):  # fmt: skip
        assert sorted(s["cluster"] for s in series(metrics, name)) == ["east", "west"], name
    assert value(metrics, "gpuwatch_pod_state", **POD, cluster="default", state="running") is None


def test_two_clusters_node_alerts_of_one_node_name_fire_apart() -> None:
    metrics = fed_two_clusters()
    firing = series(metrics, "gpuwatch_alert_firing")
    assert sorted((s["alertname"], s["node"], s["cluster"]) for s in firing) == [
        ("NodeTelemetryMissing", "n1", "east"),
        ("NodeTelemetryMissing", "n1", "west"),
    ]


def test_alert_messages_are_counted_per_cluster() -> None:
    metrics = fed_two_clusters()
    metrics.observe_alert(node_alert(None))
    counted = sorted(
        (s.get("cluster", ""), s["alertname"], s["status"])
        for s in series(metrics, "gpuwatch_alerts_total")
    )
    assert counted == [
        ("", "NodeTelemetryMissing", "firing"),
        ("east", "NodeTelemetryMissing", "firing"),
        ("west", "NodeTelemetryMissing", "firing"),
    ]


def test_records_naming_no_cluster_have_no_cluster_label() -> None:
    # As their messages leave the field out: a single-cluster set-up's series are what
    # they were, and for Prometheus an absent label matches cluster=~".*" and "" alike.
    metrics = worker()
    metrics.observe_lifecycle(lifecycle("u1", to="queued", ts=T0))
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1", 50.0)], {}))
    metrics.observe_attribution(attribution("u1", start=T0, cost_usd=1.0))
    metrics.observe_alert(node_alert(None))
    for name in ("gpuwatch_pod_state", "gpuwatch_gpu_utilization_ratio",
                 "gpuwatch_cost_usd_total", "gpuwatch_alert_firing",
                 "gpuwatch_alerts_total"):  # fmt: skip
        found = series(metrics, name)
        assert len(found) == 1, name
        assert "cluster" not in found[0], name


def test_forgetting_a_node_of_one_cluster_keeps_the_same_name_in_the_other() -> None:
    metrics = fed_two_clusters()
    metrics.forget(nodes=[("east", "n1")])
    for name in ("gpuwatch_gpu_utilization_ratio", "gpuwatch_alert_firing"):
        assert [s["cluster"] for s in series(metrics, name)] == ["west"], name
    assert len(series(metrics, "gpuwatch_pod_state")) == 2  # pods go with their own partitions
    metrics.forget(nodes=["n1"])  # a bare name: the node of every cluster
    assert series(metrics, "gpuwatch_gpu_utilization_ratio") == []
    assert series(metrics, "gpuwatch_alert_firing") == []


def test_a_gpu_reported_from_another_cluster_is_relabelled() -> None:
    metrics = worker()
    reading = gpu("GPU-1", 50.0)
    metrics.observe_sample(in_cluster("east", sample("n1", T0, [reading], {})))
    metrics.observe_sample(in_cluster("west", sample("n1", T0 + S, [reading], {})))
    assert [s["cluster"] for s in series(metrics, "gpuwatch_gpu_utilization_ratio")] == ["west"]
