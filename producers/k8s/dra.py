"""The GPUs of DRA drivers, counted per node from the cluster's ResourceSlices.

A node whose GPUs the NVIDIA DRA driver hands out advertises none in its allocatable:
its devices are in ResourceSlices (`spec.nodeName`, `spec.pool`). The watcher counts
them by the resource name the node agents give their allocations
(`DraDevice.resource`: `gpu.nvidia.com/gpu`, `gpu.nvidia.com/mig-1g.10gb`), so that
capacity and allocations meet under the same names. Of a pool only the slices of its
newest generation count: a driver republishing a pool writes the new generation before
it deletes the old one, and the scheduler ignores the stale slices too.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, TypedDict

import msgspec

from producers.base.dra import MalformedSlice, slice_devices
from producers.k8s.objects import MalformedObject, ObjectMeta, Page, decode_list
from schemas.fields import K8sEventType

__all__ = [
    "DRA_GROUP",
    "DRA_VERSIONS",
    "SLICE_DECODER",
    "DraInventory",
    "ResourceSlice",
    "SliceDevices",
    "decode_slice_list",
    "merge_counts",
    "observe_slice",
    "slice_key",
]

DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
"""The ResourceSlice versions read, the preferred first (v1: Kubernetes 1.34, DRA GA);
`slice_devices` reads v1's device shape and v1beta1's (attributes under `basic`)."""


class ResourceSlice(TypedDict, total=False):
    """A ResourceSlice: its spec is read by `slice_devices` (its shape varies by version)."""

    metadata: ObjectMeta | None
    spec: dict[str, Any] | None


SLICE_DECODER = msgspec.json.Decoder(ResourceSlice)


def decode_slice_list(raw: bytes) -> Page[ResourceSlice]:
    """A ResourceSliceList body; MalformedObject when it does not have the shape of one."""
    return decode_list(raw, SLICE_DECODER, "ResourceSliceList")


def slice_key(obj: ResourceSlice) -> str:
    """A slice's key: its name (ResourceSlices are cluster-scoped)."""
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        raise MalformedObject("ResourceSlice without metadata.name")
    return name


class SliceDevices(msgspec.Struct, frozen=True, kw_only=True):
    """What one ResourceSlice contributes to its node: device counts per resource name.

    Never published to a topic: the slice watch hands these to `DraInventory`; `type` and
    `ts` are there because the watch loop stamps every value it passes on.
    """

    type: K8sEventType = "ADDED"
    ts: int = 0
    slice: str
    node: str
    driver: str
    pool: str
    generation: int
    devices: dict[str, int]
    """Devices with a GPU uuid, per resource name (`gpu.nvidia.com/gpu`: 4)."""


def observe_slice(obj: ResourceSlice) -> SliceDevices:
    """The devices of one slice, counted; MalformedObject without name, driver or pool."""
    name = slice_key(obj)
    spec = obj.get("spec") or {}
    try:
        generation, devices = slice_devices(obj)
    except MalformedSlice as exc:
        raise MalformedObject(f"ResourceSlice {name}: {exc}") from exc
    counts: dict[str, int] = {}
    for device in devices:
        counts[device.resource] = counts.get(device.resource, 0) + 1
    node = spec.get("nodeName")
    return SliceDevices(
        slice=name,
        node=node if isinstance(node, str) else "",
        driver=str(spec.get("driver")),
        pool=str((spec.get("pool") or {}).get("name")),
        generation=generation,
        devices=dict(sorted(counts.items())),
    )


def merge_counts(plugin: Mapping[str, int], dra: Mapping[str, int]) -> dict[str, int]:
    """A node's GPU counts: the device plugin's, plus the DRA devices of resource names
    the device plugin does not report (its count of a name wins)."""
    return {**plugin, **{name: n for name, n in dra.items() if name not in plugin}}


class DraInventory:
    """The DRA devices of every node, from the slices seen so far (thread-safe: the slice
    watch writes, the node watch reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[str, SliceDevices] = {}
        self._by_node: dict[str, set[str]] = {}
        self._by_pool: dict[tuple[str, str], set[str]] = {}

    def counts(self, node: str) -> dict[str, int]:
        """The node's devices per resource name (the newest generation of each pool)."""
        with self._lock:
            return self._counts(node)

    def apply(self, value: SliceDevices) -> set[str]:
        """A slice added, changed (any type but DELETED) or deleted; the nodes whose counts
        this changed (a pool's new generation may change the nodes of its old slices)."""
        with self._lock:
            old = self._slices.get(value.slice)
            pools = {(v.driver, v.pool) for v in (old, value) if v is not None}
            nodes = {v.node for v in (old, value) if v is not None and v.node}
            for pool in pools:
                nodes |= {self._slices[s].node for s in self._by_pool.get(pool, ())}
            nodes.discard("")
            before = {node: self._counts(node) for node in nodes}
            if old is not None:
                self._remove(old)
            if value.type != "DELETED":
                self._add(value)
            return {node for node in nodes if self._counts(node) != before[node]}

    def _counts(self, node: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name in sorted(self._by_node.get(node, ())):
            value = self._slices[name]
            if value.generation < self._newest((value.driver, value.pool)):
                continue
            for resource, n in value.devices.items():
                counts[resource] = counts.get(resource, 0) + n
        return dict(sorted(counts.items()))

    def _newest(self, pool: tuple[str, str]) -> int:
        return max(self._slices[name].generation for name in self._by_pool[pool])

    def _add(self, value: SliceDevices) -> None:
        self._slices[value.slice] = value
        if value.node:
            self._by_node.setdefault(value.node, set()).add(value.slice)
        self._by_pool.setdefault((value.driver, value.pool), set()).add(value.slice)

    def _remove(self, value: SliceDevices) -> None:
        del self._slices[value.slice]
        if value.node:
            _discard(self._by_node, value.node, value.slice)
        _discard(self._by_pool, (value.driver, value.pool), value.slice)


def _discard(index: dict[Any, set[str]], key: Any, name: str) -> None:
    """`name` out of `index[key]`, and the key out of `index` once its set is empty."""
    names = index.get(key)
    if names is not None:
        names.discard(name)
        if not names:
            del index[key]
