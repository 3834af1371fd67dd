"""The `attribution` topic: one record per pod per closed window (use, idle, cost), keyed by uid."""

from collections.abc import Mapping
from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import (
    DEFAULT_CLUSTER,
    AttributionMethod,
    Bytes,
    Cluster,
    EpochMs,
    Labels,
    LifecycleState,
    NonNegFloat,
    Revision,
    Seconds,
    Sharing,
    Usd,
    Value,
    WorkUnitCounts,
    keep_default_cluster,
)
from .ids import GpuUuid, NodeName, PodUid
from .k8s_pod import Owner

__all__ = ["TOPIC", "Attribution", "GpuAttribution"]


class GpuAttribution(Value, frozen=True, kw_only=True):
    """The pod's share of one GPU over the window.

    Seconds of a GPU shared by k pods count 1/k to each; a GPU-second's cost goes to the
    pods allocated on it in equal parts.
    """

    uuid: GpuUuid
    model: str
    sharing: Sharing
    allocated_gpu_seconds: Seconds
    used_gpu_seconds: Annotated[Seconds, msgspec.Meta(description="compute share x seconds")]
    idle_gpu_seconds: Annotated[
        Seconds, msgspec.Meta(description="allocated seconds with the pod's share under idle")
    ]
    vram_peak_bytes: Bytes
    cost_usd: Usd
    method: AttributionMethod


class Attribution(Value, frozen=True, kw_only=True, omit_defaults=True):
    """What one pod used, idled and cost on its GPUs over `[window_start, window_end)`.

    Identity is `(uid, window_start)`: re-processing yields the same record again, never a
    second one, so sinks upsert on it. `ts` equals `window_end`. The totals are the sums
    over `gpus`; `method` is the least precise method among them (exclusive > process >
    memory_share > unknown).
    """

    schema: Literal["gpuwatch.attribution/v1"]
    uid: PodUid
    namespace: str
    pod: str
    node: Annotated[NodeName | None, msgspec.Meta(description="null while not bound to a node")]
    labels: Labels
    owner: Owner | None
    ts: Annotated[EpochMs, msgspec.Meta(description="event time: equals window_end")]
    window_start: EpochMs
    window_end: Annotated[EpochMs, msgspec.Meta(description="exclusive end of the window")]
    state: Annotated[LifecycleState, msgspec.Meta(description="lifecycle state at window_end")]
    gpus: tuple[GpuAttribution, ...]
    allocated_gpu_seconds: Seconds
    used_gpu_seconds: Seconds
    idle_gpu_seconds: Seconds
    vram_byte_seconds: NonNegFloat
    vram_peak_bytes: Bytes
    energy_joules: Annotated[
        NonNegFloat,
        msgspec.Meta(description="device energy x compute share; 0 where power is unknown"),
    ]
    cost_usd: Usd
    waste_usd: Annotated[Usd, msgspec.Meta(description="cost of the idle allocated seconds")]
    method: AttributionMethod
    cluster: Cluster = DEFAULT_CLUSTER
    work_units: Annotated[
        WorkUnitCounts,
        msgspec.Meta(
            description="units of work the pod reported done in the window, by name (its "
            "gpuwatch.io/work counters, scraped by the node agent: a scrape's increase "
            "counts in the window its scrape time falls in); absent for pods that report "
            "none (added within v1)"
        ),
    ] = msgspec.field(default_factory=dict)
    cost_per_unit: Annotated[
        Mapping[str, Usd | None],
        msgspec.Meta(
            description="cost_usd over work_units, by unit name; null where no unit of "
            "that name was done in the window (added within v1)"
        ),
    ] = msgspec.field(default_factory=dict)
    revision: Revision = 0

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="attribution",
    key="pod_uid",
    value_type=Attribution,
    key_of=lambda value: value.uid,
    # Delete after 35 days: chargeback closes a calendar month (up to 31 days) a few days
    # after it ends, and must be able to re-read the whole month from Kafka. Not compacted:
    # the key is the pod, the identity is (pod, window), so compaction would lose windows.
    compacted=False,
    retention_ms=35 * DAY_MS,
    internal=False,
)
