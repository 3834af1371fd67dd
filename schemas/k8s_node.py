"""The `k8s.nodes` topic: watch events of GPU nodes (GPU capacity, health), keyed by node."""

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
from .ids import NodeName

__all__ = ["TOPIC", "K8sNode"]


class K8sNode(Value, frozen=True, kw_only=True, omit_defaults=True):
    """A node as the watcher saw it after one watch event (the full state, not a diff).

    `ts` is when the watcher observed the event. `labels` are allow-listed: instance type,
    node pool, `nvidia.com/gpu.replicas`, MIG strategy and the like.
    """

    schema: Literal["gpuwatch.k8s.node/v1"]
    type: K8sEventType
    node: NodeName
    ts: EpochMs
    gpu_capacity: Annotated[
        Mapping[str, Count],
        msgspec.Meta(
            description="status.capacity of GPU resources: resource -> count; plus the "
            "devices of the GPU DRA drivers' ResourceSlices on the node, as "
            "<driver>/gpu or <driver>/mig-<profile> (e.g. gpu.nvidia.com/gpu)"
        ),
    ]
    gpu_allocatable: Annotated[
        Mapping[str, Count],
        msgspec.Meta(
            description="status.allocatable of GPU resources: resource -> count; plus the "
            "devices of the GPU DRA drivers' ResourceSlices on the node, as "
            "<driver>/gpu or <driver>/mig-<profile> (e.g. gpu.nvidia.com/gpu)"
        ),
    ]
    gpu_product: Annotated[
        str | None,
        msgspec.Meta(description="nvidia.com/gpu.product label; null when not labelled"),
    ]
    labels: Labels
    ready: Annotated[bool, msgspec.Meta(description="Ready condition is True")]
    unschedulable: Annotated[bool, msgspec.Meta(description="spec.unschedulable (cordoned)")]
    cluster: Cluster = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="k8s.nodes",
    key="node",
    value_type=K8sNode,
    key_of=lambda value: value.node,
    # Delete after 7 days, like k8s.pods: replay needs the history (a node going NotReady),
    # and every relist re-sends each live node as RESYNC.
    compacted=False,
    retention_ms=7 * DAY_MS,
    internal=False,
)
