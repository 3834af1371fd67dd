"""A DRA node's GPUs counted from ResourceSlices (v1 and v1beta1 shapes, MIG devices,
pool generations, other drivers) and added to its GPU capacity and allocatable."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from support import dra

from producers.k8s.dra import (
    DraInventory,
    SliceDevices,
    decode_slice_list,
    merge_counts,
    observe_slice,
)
from producers.k8s.kinds import NodeKind, SliceKind
from producers.k8s.normalise import NodeRules
from producers.k8s.objects import MalformedObject, Node
from producers.k8s.selection import GpuResources, NodeSelection
from schemas.settings import WatcherSettings

DRIVER = "gpu.nvidia.com"
DEFAULTS = WatcherSettings()
GPUS = GpuResources.of(DEFAULTS.gpu_resources, DEFAULTS.gpu_resource_prefixes)


def gpu_v1(minor: int) -> dict[str, Any]:
    """A whole GPU as the NVIDIA DRA driver publishes it in resource.k8s.io/v1."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{minor:08x}-aaaa-4bbb-8ccc-0123456789ab"},
            "index": {"int": minor},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def mig_v1beta1(name: str, profile: str, parent: int) -> dict[str, Any]:
    """A MIG device in resource.k8s.io/v1beta1 (attributes under `basic`), its attribute
    names qualified by the driver's domain."""
    return {
        "name": name,
        "basic": {
            "attributes": {
                f"{DRIVER}/type": {"string": "mig"},
                f"{DRIVER}/uuid": {"string": f"MIG-{name}"},
                f"{DRIVER}/parentUUID": {"string": f"GPU-{parent:08x}"},
                f"{DRIVER}/profile": {"string": profile},
            },
        },
    }


def resource_slice(
    name: str, devices: list[dict[str, Any]], *, node: str | None = "dra-0", **kw: Any
) -> dict[str, Any]:
    """A slice of dra-0's pool unless told, as listed (with a resourceVersion)."""
    kw.setdefault("pool", "dra-0")
    return dra.resource_slice(name, devices, node=node, resource_version="7", **kw)


def decoded(*objects: dict[str, Any]) -> list[Any]:
    """Slices as the watcher decodes them from a list body."""
    body = {"kind": "ResourceSliceList", "metadata": {"resourceVersion": "9"}, "items": objects}
    return decode_slice_list(msgspec.json.encode(body)).items


def counted(obj: dict[str, Any]) -> SliceDevices:
    return observe_slice(decoded(obj)[0])


def test_a_v1_slice_of_four_gpus_counts_four_under_the_drivers_gpu_resource() -> None:
    value = counted(resource_slice("dra-0-gpu", [gpu_v1(i) for i in range(4)]))
    assert value.devices == {"gpu.nvidia.com/gpu": 4}
    assert (value.slice, value.node, value.driver, value.pool, value.generation) == (
        "dra-0-gpu",
        "dra-0",
        DRIVER,
        "dra-0",
        1,
    )


def test_a_v1beta1_slice_counts_mig_devices_by_profile_and_skips_devices_without_uuid() -> None:
    devices = [
        mig_v1beta1("gpu-0-mig-1g10gb-0", "1g.10gb", 0),
        mig_v1beta1("gpu-0-mig-1g10gb-1", "1g.10gb", 0),
        mig_v1beta1("gpu-0-mig-3g40gb-0", "3g.40gb", 0),
        {"name": "gpu-1", "basic": {"attributes": {"type": {"string": "gpu"}}}},  # no uuid
        {"name": "vfio-2", "basic": {"attributes": {"type": {"string": "vfio"}}}},
    ]
    value = counted(resource_slice("dra-0-mig", devices, version="v1beta1"))
    assert value.devices == {"gpu.nvidia.com/mig-1g.10gb": 2, "gpu.nvidia.com/mig-3g.40gb": 1}


def test_a_slice_without_pool_is_unusable() -> None:
    obj = resource_slice("broken", [gpu_v1(0)])
    del obj["spec"]["pool"]
    with pytest.raises(MalformedObject, match="broken"):
        counted(obj)


def test_only_slices_of_the_gpu_drivers_that_name_a_node_are_wanted() -> None:
    kind = SliceKind((DRIVER,))
    mine, nic, shared = decoded(
        resource_slice("dra-0-gpu", [gpu_v1(0)]),
        resource_slice("dra-0-nic", [gpu_v1(0)], driver="nic.example.com"),
        resource_slice("fabric", [gpu_v1(0)], node=None),
    )
    assert [kind.wanted(s) for s in (mine, nic, shared)] == [True, False, False]
    assert kind.key(mine) == "dra-0-gpu"


def test_the_newest_generation_of_a_pool_counts_alone() -> None:
    inventory = DraInventory()
    old = counted(resource_slice("dra-0-g1", [gpu_v1(i) for i in range(4)], generation=1))
    new = counted(resource_slice("dra-0-g2", [gpu_v1(i) for i in range(2)], generation=2))
    assert inventory.apply(old) == {"dra-0"}
    assert inventory.counts("dra-0") == {"gpu.nvidia.com/gpu": 4}
    # The driver writes the new generation first: the old slice is stale at once.
    assert inventory.apply(new) == {"dra-0"}
    assert inventory.counts("dra-0") == {"gpu.nvidia.com/gpu": 2}
    # Then it deletes the old one: nothing changes.
    assert inventory.apply(msgspec.structs.replace(old, type="DELETED")) == set()
    assert inventory.counts("dra-0") == {"gpu.nvidia.com/gpu": 2}
    assert inventory.apply(msgspec.structs.replace(new, type="DELETED")) == {"dra-0"}
    assert inventory.counts("dra-0") == {}


def test_slices_of_one_node_add_up_and_other_nodes_keep_their_own() -> None:
    inventory = DraInventory()
    inventory.apply(counted(resource_slice("dra-0-a", [gpu_v1(0), gpu_v1(1)])))
    inventory.apply(
        counted(resource_slice("dra-0-b", [mig_v1beta1("m-0", "1g.10gb", 2)], version="v1beta1"))
    )
    moved = counted(resource_slice("dra-1-a", [gpu_v1(0)], node="dra-1", pool="dra-1"))
    assert inventory.apply(moved) == {"dra-1"}
    assert inventory.counts("dra-0") == {"gpu.nvidia.com/gpu": 2, "gpu.nvidia.com/mig-1g.10gb": 1}
    assert inventory.counts("dra-1") == {"gpu.nvidia.com/gpu": 1}
    # The same content again (a resync) changes no node.
    assert inventory.apply(msgspec.structs.replace(moved, type="RESYNC")) == set()


def node(name: str, resources: dict[str, str] | None = None) -> Node:
    body = {
        "metadata": {"name": name, "resourceVersion": "3"},
        "status": {"capacity": resources or {}, "allocatable": resources or {}},
    }
    return msgspec.convert(body, Node)


def test_a_node_with_dra_devices_is_a_gpu_node_with_them_in_capacity_and_allocatable() -> None:
    inventory = DraInventory()
    kind = NodeKind(NodeRules(GPUS, ()), NodeSelection(GPUS), inventory)
    plain = node("dra-0")
    assert not kind.wanted(plain)
    inventory.apply(counted(resource_slice("dra-0-gpu", [gpu_v1(i) for i in range(4)])))
    assert kind.wanted(plain)
    value = kind.observe(plain).value
    assert value.gpu_allocatable == {"gpu.nvidia.com/gpu": 4}
    assert value.gpu_capacity == {"gpu.nvidia.com/gpu": 4}
    # A device the driver adds is told without an event of the node's own.
    inventory.apply(counted(resource_slice("dra-0-gpu", [gpu_v1(i) for i in range(5)])))
    again = kind.reobserve("dra-0")
    assert again is not None
    assert again.value.gpu_allocatable == {"gpu.nvidia.com/gpu": 5}
    kind.forget("dra-0")
    assert kind.reobserve("dra-0") is None


def test_the_device_plugins_count_of_a_resource_name_wins() -> None:
    assert merge_counts(
        {"nvidia.com/gpu": 8, "gpu.nvidia.com/gpu": 2}, {"gpu.nvidia.com/gpu": 4}
    ) == {"nvidia.com/gpu": 8, "gpu.nvidia.com/gpu": 2}
    inventory = DraInventory()
    inventory.apply(counted(resource_slice("h100-0-gpu", [gpu_v1(0)], node="h100-0")))
    kind = NodeKind(NodeRules(GPUS, ()), NodeSelection(GPUS), inventory)
    value = kind.observe(node("h100-0", {"nvidia.com/gpu": "8", "cpu": "64"})).value
    assert value.gpu_allocatable == {"nvidia.com/gpu": 8, "gpu.nvidia.com/gpu": 1}


def test_without_an_inventory_a_node_is_what_its_status_says() -> None:
    kind = NodeKind(NodeRules(GPUS, ()), NodeSelection(GPUS))
    assert not kind.wanted(node("cpu-0"))
    assert kind.observe(node("g-0", {"nvidia.com/gpu": "2"})).value.gpu_allocatable == {
        "nvidia.com/gpu": 2
    }
    assert kind.reobserve("g-0") is None
