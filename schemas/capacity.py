"""The `capacity` topic: a cluster's GPUs of one model and resource, free, stranded and
reclaimable, each time that picture changes; keyed by `cluster/product/resource`."""

from collections.abc import Mapping
from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import DEFAULT_CLUSTER, Cluster, Count, EpochMs, Value, keep_default_cluster
from .ids import GpuUuid, NodeName

__all__ = ["TOPIC", "Capacity", "ReclaimableGpu", "capacity_key"]


class ReclaimableGpu(Value, frozen=True, kw_only=True):
    """An allocated GPU idle past the idle alert's threshold that a queued pod could use."""

    node: NodeName
    uuid: GpuUuid
    since: Annotated[EpochMs, msgspec.Meta(description="idle since (event time)")]
    pods: Annotated[tuple[str, ...], msgspec.Meta(description="the holders, `namespace/pod`")]


class Capacity(Value, frozen=True, kw_only=True, omit_defaults=True):
    """One cluster's GPUs of one model and one GPU resource, as of `ts` (event time).

    `free` is allocatable minus allocated over the nodes that can take pods (Ready, not
    cordoned). `stranded`: free devices on nodes that queued pods wanting this resource
    could use but fit on none of them. `reclaimable`: allocated devices idle for at least
    the idle alert's threshold on nodes such a queued pod could use (`reclaimable_gpus`,
    longest idle first). A new record replaces the key's previous one: the latest is the
    picture now. Semantics: streams/SEMANTICS-capacity.md.
    """

    schema: Literal["gpuwatch.capacity/v1"]
    ts: EpochMs
    model: Annotated[
        str,
        msgspec.Meta(
            description="the GPU model as NVML names it (as the GPU series do); the nodes' "
            "nvidia.com/gpu.product label before any of them sent a sample; unknown if neither"
        ),
    ]
    product: Annotated[
        str | None,
        msgspec.Meta(
            description="the nodes' nvidia.com/gpu.product label (what a pod's node selector "
            "names); null when they have none"
        ),
    ]
    resource: Annotated[str, msgspec.Meta(description="GPU resource name: nvidia.com/gpu, ...")]
    free: Count
    stranded: Count
    reclaimable: Count
    free_by_node: Annotated[
        Mapping[NodeName, Count],
        msgspec.Meta(description="free devices of each node that has any"),
    ]
    reclaimable_gpus: tuple[ReclaimableGpu, ...]
    queued: Annotated[
        Count, msgspec.Meta(description="queued pods that want this resource and could use it")
    ]
    blocked: Annotated[Count, msgspec.Meta(description="of those, pods blocked by fragmentation")]
    cluster: Cluster = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        keep_default_cluster(self)

    def key(self) -> str:
        """The record's key: by the nodes' label, which is known from their first node
        event, while `model` becomes NVML's name once a node of them has sent a sample."""
        return capacity_key(self.cluster, self.product or self.model, self.resource)


def capacity_key(cluster: str, product: str, resource: str) -> str:
    """The record key: `product/resource`, `cluster/product/resource` for a named cluster
    (`product`: the nodes' label, or the model where they have none)."""
    base = f"{product}/{resource}"
    return base if cluster == DEFAULT_CLUSTER else f"{cluster}/{base}"


TOPIC: Final = TopicSpec(
    name="capacity",
    key="cluster/product/resource",
    value_type=Capacity,
    key_of=lambda value: value.key(),
    # Delete after 30 days, as gpu.windows: capacity trends; the latest record per key is
    # the picture now.
    compacted=False,
    retention_ms=30 * DAY_MS,
    internal=False,
)
