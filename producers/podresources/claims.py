"""The kubelet's claim devices (Dynamic Resource Allocation) to allocations of GPU uuids.

The kubelet lists a DRA-allocated device under a container's `dynamic_resources` by
its claim, driver, pool and device name, never by GPU uuid; a table of the node's
ResourceSlices (`producers.base.dra`) names the GPU behind each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from producers.base.dra import DeviceKey, DraDevice
from producers.base.ports import DeviceAllocation
from schemas.ids import GpuUuid, PodUid

__all__ = ["ClaimDevice", "claim_allocations"]


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device of a ResourceClaim a container uses, as the kubelet lists it."""

    pod_uid: PodUid
    namespace: str
    pod: str
    container: str
    claim: str
    """`namespace/name` of the ResourceClaim; one claim may be shared by several pods."""
    driver: str
    pool: str
    device: str

    @property
    def key(self) -> DeviceKey:
        """The device's (driver, pool, name)."""
        return (self.driver, self.pool, self.device)


def claim_allocations(
    uses: Iterable[ClaimDevice], devices: Mapping[DeviceKey, DraDevice]
) -> tuple[tuple[DeviceAllocation, ...], tuple[ClaimDevice, ...]]:
    """The allocations behind the kubelet's claim devices, and the devices not in `devices`.

    One allocation per container, claim and resource, devices in the kubelet's order;
    each device id is the GPU (or MIG) uuid, so the rest of the pipeline treats a
    DRA-allocated pod like a device-plugin one.
    """
    grouped: dict[tuple[PodUid, str, str, str], tuple[ClaimDevice, list[GpuUuid]]] = {}
    unknown: list[ClaimDevice] = []
    for use in uses:
        device = devices.get(use.key)
        if device is None:
            unknown.append(use)
            continue
        group = (use.pod_uid, use.container, use.claim, device.resource)
        entry = grouped.setdefault(group, (use, []))
        if device.uuid not in entry[1]:
            entry[1].append(device.uuid)
    allocations = tuple(
        DeviceAllocation(
            pod_uid=use.pod_uid,
            namespace=use.namespace,
            pod=use.pod,
            container=use.container,
            resource=resource,
            device_ids=tuple(uuids),
            claim=use.claim,
        )
        for (_, _, _, resource), (use, uuids) in grouped.items()
    )
    return allocations, tuple(unknown)
