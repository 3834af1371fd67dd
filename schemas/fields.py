"""Field types shared by several topics: event time, constrained numbers, labels and enums."""

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

__all__ = [
    "DEFAULT_CLUSTER",
    "AttributionMethod",
    "Bytes",
    "Cluster",
    "Count",
    "EpochMs",
    "K8sEventType",
    "Labels",
    "LifecycleState",
    "NonNegFloat",
    "Pct",
    "Ratio",
    "Revision",
    "Seconds",
    "Sharing",
    "Usd",
    "Value",
    "keep_default_cluster",
]

EpochMs = Annotated[int, msgspec.Meta(ge=0, description="event time, epoch milliseconds")]
"""Event time as an integer count of milliseconds since the Unix epoch (UTC)."""

Count = Annotated[int, msgspec.Meta(ge=0)]
Bytes = Annotated[int, msgspec.Meta(ge=0, description="bytes")]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0, description="seconds (an integral over time)")]
Usd = Annotated[float, msgspec.Meta(ge=0, description="US dollars")]
Pct = Annotated[float, msgspec.Meta(ge=0, le=100, description="percent, 0..100")]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1, description="ratio, 0..1")]
Revision = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        description="0 (absent) for the first copy; a window revised by data that came "
        "after it closed is emitted again whole, same identity, with a higher revision: "
        "consumers keep the highest (added within v1)",
    ),
]
"""Which copy of a window record this is (SEMANTICS.md, Late data)."""

DEFAULT_CLUSTER = "default"
"""The cluster of a message that names none: every message of a single-cluster set-up."""

Cluster = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$",
        description=(
            "the cluster the message comes from (setting cluster, GPUWATCH_CLUSTER); "
            "absent: the default cluster"
        ),
    ),
]
"""Which cluster a value belongs to, where many clusters feed one pipeline. Node names
repeat across clusters, so a node is `(cluster, node)`; pod uids and GPU uuids are unique
already. Letters, digits, `.`, `_` and `-`, as a Prometheus label value and a Redis key
part take it without escaping. Values of the default cluster leave the field out
(`omit_defaults` on each topic value), so a single-cluster set-up writes and reads exactly
what it did before the field existed."""


def keep_default_cluster(value: Any) -> None:
    """`__post_init__` of the values with a `cluster`: a default cluster named as such (read
    from a message or a setting) becomes the default itself, so it is left out when the
    value is written (msgspec leaves out a default only when it is the very object)."""
    if value.cluster is not DEFAULT_CLUSTER and value.cluster == DEFAULT_CLUSTER:
        msgspec.structs.force_setattr(value, "cluster", DEFAULT_CLUSTER)


UnitName = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$",
        description="a unit of work as a pod's gpuwatch.io/work annotation names it "
        "(steps, tokens, requests...)",
    ),
]
WorkUnitCounts = Annotated[
    Mapping[UnitName, NonNegFloat],
    msgspec.Meta(description="units of work done, by unit name"),
]
Labels = Annotated[
    Mapping[str, str],
    msgspec.Meta(description="allow-listed Kubernetes labels (never every label)"),
]

Sharing = Literal["exclusive", "time-slicing", "mps", "mig"]
"""How a GPU is shared: whole device, time-sliced replicas, MPS clients, or a MIG instance."""

K8sEventType = Literal["ADDED", "MODIFIED", "DELETED", "RESYNC"]
"""Watch event type; RESYNC is re-sent after a relist and consumers treat it like MODIFIED."""

LifecycleState = Literal["queued", "running", "stalled", "finished"]
"""Lifecycle state of a pod that requests a GPU (docs/DESIGN.md §4)."""

AttributionMethod = Literal["exclusive", "process", "memory_share", "unknown"]
"""How a pod's compute share of a GPU was derived, from most to least precise.

exclusive: the device reading of a GPU the pod holds alone; process: per-process `sm_pct`
summed per pod; memory_share: the device reading split by VRAM share; unknown: no
utilization reading (MIG, for one), so no share is claimed.
"""


class Value(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False, gc=False):
    """Base of every topic value and nested object.

    Frozen (values are facts), keyword-only, and lenient about unknown fields: within a
    major version only additive changes are allowed, so an older reader must accept a newer
    writer's extra fields. gc=False: decoded JSON cannot form reference cycles, and skipping
    the cycle collector's bookkeeping matters at 40,000 GPU-samples/s. Subclasses repeat
    `frozen=True, kw_only=True` so that type checkers see it too.
    """
