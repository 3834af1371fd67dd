"""Claim devices to GPU uuids: ResourceSlices as the NVIDIA DRA driver writes them."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from support import dra

from producers.agent.assemble import SharingConfig, sharing_mode
from producers.base.devices import is_replicated
from producers.base.dra import DraDevice, slice_devices, table_from_slices
from producers.base.ports import DeviceAllocation, DeviceReading
from producers.podresources.claims import ClaimDevice, claim_allocations
from schemas.ids import GpuUuid, PodUid

NODE = "gpu-node-1"
DRIVER = "gpu.nvidia.com"
GPU = [f"GPU-{i:08x}-58d2-8a34-1b2c-9d0e7f6a5b4c" for i in range(4)]
MIG = "MIG-4f0c2d9a-7b61-5e3a-9c8d-2b1a0f9e8d7c"
MIG_NAME = "gpu-3-mig-1g10gb-9-0"


def gpu_device(minor: int, **extra: Any) -> dict[str, Any]:
    """A whole GPU as the driver announces it (`gpu-<minor>`, attributes, capacity)."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": GPU[minor]},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.133.20"},
            "index": {"int": minor},
            **extra,
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def mig_device() -> dict[str, Any]:
    return {
        "name": MIG_NAME,
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": MIG},
            "parentUUID": {"string": GPU[3]},
            "profile": {"string": "1g.10gb"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
        },
        "capacity": {"memory": {"value": "9984Mi"}, "multiprocessors": {"value": "16"}},
    }


def resource_slice(
    devices: list[dict[str, Any]], *, driver: str = DRIVER, name: str = "s", **kw: Any
) -> dict[str, Any]:
    return dra.resource_slice(f"{NODE}-{driver}-{name}", devices, node=NODE, driver=driver, **kw)


def test_a_slice_names_each_gpu_and_mig_device_by_uuid() -> None:
    generation, devices = slice_devices(
        resource_slice([gpu_device(0), gpu_device(1), mig_device()], generation=4)
    )
    assert generation == 4
    assert devices == [
        DraDevice(DRIVER, NODE, "gpu-0", GpuUuid(GPU[0])),
        DraDevice(DRIVER, NODE, "gpu-1", GpuUuid(GPU[1])),
        DraDevice(DRIVER, NODE, MIG_NAME, GpuUuid(MIG), "mig", "1g.10gb", GpuUuid(GPU[3])),
    ]
    assert [d.resource for d in devices] == [
        "gpu.nvidia.com/gpu",
        "gpu.nvidia.com/gpu",
        "gpu.nvidia.com/mig-1g.10gb",
    ]


def test_v1beta1_slices_and_qualified_attribute_names_are_read_alike() -> None:
    beta = resource_slice([])
    beta["apiVersion"] = "resource.k8s.io/v1beta1"
    beta["spec"]["devices"] = [
        {"name": "gpu-0", "basic": {"attributes": {f"{DRIVER}/uuid": {"string": GPU[0]}}}},
        {"name": "gpu-vfio-1", "attributes": {"type": {"string": "vfio"}}},  # no uuid
        {"attributes": {"uuid": {"string": GPU[2]}}},  # no name
    ]
    assert slice_devices(beta) == (1, [DraDevice(DRIVER, NODE, "gpu-0", GpuUuid(GPU[0]))])


def test_the_table_keeps_each_pool_at_its_newest_generation_and_wanted_drivers_only() -> None:
    old = resource_slice([gpu_device(0), gpu_device(1)], generation=1, name="old")
    new = resource_slice([gpu_device(1), mig_device()], generation=2, name="new")
    nic = resource_slice(
        [{"name": "nic-0", "attributes": {"uuid": {"string": "nic-uuid"}}}], driver="nic.example"
    )
    broken = {"spec": {"driver": DRIVER}}
    table = table_from_slices([old, nic, broken, new], {DRIVER})
    assert sorted(name for (_, _, name) in table) == ["gpu-1", MIG_NAME]


def use(pod: str, device: str, claim: str = "claim-a", container: str = "main") -> ClaimDevice:
    return ClaimDevice(
        pod_uid=PodUid(f"uid-{pod}"),
        namespace="ml",
        pod=pod,
        container=container,
        claim=f"ml/{claim}",
        driver=DRIVER,
        pool=NODE,
        device=device,
    )


def test_claim_devices_become_allocations_of_gpu_uuids() -> None:
    table = table_from_slices(
        [resource_slice([gpu_device(i) for i in range(3)] + [mig_device()])], {DRIVER}
    )
    uses = [
        use("train-0", "gpu-0", "train-0-gpus"),
        use("train-0", "gpu-1", "train-0-gpus"),
        use("mig-job", MIG_NAME, "mig"),
        use("infer-a", "gpu-2", "shared"),
        use("infer-b", "gpu-2", "shared"),
        use("late", "gpu-7", "late"),
    ]
    allocations, unknown = claim_allocations(uses, table)

    def alloc(pod: str, resource: str, claim: str, *uuids: str) -> DeviceAllocation:
        return DeviceAllocation(
            PodUid(f"uid-{pod}"), "ml", pod, "main", resource, uuids, claim=f"ml/{claim}"
        )

    assert allocations == (
        alloc("train-0", "gpu.nvidia.com/gpu", "train-0-gpus", GPU[0], GPU[1]),
        alloc("mig-job", "gpu.nvidia.com/mig-1g.10gb", "mig", MIG),
        alloc("infer-a", "gpu.nvidia.com/gpu", "shared", GPU[2]),
        alloc("infer-b", "gpu.nvidia.com/gpu", "shared", GPU[2]),
    )
    assert unknown == (use("late", "gpu-7", "late"),)
    # The shared claim's GPU is shared; a claim's GPUs held by one pod are not.
    assert is_replicated(allocations) == {GPU[2]}


def reading(uuid: str, *, mps: bool = False) -> DeviceReading:
    return DeviceReading(
        uuid=GpuUuid(uuid),
        index=0,
        model="NVIDIA H100 80GB HBM3",
        parent_uuid=None,
        mig_profile=None,
        mig_enabled=False,
        util_pct=50.0,
        mem_util_pct=10.0,
        mem_used_bytes=1,
        mem_total_bytes=2,
        power_w=None,
        temp_c=None,
        xid_errors=(),
        ecc_dbe=None,
        processes=(),
        mps=mps,
    )


def test_a_shared_claim_is_time_slicing_unless_mps_clients_show() -> None:
    shared = {GpuUuid(GPU[2])}
    assert sharing_mode(reading(GPU[2]), shared, SharingConfig()) == "time-slicing"
    assert sharing_mode(reading(GPU[2], mps=True), shared, SharingConfig()) == "mps"
    assert sharing_mode(reading(GPU[0]), shared, SharingConfig()) == "exclusive"


@st.composite
def republished_pools(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Slices of one pool over several generations, each generation's devices drawn; and
    the newest generation's device -> uuid."""
    generations = draw(st.integers(1, 4))
    slices: list[dict[str, Any]] = []
    newest: dict[str, str] = {}
    for generation in range(1, generations + 1):
        minors = draw(st.sets(st.integers(0, 3), min_size=1))
        # Each generation may split its devices over several slices.
        parts = draw(st.integers(1, len(minors)))
        ordered = sorted(minors)
        for part in range(parts):
            chunk = ordered[part::parts]
            slices.append(
                resource_slice(
                    [gpu_device(m) for m in chunk],
                    generation=generation,
                    name=f"g{generation}-{part}",
                )
            )
        if generation == generations:
            newest = {f"gpu-{m}": GPU[m] for m in minors}
    return slices, newest


@given(republished_pools(), st.randoms(use_true_random=False))
def test_the_table_is_the_newest_generation_in_any_listing_order(
    pool: tuple[list[dict[str, Any]], dict[str, str]], rng: random.Random
) -> None:
    slices, newest = pool
    rng.shuffle(slices)
    table = table_from_slices(slices, {DRIVER})
    assert {name: str(d.uuid) for (_, _, name), d in table.items()} == newest
