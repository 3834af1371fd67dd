"""The node agent's boundaries: what a GPU reader, a PID resolver and an allocation source give.

Each third-party source (NVML, /proc, the kubelet) sits behind one of these
Protocols so the agent's loop can be driven by a simulator or a recorded fake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import RemappedRows


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """A process NVML sees on one device; host PID, pod not yet resolved."""

    pid: int
    mem_bytes: int | None
    """GPU memory of the process; None where the driver cannot tell (MIG without privileges)."""
    sm_pct: float | None
    """SM utilization of the process over the interval; None where unsupported."""


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One GPU or MIG instance over one interval. None is "unsupported", never 0."""

    uuid: GpuUuid
    index: int
    model: str
    parent_uuid: GpuUuid | None
    """The physical GPU of a MIG instance; None for a whole GPU."""
    mig_profile: str | None
    """MIG profile such as `1g.18gb`; None for a whole GPU."""
    mig_enabled: bool
    """True for a MIG instance (and for a parent GPU whose MIG mode is on)."""
    util_pct: float | None
    mem_util_pct: float | None
    mem_used_bytes: int
    mem_total_bytes: int
    power_w: float | None
    temp_c: int | None
    xid_errors: tuple[int, ...]
    ecc_dbe: int | None
    processes: tuple[ProcessReading, ...]
    mps: bool = False
    """True when NVML lists MPS client processes on the device (sharing mode `mps`)."""
    throttle_reasons: tuple[str, ...] | None = None
    """Active clock event reasons (`schemas.nvml_sample.THROTTLE_REASONS`); None: unsupported."""
    remapped_rows: RemappedRows | None = None
    retired_pages_pending: bool | None = None
    pcie_replays: int | None = None


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Everything one tick read, with what went wrong on devices that could not be read."""

    devices: tuple[DeviceReading, ...]
    errors: tuple[str, ...] = ()
    """One line per device or call that failed (`GPU 3: GPU is lost`); the others still count."""


class GpuReader(Protocol):
    """Reads every GPU and MIG instance of the node once per tick."""

    def read(self) -> ReadResult:
        """Read all devices now; never raises for one device's failure."""
        ...

    def close(self) -> None:
        """Release the driver handle."""
        ...


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod and container a host PID belongs to."""

    pod_uid: PodUid
    container_id: str | None
    container: str | None = None
    """Container name when known (the kubelet's allocations name it; cgroups only give ids)."""


class PodResolver(Protocol):
    """Host PID -> pod; None for a PID of no pod or one that has exited meanwhile."""

    def resolve(self, pid: int) -> PodRef | None:
        """The pod of `pid`, or None."""
        ...


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One container's devices of one resource, as the kubelet reports them."""

    pod_uid: PodUid
    namespace: str
    pod: str
    container: str
    resource: str
    """Resource name, e.g. `nvidia.com/gpu` or `nvidia.com/mig-1g.10gb`."""
    device_ids: tuple[str, ...]
    """Device ids as the device plugin gave them (`GPU-…::3` for a time-slicing replica);
    GPU or MIG uuids for a device allocated through a ResourceClaim."""
    claim: str | None = None
    """`namespace/name` of the ResourceClaim the devices came from (Dynamic Resource
    Allocation); None for a device plugin's devices."""


class AllocationSource(Protocol):
    """Which pod holds which device, from the kubelet PodResources API (device plugins'
    devices and ResourceClaims' alike)."""

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        """Current allocations; None when the source is unavailable this tick."""
        ...
