"""Per-GPU live series from node samples: utilization, allocation, unallocated access."""

from __future__ import annotations

from support.metric_records import T0, Clock, S, gpu, sample, series, value, window, worker


def labels(uuid: str, node: str = "n1") -> dict[str, str]:
    """The label set of a GPU of the fixtures."""
    return {"node": node, "gpu": uuid, "model": "H100"}


def test_utilization_and_allocation_of_each_gpu_of_the_sample() -> None:
    metrics = worker()
    readings = [gpu("GPU-1", 87.0, pods=("p1",)), gpu("GPU-2", 2.0), gpu("GPU-3", 0.0)]
    metrics.observe_sample(sample("n1", T0, readings, {"p1": ["GPU-1"], "p2": ["GPU-2"]}))
    util, held = "gpuwatch_gpu_utilization_ratio", "gpuwatch_gpu_allocated"
    assert value(metrics, util, **labels("GPU-1")) == 0.87
    assert value(metrics, util, **labels("GPU-2")) == 0.02
    assert [value(metrics, held, **labels(g)) for g in ("GPU-1", "GPU-2", "GPU-3")] == [1, 1, 0]


def test_unknown_utilization_is_not_exported_but_allocation_is() -> None:
    metrics = worker()
    metrics.observe_sample(sample("n1", T0, [gpu("MIG-1", None)], {"p1": ["MIG-1"]}))
    assert value(metrics, "gpuwatch_gpu_utilization_ratio", **labels("MIG-1")) is None
    assert value(metrics, "gpuwatch_gpu_allocated", **labels("MIG-1")) == 1


def test_unallocated_access_counts_processes_of_pods_that_do_not_hold_the_gpu() -> None:
    metrics = worker()
    readings = [
        # p1 holds it; p2's two processes do not; a process of no pod is the host's.
        gpu("GPU-1", pods=("p1", "p2", "p2", None)),
        gpu("GPU-2", pods=("p1",)),
    ]
    metrics.observe_sample(sample("n1", T0, readings, {"p1": ["GPU-1"], "p3": ["GPU-2"]}))
    access = "gpuwatch_gpu_unallocated_access"
    assert value(metrics, access, **labels("GPU-1")) == 2
    assert value(metrics, access, **labels("GPU-2")) == 1

    metrics.observe_sample(
        sample("n1", T0 + S, readings, {"p1": ["GPU-1", "GPU-2"], "p2": ["GPU-1"]})
    )
    assert value(metrics, access, **labels("GPU-1")) == 0
    assert value(metrics, access, **labels("GPU-2")) == 0


def test_a_mig_instance_of_a_parent_the_pod_holds_is_no_leak_and_the_parent_is_allocated() -> None:
    metrics = worker()
    readings = [
        gpu("GPU-P", None, sharing="mig"),
        gpu("MIG-A", None, pods=("p1",), parent_uuid="GPU-P", sharing="mig"),
        gpu("MIG-B", None, pods=("p2",), parent_uuid="GPU-P", sharing="mig"),
    ]
    metrics.observe_sample(sample("n1", T0, readings, {"p1": ["GPU-P"], "p3": ["MIG-B"]}))
    access = "gpuwatch_gpu_unallocated_access"
    assert value(metrics, access, **labels("MIG-A")) == 0
    assert value(metrics, access, **labels("MIG-B")) == 1
    assert value(metrics, "gpuwatch_gpu_allocated", **labels("MIG-A")) == 0
    assert value(metrics, "gpuwatch_gpu_allocated", **labels("MIG-B")) == 1
    # A parent whose instance is allocated is allocated.
    metrics.observe_sample(sample("n1", T0 + S, readings, {"p3": ["MIG-B"]}))
    assert value(metrics, "gpuwatch_gpu_allocated", **labels("GPU-P")) == 1


def test_an_older_sample_replayed_does_not_overwrite_the_live_reading() -> None:
    metrics = worker()
    metrics.observe_sample(sample("n1", T0 + 5 * S, [gpu("GPU-1", 90.0)], {}))
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1", 1.0)], {"p1": ["GPU-1"]}))
    assert value(metrics, "gpuwatch_gpu_utilization_ratio", **labels("GPU-1")) == 0.9
    assert value(metrics, "gpuwatch_gpu_allocated", **labels("GPU-1")) == 0


def test_gauges_of_a_gpu_without_samples_hide_and_its_counters_go_after_the_grace() -> None:
    clock = Clock(0.0)
    metrics = worker(clock, gpu_stale_s=30, finished_grace_s=300)
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1", 50.0)], {}))
    metrics.observe_gpu_window(window("GPU-1", T0))
    clock.now = 30.0
    assert value(metrics, "gpuwatch_gpu_utilization_ratio", **labels("GPU-1")) == 0.5
    clock.now = 30.5
    assert value(metrics, "gpuwatch_gpu_utilization_ratio", **labels("GPU-1")) is None
    assert value(metrics, "gpuwatch_gpu_allocated", **labels("GPU-1")) is None
    idle = "gpuwatch_gpu_idle_seconds_total"
    assert value(metrics, idle, **labels("GPU-1"), allocated="true") == 36.0
    clock.now = 300.0
    assert series(metrics, idle) == []


def test_forget_drops_the_gpus_of_revoked_node_partitions() -> None:
    metrics = worker()
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1"), gpu("GPU-2")], {}))
    metrics.forget(gpus=["GPU-1"])
    assert [s["gpu"] for s in series(metrics, "gpuwatch_gpu_allocated")] == ["GPU-2"]


def test_a_gpu_reported_by_another_node_is_relabelled() -> None:
    metrics = worker()
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1")], {}))
    metrics.observe_sample(sample("n2", T0 + S, [gpu("GPU-1")], {}))
    assert series(metrics, "gpuwatch_gpu_allocated") == [labels("GPU-1", node="n2")]
