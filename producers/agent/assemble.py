"""Builds one `nvml.samples` message from a tick's readings, PID owners and allocations."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from producers.base.devices import is_replicated, normalise_device_id
from producers.base.ports import DeviceAllocation, DeviceReading, PodRef, ReadResult
from schemas.fields import DEFAULT_CLUSTER, Sharing
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import Allocation, GpuProcess, GpuReading, NvmlSample

SCHEMA: Final = "gpuwatch.nvml.sample/v1"

Resolve = Callable[[int], PodRef | None]


@dataclass(frozen=True)
class SharingConfig:
    """Sharing modes the node's configuration declares, for what NVML cannot see.

    Time-slicing shows in replicated device ids (`GPU-…::3`); MPS shows when NVML lists
    MPS clients. A device plugin configured for sharing without replicas, or an MPS
    daemon with no client yet, is declared here: by GPU uuid, or for all with `default`.
    """

    by_uuid: Mapping[str, Sharing] = field(default_factory=dict)
    default: Sharing | None = None


def sharing_mode(
    reading: DeviceReading, replicated: set[GpuUuid], config: SharingConfig
) -> Sharing:
    """`mig` from MIG mode, then configuration, MPS clients, replicas or a claim shared
    by pods (time-slicing), else exclusive. MPS comes before replicas: the NVIDIA device
    plugin's MPS sharing names its replicas `::N` as time-slicing does."""
    if reading.mig_enabled or reading.parent_uuid is not None:
        return "mig"
    declared = config.by_uuid.get(reading.uuid, config.default)
    if declared is not None:
        return declared
    if reading.mps:
        return "mps"
    if reading.uuid in replicated:
        return "time-slicing"
    return "exclusive"


def normalise_allocations(allocations: tuple[DeviceAllocation, ...]) -> tuple[Allocation, ...]:
    """Allocations with device ids as GPU/MIG uuids, replicas folded, order kept."""
    out = []
    for item in allocations:
        uuids = tuple(dict.fromkeys(normalise_device_id(d)[0] for d in item.device_ids))
        out.append(
            Allocation(
                pod_uid=item.pod_uid,
                namespace=item.namespace,
                pod=item.pod,
                container=item.container,
                resource=item.resource,
                device_ids=uuids,
                claim=item.claim,
            )
        )
    return tuple(out)


def assemble_sample(
    *,
    node: str,
    ts_ms: int,
    interval_ms: int,
    seq: int,
    read: ReadResult,
    resolve: Resolve,
    allocations: tuple[DeviceAllocation, ...] | None,
    sharing: SharingConfig | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> NvmlSample:
    """One node sample of `cluster`. `allocations` None (kubelet unreachable) publishes an
    empty list."""
    raw = allocations or ()
    allocated = normalise_allocations(raw)
    replicated = is_replicated(raw)
    # (pod uid, device uuid) -> containers holding it, to name a process's container.
    holders: dict[tuple[PodUid, GpuUuid], list[str]] = {}
    for item in allocated:
        for uuid in item.device_ids:
            holders.setdefault((item.pod_uid, uuid), []).append(item.container)
    config = sharing or SharingConfig()
    gpus = tuple(
        _gpu(device, sharing_mode(device, replicated, config), resolve, holders)
        for device in read.devices
    )
    return NvmlSample(
        schema=SCHEMA,
        node=NodeName(node),
        ts=ts_ms,
        interval_ms=interval_ms,
        seq=seq,
        gpus=gpus,
        allocations=allocated,
        cluster=cluster,
    )


def _gpu(
    device: DeviceReading,
    mode: Sharing,
    resolve: Resolve,
    holders: Mapping[tuple[PodUid, GpuUuid], list[str]],
) -> GpuReading:
    processes = []
    for process in device.processes:
        ref = resolve(process.pid)
        container = None
        if ref is not None:
            container = ref.container
            if container is None:
                names = holders.get((ref.pod_uid, device.uuid), [])
                container = names[0] if len(names) == 1 else None
        processes.append(
            GpuProcess(
                pid=process.pid,
                mem_bytes=process.mem_bytes,
                sm_pct=process.sm_pct,
                pod_uid=None if ref is None else ref.pod_uid,
                container=container,
            )
        )
    return GpuReading(
        uuid=device.uuid,
        index=device.index,
        model=device.model,
        parent_uuid=device.parent_uuid,
        mig_profile=device.mig_profile,
        sharing=mode,
        util_pct=device.util_pct,
        mem_util_pct=device.mem_util_pct,
        mem_used_bytes=device.mem_used_bytes,
        mem_total_bytes=device.mem_total_bytes,
        power_w=device.power_w,
        temp_c=device.temp_c,
        xid_errors=device.xid_errors,
        ecc_dbe=device.ecc_dbe,
        processes=tuple(processes),
        throttle_reasons=device.throttle_reasons,
        remapped_rows=device.remapped_rows,
        retired_pages_pending=device.retired_pages_pending,
        pcie_replays=device.pcie_replays,
    )
