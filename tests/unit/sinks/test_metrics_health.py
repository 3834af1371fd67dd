"""GPU health from node samples: throttle reasons, ECC, row remapping, PCIe replays, Xids;
and the stream's health alerts as firing series, one per pod holding the GPU."""

from __future__ import annotations

from typing import Any

import msgspec
from support.metric_records import T0, Clock, S, gpu, sample, series, value, worker

from gpuwatch.harness.examples import example
from schemas.nvml_sample import NvmlSample
from schemas.settings import RuleSettings
from sinks.prometheus.collector import MAX_XID_CODES, exposition
from sinks.prometheus.metrics import WorkerMetrics
from streams.core.node.gpu_alerts import NodeAlertState, on_sample

GPU1 = {"node": "n1", "gpu": "GPU-1", "model": "H100"}
HEALTH_FAMILIES = (
    "gpuwatch_gpu_throttled", "gpuwatch_gpu_ecc_uncorrectable_errors",
    "gpuwatch_gpu_row_remap_failed", "gpuwatch_gpu_row_remap_pending",
    "gpuwatch_gpu_pcie_replays_total", "gpuwatch_gpu_xid_errors_total",
)  # fmt: skip
UNKNOWN: dict[str, Any] = {
    "throttle_reasons": None, "remapped_rows": None, "retired_pages_pending": None,
    "pcie_replays": None, "ecc_dbe": None, "xid_errors": [],
}  # fmt: skip


def rows(correctable: int = 0, *, pending: bool = False, failed: bool = False) -> dict[str, Any]:
    return {"correctable": correctable, "uncorrectable": 0, "pending": pending, "failed": failed}


def health(pods: tuple[str, ...] = (), **readings: Any) -> dict[str, Any]:
    """GPU-1 of n1, busy, a process per pod of `pods`, the health readings given, the
    others unknown."""
    return gpu("GPU-1", 90.0, pods, **(UNKNOWN | readings))


def observe(metrics: WorkerMetrics, ts: int, *readings: dict[str, Any], node: str = "n1") -> None:
    metrics.observe_sample(sample(node, ts, list(readings), {}))


def health_series(metrics: WorkerMetrics) -> list[tuple[str, dict[str, str], float]]:
    """(family, labels, value) of every health series."""
    found = [
        (s.name, dict(s.labels), s.value)
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name in HEALTH_FAMILIES
    ]
    return sorted(found, key=lambda row: (row[0], sorted(row[1].items())))


def test_each_reading_is_a_series_of_the_gpu() -> None:
    metrics = worker()
    observe(
        metrics, T0,
        health(throttle_reasons=["sw_power_cap", "hw_thermal_slowdown"], ecc_dbe=2,
               remapped_rows=rows(3, pending=True), pcie_replays=17, xid_errors=[48]),
    )  # fmt: skip
    assert health_series(metrics) == [
        ("gpuwatch_gpu_ecc_uncorrectable_errors", GPU1, 2.0),
        ("gpuwatch_gpu_pcie_replays_total", GPU1, 17.0),
        ("gpuwatch_gpu_row_remap_failed", GPU1, 0.0),
        ("gpuwatch_gpu_row_remap_pending", GPU1, 1.0),
        ("gpuwatch_gpu_throttled", GPU1 | {"reason": "hw_thermal_slowdown"}, 1.0),
        ("gpuwatch_gpu_throttled", GPU1 | {"reason": "sw_power_cap"}, 1.0),
        ("gpuwatch_gpu_xid_errors_total", GPU1 | {"xid": "48"}, 1.0),
    ]
    text = exposition(metrics.registry).decode()
    gpu_text = 'node="n1",gpu="GPU-1",model="H100"'
    assert f'gpuwatch_gpu_throttled{{{gpu_text},reason="sw_power_cap"}} 1.0\n' in text
    assert f'gpuwatch_gpu_xid_errors_total{{{gpu_text},xid="48"}} 1.0\n' in text


def test_only_active_known_reasons_have_a_throttled_series_each_once() -> None:
    metrics = worker()
    reasons = ["sync_boost", "gpu_idle", "sync_boost", "hw_slowdown"]  # gpu_idle: not ours
    observe(metrics, T0, health(throttle_reasons=reasons))
    found = [s["reason"] for s in series(metrics, "gpuwatch_gpu_throttled")]
    assert found == ["hw_slowdown", "sync_boost"]  # THROTTLE_REASONS order
    observe(metrics, T0 + S, health(throttle_reasons=[]))  # known, none active
    assert series(metrics, "gpuwatch_gpu_throttled") == []


def test_unknown_readings_have_no_series_not_a_zero() -> None:
    metrics = worker()
    observe(metrics, T0, health(), gpu("GPU-2", 50.0, **UNKNOWN))
    assert health_series(metrics) == []
    observe(metrics, T0 + S, health(ecc_dbe=0, remapped_rows=rows(), pcie_replays=0))
    assert [name for name, _, _ in health_series(metrics)] == [
        "gpuwatch_gpu_ecc_uncorrectable_errors", "gpuwatch_gpu_pcie_replays_total",
        "gpuwatch_gpu_row_remap_failed", "gpuwatch_gpu_row_remap_pending",
    ]  # fmt: skip
    assert {v for _, _, v in health_series(metrics)} == {0.0}
    observe(metrics, T0 + 2 * S, health())  # the driver stops answering: unknown again
    assert health_series(metrics) == []


def test_xid_errors_count_once_per_sample_and_a_replay_never_again() -> None:
    metrics = worker()
    first = sample("n1", T0, [health(xid_errors=[79, 13, 79])], {})
    metrics.observe_sample(first)
    metrics.observe_sample(first)  # redelivered
    xid = "gpuwatch_gpu_xid_errors_total"
    assert value(metrics, xid, **GPU1, xid="79") == 2.0  # two errors in one interval
    assert value(metrics, xid, **GPU1, xid="13") == 1.0
    observe(metrics, T0 + 2 * S, health(xid_errors=[13]))
    observe(metrics, T0 + S, health(xid_errors=[13, 31]))  # older than the last: replayed
    observe(metrics, T0 + 3 * S, health())  # no Xid in this interval: the counts stay
    assert value(metrics, xid, **GPU1, xid="13") == 2.0
    assert value(metrics, xid, **GPU1, xid="31") is None


def test_xid_codes_per_gpu_are_capped_and_the_refused_counted() -> None:
    metrics = worker()
    observe(metrics, T0, health(xid_errors=list(range(1, MAX_XID_CODES + 3))))
    observe(metrics, T0 + S, health(xid_errors=[1, 999]))
    assert len(series(metrics, "gpuwatch_gpu_xid_errors_total")) == MAX_XID_CODES
    assert value(metrics, "gpuwatch_gpu_xid_errors_total", **GPU1, xid="1") == 2.0
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="label_set") == 3


def test_gauges_hide_with_the_gpu_and_counters_stay_until_it_is_forgotten() -> None:
    clock = Clock()
    metrics = worker(clock, finished_grace_s=300.0)
    readings = health(throttle_reasons=["hw_slowdown"], ecc_dbe=1,
                      remapped_rows=rows(failed=True), pcie_replays=5, xid_errors=[79])  # fmt: skip
    observe(metrics, T0, readings)
    clock.now = 31.0  # the node's samples stop: its GPU gauges are stale
    assert [name for name, _, _ in health_series(metrics)] == [
        "gpuwatch_gpu_pcie_replays_total", "gpuwatch_gpu_xid_errors_total",
    ]  # fmt: skip
    metrics.forget(nodes=[("default", "n1")])
    assert health_series(metrics) == []


def test_a_named_clusters_health_series_carry_it_and_go_with_its_node() -> None:
    metrics = worker()
    for cluster in ("east", "west"):
        raw = msgspec.to_builtins(sample("n1", T0, [health(ecc_dbe=1, xid_errors=[79])], {}))
        metrics.observe_sample(msgspec.convert(raw | {"cluster": cluster}, NvmlSample))
    metrics.observe_sample(sample("n2", T0, [gpu("GPU-2", 1.0, ecc_dbe=4)], {}))
    ecc = series(metrics, "gpuwatch_gpu_ecc_uncorrectable_errors")
    assert [s.get("cluster") for s in ecc] == ["west", None]  # GPU-1 moved; the default: none
    metrics.forget(nodes=[("west", "n1")])
    assert series(metrics, "gpuwatch_gpu_xid_errors_total") == []
    assert [s["gpu"] for s in series(metrics, "gpuwatch_gpu_ecc_uncorrectable_errors")] == ["GPU-2"]


# The stream's health alerts (streams/core/node/gpu_health.py) into firing series.


def node_sample(ts: int, readings: list[dict[str, Any]], held: dict[str, Any]) -> NvmlSample:
    """Node n1 at `ts`; `held`: pod uid -> (namespace, pod, device ids)."""
    raw = example("gpuwatch.nvml.sample/v1") | {"node": "n1", "ts": ts, "interval_ms": S}
    raw["gpus"] = readings
    alloc = raw["allocations"][0]
    raw["allocations"] = [
        alloc | {"pod_uid": uid, "namespace": ns, "pod": pod, "device_ids": devices}
        for uid, (ns, pod, devices) in held.items()
    ]
    return msgspec.convert(raw, NvmlSample)


def run(metrics: WorkerMetrics, samples: list[NvmlSample]) -> NodeAlertState | None:
    state: NodeAlertState | None = None
    rules = RuleSettings()
    for item in samples:
        state, out, _ = on_sample(state, item, rules)
        for message in out:
            metrics.observe_alert(message)
    return state


def firing(metrics: WorkerMetrics) -> list[dict[str, str]]:
    found = [{k: v for k, v in s.items() if v} for s in series(metrics, "gpuwatch_alert_firing")]
    return sorted(found, key=lambda labels: sorted(labels.items()))


def test_an_xid_on_a_gpu_of_a_two_gpu_job_names_its_pod_and_code_with_the_codes_severity() -> None:
    metrics = worker()
    held = {"u1": ("ml", "train-0", ["GPU-1", "GPU-2"])}
    readings = [health(xid_errors=[79, 13]), gpu("GPU-2", 90.0)]
    run(metrics, [node_sample(T0, readings, held)])
    base = {"alertname": "GpuXidError", "namespace": "ml", "pod": "train-0", "pod_uid": "u1"}
    assert firing(metrics) == [
        base | GPU1 | {"severity": "critical", "xid": "79"},
        base | GPU1 | {"severity": "warning", "xid": "13"},
    ]


def test_a_shared_gpus_faults_have_a_series_per_pod_with_its_uid() -> None:
    metrics = worker()
    held = {"ua": ("dev", "nb-a", ["GPU-1"]), "ub": ("dev", "nb-b", ["GPU-1"])}
    shared: dict[str, Any] = {"pods": ("ua", "ub"), "sharing": "time-slicing"}  # both busy
    slow = health(throttle_reasons=["hw_thermal_slowdown", "sw_power_cap"], ecc_dbe=1,
                  remapped_rows=rows(failed=True), **shared)  # fmt: skip
    samples = [node_sample(T0 + t * S, [slow], held) for t in range(61)]
    state = run(metrics, samples)
    pods = [{"namespace": "dev", "pod": "nb-a", "pod_uid": "ua"},
            {"namespace": "dev", "pod": "nb-b", "pod_uid": "ub"}]  # fmt: skip
    assert firing(metrics) == sorted(
        (
            GPU1 | pod | {"alertname": name, "severity": severity} | extra
            for name, severity, extra in (
                ("GpuEccUncorrectable", "critical", {}),
                ("GpuRowRemapFailure", "critical", {}),
                ("GpuThrottled", "warning", {"reasons": "hw_thermal_slowdown"}),
            )
            for pod in pods
        ),
        key=lambda labels: sorted(labels.items()),
    )
    # Reset: the count reads 0, the remap no longer failed, the slowdown ended.
    healthy = health(throttle_reasons=[], ecc_dbe=0, remapped_rows=rows(), **shared)
    rules = RuleSettings()
    _, out, _ = on_sample(state, node_sample(T0 + 61 * S, [healthy], held), rules)
    assert sorted(m.name for m in out if m.status == "resolved") == [
        "GpuEccUncorrectable", "GpuRowRemapFailure", "GpuThrottled",
    ]  # fmt: skip
    for message in out:
        metrics.observe_alert(message)
    assert firing(metrics) == []
