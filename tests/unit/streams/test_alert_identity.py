"""Alert identity: the fingerprint of every alert kind, pinned to the values it has always had.

Downstream deduplication relies on these values: Alertmanager-style routing, the Redis
`alerts:firing` hash and `alerts:last` set, and every consumer of the `alerts` topic key
an alert by its fingerprint, so a firing alert whose fingerprint changed across a release
would stay firing for ever beside its successor. The expected values below are literals on
purpose: they were computed once and must never be recomputed to make this test pass.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from test_gpu_alerts_fixtures import (
    GPU_A,
    GPU_B,
    POD_P,
    POD_R,
    RULES,
    T0,
    S,
    alloc,
    gpu,
    proc,
    run,
    sample,
)
from test_pod_fixtures import WINDOWS, pod

from gpuwatch.harness.examples import example
from schemas.alert import Alert
from schemas.k8s_workload import K8sWorkload
from schemas.nvml_sample import NvmlSample
from schemas.settings import RuleSettings
from streams.core.alert_identity import fingerprint, in_cluster, with_cluster
from streams.core.node.gpu_alerts import on_watermark
from streams.core.pod.pod_step import step_pod_event, step_watermark
from streams.core.workload import workload_step

EAST = "east"
POD_1 = "4f1c2a9e-0000-4000-8000-000000000001"
POD_2 = "4f1c2a9e-0000-4000-8000-000000000002"
GPU = "GPU-8f3c0000-1111-2222-3333-444455556666"


def _east(item: NvmlSample) -> NvmlSample:
    return msgspec.structs.replace(item, cluster=EAST)


def _idle_and_leak(cluster: str) -> list[Alert]:
    """GPU A held by P and idle for a minute; pod R runs on GPU B, which P holds too."""

    def one(ts: int) -> NvmlSample:
        a = gpu(GPU_A, 0.0)
        b = gpu(GPU_B, 80.0, proc(7, POD_P), proc(8, POD_R))
        item = sample(ts, [a, b], [alloc(POD_P, GPU_A, GPU_B)])
        return item if cluster == "default" else _east(item)

    _, out, _ = run(None, [one(T0 + i * S) for i in range(60)])
    return out


def _telemetry(cluster: str) -> list[Alert]:
    item = sample(T0, [gpu(GPU_A, 50.0)])
    state, _, _ = run(None, [item if cluster == "default" else _east(item)])
    _, out = on_watermark(state, T0 + 60 * S, RULES)
    return out


def _xid(cluster: str) -> list[Alert]:
    items = [
        sample(T0 + i * S, [gpu(GPU_A, 90.0, xid_errors=xids)])
        for i, xids in enumerate([(), (79,)])
    ]
    return run(None, [i if cluster == "default" else _east(i) for i in items])[1]


def _pod_queued() -> list[Alert]:
    state, _ = step_pod_event(None, pod("Pending", ts=T0, rv=1, created_at=T0), RULES, WINDOWS)
    _, out = step_watermark(state, T0 + 650 * S, RULES, WINDOWS)
    return list(out.alerts)


def _workload_queued() -> list[Alert]:
    data: dict[str, Any] = example("gpuwatch.k8s.workload/v1")
    waiting = {"type": "QuotaReserved", "status": "False", "reason": "Pending", "at": T0}
    data.update(
        ts=T0 + S, resource_version="1", created_at=T0, conditions=[waiting | {"message": ""}]
    )
    rules = RuleSettings(queued_alert_after_s=600)
    state, out = workload_step.apply(None, msgspec.convert(data, K8sWorkload), rules)
    _, fired = workload_step.step_to(state, T0 + 700 * S, rules)
    return [*out.alerts, *fired]


def test_the_alerts_of_every_rule_keep_their_fingerprints() -> None:
    alerts = [
        *_idle_and_leak("default"),
        *_idle_and_leak(EAST),
        *_telemetry("default"),
        *_telemetry(EAST),
        *_xid("default"),
        *_xid(EAST),
        *_pod_queued(),
        *_workload_queued(),
    ]
    got = sorted((a.name, a.cluster, a.fingerprint) for a in alerts)
    # The contract downstream deduplication relies on: never change these values.
    assert got == [
        ("GpuIdleAllocated", "default", "ef0fe8c3d18721ea"),
        ("GpuIdleAllocated", "east", "a40c740228c517a5"),
        ("GpuUnallocatedAccess", "default", "d50a75b4f7958bd2"),
        ("GpuUnallocatedAccess", "east", "b70aaeec6db4baba"),
        ("GpuXidError", "default", "7105d0494fc3c43c"),
        ("GpuXidError", "east", "32f66f32c4fe96e4"),
        ("NodeTelemetryMissing", "default", "aa34987344b02a50"),
        ("NodeTelemetryMissing", "east", "1425cd0755f15865"),
        ("PodQueuedTooLong", "default", "5979ab4a7b80e56a"),
        ("WorkloadQueuedTooLong", "default", "b65432bb69a2c6f8"),
    ]


@pytest.mark.parametrize(
    ("name", "kind", "id_", "cluster", "expected"),
    [
        # The contract downstream deduplication relies on: never change these values.
        (
            "PodStalled",
            "pod",
            POD_1,
            "default",
            "62dd10349cbc08ae",
        ),
        (
            "PodQueuedTooLong",
            "pod",
            POD_1,
            "east",
            "c71c21b8fb76ea39",
        ),
        (
            "GpuIdleAllocated",
            "gpu",
            GPU,
            "default",
            "3e38f77030a2d153",
        ),
        (
            "GpuUnallocatedAccess",
            "gpu",
            f"{GPU}/{POD_1}",
            "default",
            "d162cd66bbd55234",
        ),
        ("NodeTelemetryMissing", "node", "gpu-node-1", "default", "069adccc13e2b0be"),
        ("NodeTelemetryMissing", "node", "gpu-node-1", "east", "25e978b610f34c22"),
        (
            "GpuXidError",
            "gpu",
            f"{GPU}/79",
            "default",
            "3ca8944ae468d810",
        ),
        (
            "PodBlockedByFragmentation",
            "pod",
            POD_2,
            "default",
            "c43bc10b9221184a",
        ),
        ("WorkloadQueuedTooLong", "workload", "wl-0001", "west", "d59625a81b41f029"),
    ],
)
def test_fingerprints_of_fixed_subjects(
    name: str, kind: str, id_: str, cluster: str, expected: str
) -> None:
    assert fingerprint(name, kind, id_, cluster) == expected


def test_a_named_cluster_is_in_the_labels_and_the_summary_the_default_one_nowhere() -> None:
    assert with_cluster({"node": "n1"}, "default") == {"node": "n1"}
    assert with_cluster({"node": "n1"}, EAST) == {"node": "n1", "cluster": EAST}
    assert in_cluster("n1 idle", "default") == "n1 idle"
    assert in_cluster("n1 idle", EAST) == "[cluster east] n1 idle"
