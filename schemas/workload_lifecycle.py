"""The `workload.lifecycle` topic: transitions of Kueue workloads, keyed by workload uid.

A Kueue-queued Job has no pods until its Workload is admitted: its waiting is told here,
from the workload's creation. Admission hands the story over to the job's pods, whose
`pod.lifecycle` records carry the job's uid (`k8s.pods` `controller_uid`, the
workload's `job_uid`): the workload's queued time and its pods' running time are one
history.
"""

from collections.abc import Mapping
from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import DEFAULT_CLUSTER, Cluster, Count, EpochMs, Labels, Value, keep_default_cluster
from .k8s_pod import Owner

__all__ = ["TOPIC", "WorkloadLifecycle", "WorkloadState"]

WorkloadState = Literal["queued", "admitted", "finished"]
"""Where a Kueue workload stands: waiting for admission, admitted (its pods take over),
finished (Kueue's Finished condition, or the workload deleted)."""

_STATE_MS = "milliseconds spent in this state so far, including the state being left"


class WorkloadLifecycle(Value, frozen=True, kw_only=True, omit_defaults=True):
    """One transition of a Kueue workload between queued, admitted and finished.

    `ts` is the event time of the transition: the workload's creation for its first
    (queued, or where the watcher first saw it admitted or finished, the times of those
    conditions), else when the watcher saw the change. A change of reason within queued
    (the scheduler's message changed, an eviction) is a transition with
    `from_state == to_state`.
    """

    schema: Literal["gpuwatch.workload.lifecycle/v1"]
    uid: str
    namespace: str
    name: str
    queue: Annotated[str | None, msgspec.Meta(description="the LocalQueue")]
    cluster_queue: Annotated[str | None, msgspec.Meta(description="null until admitted")]
    job_uid: Annotated[
        str | None,
        msgspec.Meta(description="uid of the workload's Job: its pods' controller_uid"),
    ]
    owner: Owner | None
    labels: Labels
    pods: Count
    gpu_request: Mapping[str, Count]
    ts: EpochMs
    from_state: Annotated[
        WorkloadState | None, msgspec.Meta(description="null on the workload's first transition")
    ]
    to_state: WorkloadState
    reason: Annotated[
        str | None,
        msgspec.Meta(
            description="queued: WaitingForQuota, ExceedsMaxQuota, NoMatchingFlavor, "
            "Inadmissible, AdmissionChecks, Deactivated, an eviction's reason, Pending; "
            "finished: Kueue's reason (Succeeded, Failed...) or Deleted"
        ),
    ]
    message: Annotated[str | None, msgspec.Meta(description="Kueue's words, where it gave some")]
    queued_ms: Annotated[Count, msgspec.Meta(description=_STATE_MS)]
    admitted_ms: Annotated[Count, msgspec.Meta(description=_STATE_MS)]
    cluster: Cluster = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="workload.lifecycle",
    key="workload_uid",
    value_type=WorkloadLifecycle,
    key_of=lambda value: value.uid,
    # As pod.lifecycle: 30 days answer "how long did this team's jobs queue".
    compacted=False,
    retention_ms=30 * DAY_MS,
    internal=False,
)
