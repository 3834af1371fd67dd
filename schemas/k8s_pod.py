"""The `k8s.pods` topic: watch events of pods that request (or are seen on) a GPU, keyed by uid."""

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
from .ids import NodeName, PodUid

__all__ = ["TOPIC", "Condition", "ContainerStatus", "K8sPod", "Owner", "PodPhase"]

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


class Condition(Value, frozen=True, kw_only=True):
    """One entry of `status.conditions` (PodScheduled, Initialized, ContainersReady, Ready...)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None
    message: str | None


class ContainerStatus(Value, frozen=True, kw_only=True):
    """One entry of `status.containerStatuses`, flattened to the state that is set."""

    name: str
    state: Annotated[
        Literal["waiting", "running", "terminated"],
        msgspec.Meta(description="which of the container's states is set"),
    ]
    reason: Annotated[
        str | None,
        msgspec.Meta(description="e.g. ContainerCreating, CrashLoopBackOff, OOMKilled, Completed"),
    ]
    exit_code: Annotated[int | None, msgspec.Meta(description="set once terminated")]
    restarts: Count


class Owner(Value, frozen=True, kw_only=True):
    """The controlling owner reference of a pod (Job, ReplicaSet, StatefulSet, ...)."""

    kind: str
    name: str


class K8sPod(Value, frozen=True, kw_only=True, omit_defaults=True):
    """A pod as the watcher saw it after one watch event (the full state, not a diff).

    `ts` is when the watcher observed the event (Kubernetes watch events carry no event
    time). `type` RESYNC is re-sent after a relist; treat it like MODIFIED. Only pods that
    request a GPU resource, or whose process is seen on a GPU, are published.
    """

    schema: Literal["gpuwatch.k8s.pod/v1"]
    type: K8sEventType
    ts: EpochMs
    resource_version: Annotated[
        str, msgspec.Meta(description="metadata.resourceVersion; opaque, compare for equality")
    ]
    uid: PodUid
    namespace: str
    name: str
    node: Annotated[NodeName | None, msgspec.Meta(description="spec.nodeName; null until bound")]
    phase: PodPhase
    created_at: EpochMs
    scheduled_at: Annotated[
        EpochMs | None, msgspec.Meta(description="PodScheduled=True transition time")
    ]
    started_at: Annotated[EpochMs | None, msgspec.Meta(description="status.startTime")]
    finished_at: Annotated[
        EpochMs | None, msgspec.Meta(description="last container termination, once finished")
    ]
    gpu_request: Annotated[
        Mapping[str, Count],
        msgspec.Meta(description="GPU resource name -> count requested over all containers"),
    ]
    conditions: tuple[Condition, ...]
    containers: tuple[ContainerStatus, ...]
    labels: Labels
    owner: Owner | None
    priority_class: str | None
    queue: Annotated[
        str | None, msgspec.Meta(description="batch queue (Kueue, Volcano) when the pod has one")
    ]
    cluster: Cluster = DEFAULT_CLUSTER
    gpu_products: Annotated[
        tuple[str, ...] | None,
        msgspec.Meta(
            description="the GPU models (node label nvidia.com/gpu.product) the pod's node "
            "selector and required node affinity allow; null: any (added within v1)"
        ),
    ] = None
    controller_uid: Annotated[
        str | None,
        msgspec.Meta(
            description="uid of the pod's controller (its ownerReference with controller: "
            "true, e.g. the Job); a Kueue Workload names the same uid as its owner, which "
            "links a queued workload to its pods; null: no controller (added within v1)"
        ),
    ] = None
    scheduling_gates: Annotated[
        tuple[str, ...] | None,
        msgspec.Meta(
            description="spec.schedulingGates by name (kueue.x-k8s.io/admission: held by "
            "Kueue until admitted), [] for none; null: not told (a watcher from before the "
            "field was added within v1)"
        ),
    ] = None

    final_state_unknown: Annotated[
        bool,
        msgspec.Meta(
            description="on a DELETED: the watcher did not see the deletion (it found the "
            "pod gone from a relist, e.g. after a restart), so the value is the last state "
            "it knew and `ts` the relist's time (client-go's DeletedFinalStateUnknown); "
            "absent: false (added within v1)"
        ),
    ] = False

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="k8s.pods",
    key="pod_uid",
    value_type=K8sPod,
    key_of=lambda value: value.uid,
    # Delete after 7 days, not compaction: lifecycle replay needs every transition, which
    # compaction would fold into the last state. Low volume; live pods are re-sent as RESYNC
    # on every relist, so the window always holds each live pod's current state.
    compacted=False,
    retention_ms=7 * DAY_MS,
    internal=False,
)
