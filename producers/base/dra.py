"""GPUs of Dynamic Resource Allocation drivers, as the ResourceSlices describe them.

The kubelet lists a DRA-allocated device by its claim, driver, pool and device name
(`gpu.nvidia.com`, pool `node-1`, `gpu-3`), never by GPU uuid. The driver publishes each
device's attributes in the node's ResourceSlices: the NVIDIA DRA driver
(k8s-dra-driver-gpu, `deviceinfo.go`) names a whole GPU `gpu-<minor>` with attributes
`type: gpu`, `uuid`, `productName`..., and a MIG device with `type: mig`, `uuid` (the MIG
uuid), `parentUUID` and `profile` (`1g.10gb`). This module reads slices into devices with
their GPU uuids: the node agent's table of them (`producers.agent.slices`) turns the
kubelet's claim devices into allocations (`producers.podresources.claims`), and the
watcher counts them per node (`producers.k8s.dra`).

An allocation made this way names its resource `<driver>/<type>`: `gpu.nvidia.com/gpu`,
or `gpu.nvidia.com/mig-1g.10gb` for a MIG device, as the device plugin names its MIG
resources. A per-device name (`gpu.nvidia.com/gpu-3`) would make every GPU a resource
of its own in capacity, alerts and dashboards.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.ids import GpuUuid

__all__ = [
    "DEFAULT_DRA_DRIVERS",
    "DeviceKey",
    "DeviceLookup",
    "DraDevice",
    "MalformedSlice",
    "slice_devices",
    "table_from_slices",
]

DEFAULT_DRA_DRIVERS = ("gpu.nvidia.com",)
"""DRA drivers whose devices are GPUs: the NVIDIA DRA driver's GPU and MIG devices."""

DeviceKey = tuple[str, str, str]
"""(driver, pool, device name): how the kubelet and a ResourceSlice both name a device."""


@dataclass(frozen=True, slots=True)
class DraDevice:
    """A device of a ResourceSlice, with the attributes that name its GPU."""

    driver: str
    pool: str
    name: str
    uuid: GpuUuid
    """The NVML uuid: `GPU-…` for a whole GPU, `MIG-…` for a MIG device."""
    type: str = "gpu"
    """The driver's `type` attribute: `gpu`, `mig` (`vfio` devices have no NVML uuid)."""
    profile: str | None = None
    """MIG profile such as `1g.10gb`; None for a whole GPU."""
    parent_uuid: GpuUuid | None = None

    @property
    def key(self) -> DeviceKey:
        """(driver, pool, name)."""
        return (self.driver, self.pool, self.name)

    @property
    def resource(self) -> str:
        """The resource name allocations of this device carry: `<driver>/<type>`, a MIG
        device's with its profile (`gpu.nvidia.com/mig-1g.10gb`)."""
        if self.type == "mig" and self.profile:
            return f"{self.driver}/mig-{self.profile}"
        return f"{self.driver}/{self.type}"


class DeviceLookup(Protocol):
    """The devices of this node's ResourceSlices, by (driver, pool, name)."""

    def find(self, keys: Collection[DeviceKey]) -> Mapping[DeviceKey, DraDevice]:
        """Those of `keys` that are known; may re-read its source for unknown ones."""
        ...


class MalformedSlice(ValueError):  # noqa: N818 - named for what it describes, as MalformedObject
    """A ResourceSlice without the fields every slice has (driver, pool)."""


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> Any:
    """An attribute's value, named plainly (`uuid`) or qualified by the driver's domain
    (`gpu.nvidia.com/uuid`): both mean the same attribute. None when absent."""
    entry = attributes.get(name)
    if entry is None:
        entry = attributes.get(f"{driver}/{name}")
    if not isinstance(entry, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in entry:
            return entry[kind]
    return None


def slice_devices(obj: Mapping[str, Any]) -> tuple[int, list[DraDevice]]:
    """The pool generation of one ResourceSlice and its devices that have a GPU uuid.

    Reads `resource.k8s.io/v1` (attributes on the device) and `v1beta1` (under `basic`).
    Devices without a `uuid` attribute (a vfio device, another driver's) are left out.
    MalformedSlice when the slice has no driver or pool.
    """
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise MalformedSlice("ResourceSlice without spec")
    driver = spec.get("driver")
    pool = spec.get("pool")
    if not isinstance(driver, str) or not isinstance(pool, Mapping):
        raise MalformedSlice("ResourceSlice without spec.driver or spec.pool")
    pool_name = pool.get("name")
    if not isinstance(pool_name, str):
        raise MalformedSlice("ResourceSlice without spec.pool.name")
    generation = pool.get("generation")
    devices: list[DraDevice] = []
    for device in spec.get("devices") or ():
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            continue
        basic = device.get("basic")
        attributes = device.get("attributes")
        if attributes is None and isinstance(basic, Mapping):
            attributes = basic.get("attributes")
        if not isinstance(attributes, Mapping):
            continue
        uuid = _attribute(attributes, driver, "uuid")
        if not isinstance(uuid, str) or not uuid:
            continue
        kind = _attribute(attributes, driver, "type")
        profile = _attribute(attributes, driver, "profile")
        parent = _attribute(attributes, driver, "parentUUID")
        devices.append(
            DraDevice(
                driver=driver,
                pool=pool_name,
                name=device["name"],
                uuid=GpuUuid(uuid),
                type=kind if isinstance(kind, str) and kind else "gpu",
                profile=profile if isinstance(profile, str) and profile else None,
                parent_uuid=GpuUuid(parent) if isinstance(parent, str) and parent else None,
            )
        )
    return (generation if isinstance(generation, int) else 0), devices


def table_from_slices(
    slices: Iterable[Mapping[str, Any]], drivers: Collection[str]
) -> dict[DeviceKey, DraDevice]:
    """The devices of `drivers` in `slices`, each pool at its newest generation only.

    A driver republishing a pool writes the new generation's slices before it deletes
    the old ones; while both exist, the old ones are stale (the scheduler ignores them
    too). Malformed slices are skipped.
    """
    newest: dict[tuple[str, str], int] = {}
    parsed: list[tuple[int, list[DraDevice]]] = []
    for obj in slices:
        spec = obj.get("spec")
        if not isinstance(spec, Mapping) or spec.get("driver") not in drivers:
            continue
        try:
            generation, devices = slice_devices(obj)
        except MalformedSlice:
            continue
        parsed.append((generation, devices))
        pool = (spec["driver"], spec["pool"]["name"])
        newest[pool] = max(newest.get(pool, generation), generation)
    table: dict[DeviceKey, DraDevice] = {}
    for generation, devices in parsed:
        for device in devices:
            if newest[(device.driver, device.pool)] == generation:
                table[device.key] = device
    return table
