"""The `k8s.workloads` topic: Kueue Workloads as the watcher saw them, keyed by uid.

Kueue queues a Job (or a JobSet, a RayJob, plain pods...) as a Workload and keeps the
Job suspended, without pods, until the Workload is admitted: its waiting is only here.
"""

from collections.abc import Mapping
from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import (
    DEFAULT_CLUSTER,
    Cluster,
    Count,
    EpochMs,
    K8sEventType,
    Labels,
    Value,
    keep_default_cluster,
)
from .k8s_pod import Owner

__all__ = ["TOPIC", "K8sWorkload", "WorkloadCondition"]


class WorkloadCondition(Value, frozen=True, kw_only=True):
    """One entry of `status.conditions`: QuotaReserved, Admitted, Finished, Evicted,
    Preempted, Requeued, PodsReady..."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None
    message: Annotated[
        str | None,
        msgspec.Meta(
            description="Kueue's words, e.g. 'couldn't assign flavors to pod set main: "
            "insufficient unused quota for nvidia.com/gpu in flavor h100, 4 more needed'"
        ),
    ]
    at: Annotated[EpochMs | None, msgspec.Meta(description="lastTransitionTime")]


class K8sWorkload(Value, frozen=True, kw_only=True, omit_defaults=True):
    """A Kueue Workload after one watch event (the full state, not a diff).

    `ts` is when the watcher observed the event. `type` RESYNC is re-sent after a relist;
    treat it like MODIFIED. Read from `kueue.x-k8s.io` v1beta2 or v1beta1, whichever the
    API server prefers.
    """

    schema: Literal["gpuwatch.k8s.workload/v1"]
    type: K8sEventType
    ts: EpochMs
    resource_version: Annotated[
        str, msgspec.Meta(description="metadata.resourceVersion; opaque, compare for equality")
    ]
    uid: str
    namespace: str
    name: str
    created_at: EpochMs
    queue: Annotated[str | None, msgspec.Meta(description="spec.queueName, the LocalQueue")]
    cluster_queue: Annotated[
        str | None, msgspec.Meta(description="status.admission.clusterQueue; null until admitted")
    ]
    priority: Annotated[int | None, msgspec.Meta(description="spec.priority")]
    priority_class: Annotated[
        str | None, msgspec.Meta(description="the WorkloadPriorityClass or PriorityClass name")
    ]
    active: Annotated[bool, msgspec.Meta(description="spec.active (false: deactivated)")]
    pods: Annotated[Count, msgspec.Meta(description="pods over all pod sets (their counts)")]
    gpu_request: Annotated[
        Mapping[str, Count],
        msgspec.Meta(
            description="GPU resource name -> count over all pod sets: each set's count x "
            "what one of its pods requests"
        ),
    ]
    conditions: tuple[WorkloadCondition, ...]
    owner: Annotated[
        Owner | None,
        msgspec.Meta(description="the controller of the workload's job (a Job's CronJob...)"),
    ]
    job_uid: Annotated[
        str | None,
        msgspec.Meta(
            description="uid of the workload's controller (the Job): its pods' "
            "`controller_uid`; null for a workload without one"
        ),
    ]
    labels: Labels
    admitted_at: Annotated[
        EpochMs | None, msgspec.Meta(description="Admitted=True transition time")
    ]
    finished_at: Annotated[
        EpochMs | None, msgspec.Meta(description="Finished=True transition time")
    ]
    cluster: Cluster = DEFAULT_CLUSTER
    final_state_unknown: Annotated[
        bool,
        msgspec.Meta(
            description="on a DELETED: the watcher did not see the deletion (it found the "
            "workload gone from a relist, e.g. after a restart), so the value is the last "
            "state it knew and `ts` the relist's time (client-go's DeletedFinalStateUnknown); "
            "absent: false (added within v1)"
        ),
    ] = False

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="k8s.workloads",
    key="workload_uid",
    value_type=K8sWorkload,
    key_of=lambda value: value.uid,
    # As k8s.pods: every transition is kept for 7 days (a queue's history), and live
    # workloads are re-sent as RESYNC on every relist.
    compacted=False,
    retention_ms=7 * DAY_MS,
    internal=False,
)
