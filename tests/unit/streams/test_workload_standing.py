"""Where a Kueue workload stands, from one `k8s.workloads` value, in Kueue v0.17's words."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpuwatch.harness.examples import example
from schemas import K8sWorkload
from streams.core.workload.workloads import WorkloadStanding, standing

T = 1_764_412_800_000


def value(*conditions: dict[str, Any], **fields: Any) -> K8sWorkload:
    data = example("gpuwatch.k8s.workload/v1")
    data.update(conditions=list(conditions), **fields)
    return msgspec.convert(data, K8sWorkload)


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "at": T}


PREFIX = "couldn't assign flavors to pod set main: "


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (PREFIX + "insufficient unused quota for nvidia.com/gpu in flavor h100, 4 more needed",
         "WaitingForQuota"),
        (PREFIX + "insufficient quota for nvidia.com/gpu in flavor h100, previously considered "
         "podsets requests (0) + current podset request (64) > maximum capacity (32)",
         "ExceedsMaxQuota"),
        (PREFIX + "flavor h100 doesn't match node affinity", "NoMatchingFlavor"),
        (PREFIX + "untolerated taint {nvidia.com/gpu NoSchedule} in flavor h100",
         "NoMatchingFlavor"),
        ("ClusterQueue research is inactive", "Inadmissible"),
        ("Workload namespace doesn't match ClusterQueue selector", "Inadmissible"),
        ("something Kueue will say one day", "Pending"),
    ],
)  # fmt: skip
def test_a_pending_workload_waits_for_the_reason_its_message_gives(
    message: str, reason: str
) -> None:
    waiting = value(condition("QuotaReserved", "False", "Pending", message))
    assert standing(waiting) == WorkloadStanding("queued", reason, message)


def test_the_conditions_in_the_order_kueue_moves_them() -> None:
    assert standing(value()) == ("queued", "Pending", None)
    inadmissible = value(
        condition("QuotaReserved", "False", "Inadmissible", "LocalQueue x doesn't exist")
    )
    assert standing(inadmissible).reason == "Inadmissible"
    reserved = value(
        condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue a")
    )
    assert standing(reserved)[:2] == ("queued", "AdmissionChecks")
    admitted = value(
        condition("QuotaReserved", "True", "QuotaReserved"),
        condition("Admitted", "True", "Admitted"),
    )
    assert standing(admitted) == ("admitted", None, None)
    evicted = value(
        condition("QuotaReserved", "False", "Pending", "insufficient unused quota ..."),
        condition("Admitted", "False", "NoReservation"),
        condition("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority"),
    )
    assert standing(evicted)[:2] == ("queued", "Preempted")
    done = value(
        condition("Admitted", "True", "Admitted"),
        condition("Finished", "True", "Failed", "Job failed"),
    )
    assert standing(done) == ("finished", "Failed", "Job failed")
    assert standing(value(active=False))[:2] == ("queued", "Deactivated")
    assert standing(value(type="DELETED"))[:2] == ("finished", "Deleted")
