"""Device ids as device plugins write them: replica suffixes and MIG ids."""

from __future__ import annotations

from collections.abc import Iterable

from producers.base.ports import DeviceAllocation
from schemas.ids import GpuUuid, PodUid

__all__ = ["is_replicated", "normalise_device_id"]

# The NVIDIA k8s-device-plugin (internal/rm/devices.go, `NewAnnotatedID`) advertises
# each time-slicing or MPS replica of a device as fmt.Sprintf("%s::%d", id, replica),
# e.g. `GPU-8f3c...::3`, whether or not `renameByDefault` renames the resource to
# `nvidia.com/gpu.shared`; `AnnotatedID.Split` cuts at the first "::". MIG devices
# can be replicated the same way (`MIG-...::1`). dcgm-exporter's pod mapper
# (internal/pkg/transformation/kubernetes.go) splits on "::" likewise.
REPLICA_SEPARATOR = "::"


def normalise_device_id(device_id: str) -> tuple[GpuUuid, int | None]:
    """The device uuid behind a plugin device id, and its replica number if it has one.

    `GPU-8f3c...::3` -> (`GPU-8f3c...`, 3); `GPU-8f3c...` -> (itself, None);
    MIG ids, the current `MIG-<uuid>` and the pre-R470 `MIG-GPU-<uuid>/<gi>/<ci>`,
    are NVML device uuids already and stay as they are. A suffix that is not a
    number is not a replica annotation: the id is returned whole.

    Not mappable here: plugins run with `deviceIDStrategy: index` (ids `0`, `0::1`,
    MIG `0:1`) and GKE's plugin (`nvidia0`, `nvidia0/vgpu2`) name devices by index,
    which only a table of this node's devices can turn into uuids.
    """
    base, separator, replica = device_id.partition(REPLICA_SEPARATOR)
    if separator and replica.isdecimal() and base:
        return GpuUuid(base), int(replica)
    return GpuUuid(device_id), None


def is_replicated(allocations: Iterable[DeviceAllocation]) -> set[GpuUuid]:
    """Devices allocated as replicas, or through claims to more than one pod (a shared
    ResourceClaim: time-slicing or MPS by the claim's configuration): the agent marks
    these `sharing: time-slicing` unless it sees MPS or is told otherwise."""
    shared: set[GpuUuid] = set()
    claimed_by: dict[GpuUuid, PodUid] = {}
    for allocation in allocations:
        for device_id in allocation.device_ids:
            uuid, replica = normalise_device_id(device_id)
            if replica is not None or (
                allocation.claim is not None
                and claimed_by.setdefault(uuid, allocation.pod_uid) != allocation.pod_uid
            ):
                shared.add(uuid)
    return shared
