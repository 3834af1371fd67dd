"""Where a Kueue Workload stands, from one `k8s.workloads` value: queued (and why), admitted,
finished.

Kueue says why a workload waits in its `QuotaReserved` condition: False with reason
`Pending` and its scheduler's message, in the words of Kueue v0.17's flavor assigner
(`pkg/scheduler/flavorassigner`). The reasons here name those messages the way the
issue trackers and `kueue_unadmitted_workloads` do:

| reason | when |
|---|---|
| `WaitingForQuota` | "insufficient unused quota ... N more needed": others use the quota now |
| `ExceedsMaxQuota` | "insufficient quota ... > maximum capacity": it never fits the queue |
| `NoMatchingFlavor` | "doesn't match node affinity", "untolerated taint": no flavor fits |
| `Inadmissible` | reason Inadmissible, or its queue is inactive, missing, or not its namespace's |
| `AdmissionChecks` | quota reserved, admission checks not all Ready yet |
| `Deactivated` | `spec.active` false |
| the Evicted reason | evicted and waiting again (`Preempted`, `PodsReadyTimeout`...) |
| `Pending` | not tried yet, or a message of another kind |

A DELETED finishes it, `Deleted` (Kueue's Finished reason when it had one), whether the
watcher saw the deletion or found the workload gone from a relist (`final_state_unknown`:
the value is the last state it knew).

A pure function of the value: the same wherever and whenever it is read.
"""

from __future__ import annotations

from typing import NamedTuple

from schemas.k8s_workload import K8sWorkload, WorkloadCondition
from schemas.workload_lifecycle import WorkloadState

__all__ = ["WorkloadStanding", "standing"]


class WorkloadStanding(NamedTuple):
    """A workload's state, why (queued: what holds it; finished: how it ended), and the
    scheduler's message where it gave one."""

    state: WorkloadState
    reason: str | None
    message: str | None


def _condition(value: K8sWorkload, kind: str) -> WorkloadCondition | None:
    return next((c for c in value.conditions if c.type == kind), None)


def _why_pending(condition: WorkloadCondition) -> str:
    if condition.reason == "Inadmissible":
        return "Inadmissible"
    message = condition.message or ""
    if "insufficient unused quota" in message:
        return "WaitingForQuota"
    if "insufficient quota" in message and "maximum capacity" in message:
        return "ExceedsMaxQuota"
    if "node affinity" in message or "untolerated taint" in message:
        return "NoMatchingFlavor"
    inadmissible = ("is inactive", "doesn't exist", "ClusterQueue selector")
    if any(words in message for words in inadmissible):
        return "Inadmissible"
    return condition.reason or "Pending"


def standing(value: K8sWorkload) -> WorkloadStanding:
    """Where the workload stands after this value."""
    finished = _condition(value, "Finished")
    if finished is not None and finished.status == "True":
        return WorkloadStanding("finished", finished.reason, finished.message)
    if value.type == "DELETED":
        return WorkloadStanding("finished", "Deleted", None)
    admitted = _condition(value, "Admitted")
    if admitted is not None and admitted.status == "True":
        return WorkloadStanding("admitted", None, None)
    if not value.active:
        return WorkloadStanding("queued", "Deactivated", None)
    reserved = _condition(value, "QuotaReserved")
    if reserved is not None and reserved.status == "True":
        return WorkloadStanding("queued", "AdmissionChecks", reserved.message)
    evicted = _condition(value, "Evicted")
    if evicted is not None and evicted.status == "True":
        return WorkloadStanding("queued", evicted.reason or "Evicted", evicted.message)
    if reserved is not None:
        return WorkloadStanding("queued", _why_pending(reserved), reserved.message)
    return WorkloadStanding("queued", "Pending", None)
