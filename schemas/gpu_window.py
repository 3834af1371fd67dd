"""The `gpu.windows` topic: one record per GPU per closed window (idle, waste), keyed by uuid."""

from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import (
    DEFAULT_CLUSTER,
    Bytes,
    Cluster,
    EpochMs,
    Pct,
    Ratio,
    Revision,
    Seconds,
    Value,
    keep_default_cluster,
)
from .ids import GpuUuid, NodeName, PodUid

__all__ = ["TOPIC", "GpuWindow", "PodWindowShare"]


class PodWindowShare(Value, frozen=True, kw_only=True):
    """One pod allocated on the GPU during the window (seconds count 1/k of k sharers)."""

    uid: PodUid
    namespace: str
    pod: str
    allocated_seconds: Seconds
    used_gpu_seconds: Annotated[Seconds, msgspec.Meta(description="compute share x seconds")]
    idle_seconds: Seconds
    share_mean: Annotated[
        Ratio | None,
        msgspec.Meta(description="mean compute share, 0..1; null when utilization is unknown"),
    ]
    vram_peak_bytes: Bytes


class GpuWindow(Value, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU (or MIG instance) over `[window_start, window_end)`.

    A second counts as busy when utilization is at or over the idle threshold, idle when
    under it, and as neither when utilization is unknown (null, MIG for one). Identity is
    `(uuid, window_start)`; `ts` equals `window_end`.
    """

    schema: Literal["gpuwatch.gpu.window/v1"]
    uuid: GpuUuid
    node: NodeName
    model: str
    parent_uuid: Annotated[
        GpuUuid | None, msgspec.Meta(description="physical GPU of a MIG instance, else null")
    ]
    ts: Annotated[EpochMs, msgspec.Meta(description="event time: equals window_end")]
    window_start: EpochMs
    window_end: Annotated[EpochMs, msgspec.Meta(description="exclusive end of the window")]
    util_mean_pct: Annotated[
        Pct | None, msgspec.Meta(description="mean utilization; null when unknown (MIG)")
    ]
    busy_seconds: Seconds
    idle_seconds: Seconds
    allocated_seconds: Annotated[
        Seconds, msgspec.Meta(description="seconds allocated to at least one pod")
    ]
    allocated_idle_seconds: Annotated[
        Seconds, msgspec.Meta(description="allocated and idle: the waste")
    ]
    unallocated_seconds: Annotated[
        Seconds, msgspec.Meta(description="seconds allocated to no pod: fleet idle")
    ]
    attributed_ratio: Annotated[
        Ratio | None,
        msgspec.Meta(description="share of the device's use explained by pods; null if no use"),
    ]
    unattributed_ratio: Annotated[
        Ratio | None,
        msgspec.Meta(description="1 - attributed_ratio: use no pod explains; null likewise"),
    ]
    pods: tuple[PodWindowShare, ...]
    cluster: Cluster = DEFAULT_CLUSTER
    revision: Revision = 0

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="gpu.windows",
    key="gpu_uuid",
    value_type=GpuWindow,
    key_of=lambda value: value.uuid,
    # Delete after 30 days: fleet idle and waste trends over a month; not compacted, the
    # identity is (uuid, window) while the key is the GPU.
    compacted=False,
    retention_ms=30 * DAY_MS,
    internal=False,
)
