"""Capacity series: free GPUs per node, stranded, reclaimable and blocked per model, from the
latest capacity record of each (cluster, model, resource)."""

from __future__ import annotations

from support.metric_records import T0, S, capacity, series, value, worker

from sinks.prometheus.metrics import WorkerMetrics

H100 = {"model": "H100", "resource": "nvidia.com/gpu"}
MIG = {"model": "H100", "resource": "nvidia.com/mig-1g.10gb"}


def free(metrics: WorkerMetrics) -> dict[tuple[str, ...], float | None]:
    """(node, model, resource, cluster) -> free devices, for every gpuwatch_free_gpus series."""
    out: dict[tuple[str, ...], float | None] = {}
    for labels in series(metrics, "gpuwatch_free_gpus"):
        key = (labels["node"], labels["model"], labels["resource"], labels.get("cluster", ""))
        out[key] = value(metrics, "gpuwatch_free_gpus", **labels)
    return out


def test_a_record_shows_free_gpus_per_node_and_its_models_counts() -> None:
    metrics = worker()
    metrics.observe_capacity(capacity(free={"n1": 2, "n2": 1}, stranded=3, reclaimable=1))
    assert free(metrics) == {
        ("n1", "H100", "nvidia.com/gpu", ""): 2.0,
        ("n2", "H100", "nvidia.com/gpu", ""): 1.0,
    }
    assert value(metrics, "gpuwatch_stranded_gpus", **H100) == 3.0
    assert value(metrics, "gpuwatch_reclaimable_gpus", **H100) == 1.0
    assert value(metrics, "gpuwatch_blocked_pods", **H100) == 1.0  # the example's
    assert value(metrics, "gpuwatch_metrics_tracked", kind="capacity") == 1


def test_each_resource_and_named_cluster_is_a_picture_of_its_own() -> None:
    metrics = worker()
    metrics.observe_capacity(capacity(free={"n1": 2}, stranded=2))
    metrics.observe_capacity(capacity(free={"n1": 7}, resource=MIG["resource"], stranded=0))
    metrics.observe_capacity(capacity(free={"n1": 4}, cluster="east", stranded=4))
    assert free(metrics) == {
        ("n1", "H100", "nvidia.com/gpu", ""): 2.0,
        ("n1", "H100", "nvidia.com/mig-1g.10gb", ""): 7.0,
        ("n1", "H100", "nvidia.com/gpu", "east"): 4.0,
    }
    assert value(metrics, "gpuwatch_stranded_gpus", **H100) == 2.0
    assert value(metrics, "gpuwatch_stranded_gpus", **MIG) == 0.0
    assert value(metrics, "gpuwatch_stranded_gpus", **H100, cluster="east") == 4.0


def test_a_later_record_replaces_the_picture_and_a_node_with_nothing_free_leaves() -> None:
    metrics = worker()
    metrics.observe_capacity(capacity(T0, free={"n1": 2, "n2": 2}, stranded=4))
    metrics.observe_capacity(capacity(T0 + S, free={"n2": 1}, stranded=0, blocked=0))
    assert free(metrics) == {("n2", "H100", "nvidia.com/gpu", ""): 1.0}
    assert value(metrics, "gpuwatch_stranded_gpus", **H100) == 0.0
    assert value(metrics, "gpuwatch_blocked_pods", **H100) == 0.0


def test_an_older_or_repeated_record_changes_nothing() -> None:
    """The topic is read again from its start when a partition comes back: its records
    arrive after the newer picture they were replaced by."""
    metrics = worker()
    newest = capacity(T0 + 2 * S, free={"n3": 5}, stranded=0)
    metrics.observe_capacity(newest)
    metrics.observe_capacity(capacity(T0, free={"n1": 2}, stranded=2))
    metrics.observe_capacity(capacity(T0 + 2 * S, free={"n1": 9}, stranded=9))  # same ts
    metrics.observe_capacity(newest)
    assert free(metrics) == {("n3", "H100", "nvidia.com/gpu", ""): 5.0}
    assert value(metrics, "gpuwatch_stranded_gpus", **H100) == 0.0


def test_a_model_whose_nodes_went_away_reads_zero_with_no_node_series() -> None:
    metrics = worker()
    metrics.observe_capacity(capacity(T0, free={"n1": 2}))
    gone = {"stranded": 0, "reclaimable": 0, "reclaimable_gpus": [], "queued": 0, "blocked": 0}
    metrics.observe_capacity(capacity(T0 + S, free={}, **gone))
    assert free(metrics) == {}
    for name in ("gpuwatch_stranded_gpus", "gpuwatch_reclaimable_gpus", "gpuwatch_blocked_pods"):
        assert value(metrics, name, **H100) == 0.0, name


def test_a_revoked_partitions_keys_are_forgotten_and_shown_again_when_read_again() -> None:
    metrics = worker()
    record = capacity(free={"n1": 2}, cluster="east")
    metrics.observe_capacity(record)
    metrics.observe_capacity(capacity(free={"n9": 1}))
    metrics.forget(capacity=[record.key()])
    assert free(metrics) == {("n9", "H100", "nvidia.com/gpu", ""): 1.0}
    assert value(metrics, "gpuwatch_stranded_gpus", **H100, cluster="east") is None
    metrics.observe_capacity(record)  # the partition came back: its history is read again
    assert free(metrics)[("n1", "H100", "nvidia.com/gpu", "east")] == 2.0


def test_the_key_cap_refuses_new_keys_and_counts_them_but_updates_held_ones() -> None:
    metrics = worker(max_capacity_keys=1)
    metrics.observe_capacity(capacity(T0, free={"n1": 2}))
    metrics.observe_capacity(capacity(T0, free={"n1": 2}, cluster="east"))
    metrics.observe_capacity(capacity(T0 + S, free={"n1": 1}))
    assert free(metrics) == {("n1", "H100", "nvidia.com/gpu", ""): 1.0}
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="capacity") == 1
    assert value(metrics, "gpuwatch_metrics_tracked", kind="capacity") == 1
