"""The internal `pod.usage` topic: per-pod GPU usage pre-aggregated on the node side, keyed by uid.

This is the one repartition of the pipeline (node -> pod uid). It is internal and may change
before the first release; nothing outside the worker should read it.
"""

from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import (
    DEFAULT_CLUSTER,
    AttributionMethod,
    Bytes,
    Cluster,
    Count,
    EpochMs,
    NonNegFloat,
    Ratio,
    Seconds,
    Sharing,
    Usd,
    Value,
    WorkUnitCounts,
    keep_default_cluster,
)
from .ids import GpuUuid, NodeName, PodUid

__all__ = ["TOPIC", "GpuUsage", "PodUsage"]


class GpuUsage(Value, frozen=True, kw_only=True):
    """One GPU's use by the pod over the covered interval: integrals, peaks and means.

    Seconds of a GPU shared by k pods count 1/k to each (docs/DESIGN.md §4). Intervals with
    unknown utilization count as allocated but neither used nor idle. `model`, `sharing`
    and the costs are resolved where the samples land (partitioned by node, with the
    node's labels for price overrides), because the pod-keyed side cannot see them.
    """

    uuid: GpuUuid
    model: str
    sharing: Sharing
    allocated_seconds: Seconds
    used_gpu_seconds: Annotated[Seconds, msgspec.Meta(description="compute share x seconds")]
    idle_seconds: Annotated[
        Seconds, msgspec.Meta(description="allocated seconds with the pod's share under idle")
    ]
    vram_byte_seconds: NonNegFloat
    vram_peak_bytes: Bytes
    energy_joules: Annotated[
        NonNegFloat,
        msgspec.Meta(description="device energy x compute share; 0 where power is unknown"),
    ]
    share_mean: Annotated[
        Ratio | None,
        msgspec.Meta(description="mean compute share over known intervals; null if none"),
    ]
    cost_usd: Usd
    waste_usd: Annotated[Usd, msgspec.Meta(description="cost of the idle allocated seconds")]
    method: AttributionMethod


class PodUsage(Value, frozen=True, kw_only=True, omit_defaults=True):
    """A pod's GPU usage over `[ts, end_ts)`, one message per pod per flush interval.

    Pre-aggregated so the repartition carries an order of magnitude fewer messages than
    GPU-samples, while the event time of every interval survives in `ts`/`end_ts` and
    `idle_since`.
    """

    schema: Literal["gpuwatch.pod.usage/v1"]
    uid: PodUid
    node: NodeName
    ts: Annotated[EpochMs, msgspec.Meta(description="start of the covered interval, epoch ms")]
    end_ts: Annotated[EpochMs, msgspec.Meta(description="end (exclusive) of the interval")]
    gpus: tuple[GpuUsage, ...]
    idle_since: Annotated[
        EpochMs | None,
        msgspec.Meta(description="since when the pod is idle on all allocated GPUs; null if not"),
    ]
    samples: Annotated[Count, msgspec.Meta(description="node samples aggregated")]
    cluster: Cluster = DEFAULT_CLUSTER
    units: Annotated[
        WorkUnitCounts,
        msgspec.Meta(
            description="units of work the pod's scrapes found done over [ts, end_ts) "
            "(nvml.samples work); absent when none"
        ),
    ] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="pod.usage",
    key="pod_uid",
    value_type=PodUsage,
    key_of=lambda value: value.uid,
    # Delete after 1 day: a repartition topic, consumed within seconds; a day covers a
    # worker outage and a replay of the same day, like nvml.samples it derives from.
    compacted=False,
    retention_ms=1 * DAY_MS,
    internal=True,
)
