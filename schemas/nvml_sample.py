"""The `nvml.samples` topic: one NVML reading of every GPU of a node per tick, keyed by node."""

from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import (
    DEFAULT_CLUSTER,
    Bytes,
    Cluster,
    Count,
    EpochMs,
    NonNegFloat,
    Pct,
    Sharing,
    Value,
    WorkUnitCounts,
    keep_default_cluster,
)
from .ids import GpuUuid, NodeName, PodUid

__all__ = [
    "THROTTLE_REASONS",
    "TOPIC",
    "Allocation",
    "GpuProcess",
    "GpuReading",
    "NvmlSample",
    "RemappedRows",
]


class GpuProcess(Value, frozen=True, kw_only=True):
    """A process NVML sees on a GPU, with the pod it belongs to when it belongs to one."""

    pid: Annotated[Count, msgspec.Meta(description="host PID (NVML reports host PIDs)")]
    mem_bytes: Annotated[
        Bytes | None, msgspec.Meta(description="GPU memory used; null where NVML cannot tell")
    ]
    sm_pct: Annotated[
        Pct | None,
        msgspec.Meta(description="the process's SM utilization; null where unsupported"),
    ]
    pod_uid: Annotated[
        PodUid | None,
        msgspec.Meta(description="pod resolved from /proc/<pid>/cgroup; null when no pod"),
    ]
    container: Annotated[
        str | None, msgspec.Meta(description="container name in the pod; null when no pod")
    ]


THROTTLE_REASONS: Final = (
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
)
"""The clock event (throttle) reasons a reading names when active, as nvidia-smi's
`clocks_event_reasons.*` fields call them. `gpu_idle`, `applications_clocks_setting` and
`display_clock_setting` are left out: they slow nothing that runs."""


class RemappedRows(Value, frozen=True, kw_only=True):
    """Row remapping of the GPU's memory (Ampere and later): NVML's `GetRemappedRows`."""

    correctable: Annotated[Count, msgspec.Meta(description="rows remapped for repeated SBEs")]
    uncorrectable: Annotated[Count, msgspec.Meta(description="rows remapped for a DBE")]
    pending: Annotated[bool, msgspec.Meta(description="a remapping waits for a GPU reset")]
    failed: Annotated[
        bool, msgspec.Meta(description="a remapping failed: the GPU should be replaced")
    ]


class GpuReading(Value, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU (or one MIG instance) over the sampled interval.

    Readings a driver does not support are null, never a made-up 0; they are still required
    fields, so a missing key is an error while a null is an honest "unknown". The health
    readings after `processes` came later within v1: absent is the same as null.
    """

    uuid: Annotated[GpuUuid, msgspec.Meta(description="GPU uuid, or the MIG device uuid")]
    index: Annotated[Count, msgspec.Meta(description="NVML device index on the node")]
    model: Annotated[str, msgspec.Meta(description="NVML product name")]
    parent_uuid: Annotated[
        GpuUuid | None, msgspec.Meta(description="physical GPU of a MIG instance, else null")
    ]
    mig_profile: Annotated[
        str | None, msgspec.Meta(description="MIG profile such as 1g.10gb, else null")
    ]
    sharing: Sharing
    util_pct: Annotated[Pct | None, msgspec.Meta(description="device GPU utilization")]
    mem_util_pct: Annotated[Pct | None, msgspec.Meta(description="memory controller busy")]
    mem_used_bytes: Bytes
    mem_total_bytes: Bytes
    power_w: Annotated[NonNegFloat | None, msgspec.Meta(description="power draw, watts")]
    temp_c: Annotated[int | None, msgspec.Meta(description="GPU temperature, Celsius")]
    xid_errors: Annotated[
        tuple[Count, ...], msgspec.Meta(description="Xid error codes seen in the interval")
    ]
    ecc_dbe: Annotated[
        Count | None,
        msgspec.Meta(description="volatile double-bit ECC errors; null without ECC"),
    ]
    processes: tuple[GpuProcess, ...]
    throttle_reasons: Annotated[
        tuple[Annotated[str, msgspec.Meta(max_length=64)], ...] | None,
        msgspec.Meta(
            description="clock event reasons active at the read (THROTTLE_REASONS; [] none); "
            "null where unsupported or on a MIG instance (the parent GPU has them)"
        ),
    ] = None
    remapped_rows: Annotated[
        RemappedRows | None,
        msgspec.Meta(description="row remapping; null where unsupported (before Ampere, MIG)"),
    ] = None
    retired_pages_pending: Annotated[
        bool | None,
        msgspec.Meta(
            description="pages wait to be retired at the next reset; null where the GPU "
            "remaps rows instead (Ampere and later) or on a MIG instance"
        ),
    ] = None
    pcie_replays: Annotated[
        Count | None,
        msgspec.Meta(description="PCIe replay counter since the driver loaded; null if none"),
    ] = None


class Allocation(Value, frozen=True, kw_only=True, omit_defaults=True):
    """A GPU resource the kubelet (PodResources API) has assigned to a pod's container."""

    pod_uid: PodUid
    namespace: str
    pod: str
    container: str
    resource: Annotated[
        str,
        msgspec.Meta(
            description="extended resource, e.g. nvidia.com/gpu or nvidia.com/mig-*; for a "
            "device allocated through a ResourceClaim <driver>/<type>, e.g. "
            "gpu.nvidia.com/gpu or gpu.nvidia.com/mig-1g.10gb"
        ),
    ]
    device_ids: Annotated[
        tuple[GpuUuid, ...],
        msgspec.Meta(
            description="GPU or MIG uuids; a time-slicing replica suffix (::N) is stripped"
        ),
    ]
    claim: Annotated[
        str | None,
        msgspec.Meta(
            description="namespace/name of the ResourceClaim the devices were allocated "
            "through (Dynamic Resource Allocation); absent for device-plugin devices "
            "(added within v1)"
        ),
    ] = None


class PodWork(Value, frozen=True, kw_only=True):
    """Units of work a pod's counters say were done, as one scrape of its `/metrics` found
    them within the sample's interval (the increase since its previous scrape)."""

    pod_uid: PodUid
    units: WorkUnitCounts


class NvmlSample(Value, frozen=True, kw_only=True, omit_defaults=True):
    """All GPUs of one node over `[ts, ts + interval_ms)`, with the kubelet's allocations.

    `ts` is the start of the sampled interval. `allocations` are read every tick, so a GPU
    is allocated to a pod exactly over the intervals whose sample lists it.
    """

    schema: Literal["gpuwatch.nvml.sample/v1"]
    node: NodeName
    ts: EpochMs
    interval_ms: Annotated[int, msgspec.Meta(gt=0, description="length of the interval, ms")]
    seq: Annotated[
        Count, msgspec.Meta(description="per-agent tick counter; a gap or reset shows loss")
    ]
    gpus: tuple[GpuReading, ...]
    allocations: tuple[Allocation, ...]
    cluster: Cluster = DEFAULT_CLUSTER
    work: Annotated[
        tuple[PodWork, ...],
        msgspec.Meta(
            description="units of work of the node's opted-in pods (gpuwatch.io/work) whose "
            "scrape ended within the interval; the same increases as on work.units, here "
            "so the worker counts them in the window of this sample (added within v1)"
        ),
    ] = msgspec.field(default_factory=tuple)

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="nvml.samples",
    key="node",
    value_type=NvmlSample,
    key_of=lambda value: value.node,
    # Delete after 1 day: the highest-volume topic (about 1 KB per GPU per second), kept long
    # enough to replay a day and to survive a worker outage; history lives in the sinks.
    compacted=False,
    retention_ms=1 * DAY_MS,
    internal=False,
)
