"""Device-id normalisation, replica detection and the GPU resource filter."""

from __future__ import annotations

import pytest

from producers.base.devices import is_replicated, normalise_device_id
from producers.base.ports import DeviceAllocation
from producers.base.resources import ResourceFilter
from schemas.ids import PodUid

GPU_A = "GPU-8f3c6a1e-58d2-8a34-1b2c-9d0e7f6a5b4c"
GPU_B = "GPU-1c2d3e4f-5a6b-7c8d-9e0f-a1b2c3d4e5f6"
MIG = "MIG-4f0c2d9a-7b61-5e3a-9c8d-2b1a0f9e8d7c"
LEGACY_MIG = f"MIG-{GPU_A}/7/0"


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (GPU_A, (GPU_A, None)),
        (f"{GPU_A}::0", (GPU_A, 0)),
        (f"{GPU_A}::3", (GPU_A, 3)),
        (f"{GPU_A}::15", (GPU_A, 15)),
        (MIG, (MIG, None)),
        (f"{MIG}::1", (MIG, 1)),
        (LEGACY_MIG, (LEGACY_MIG, None)),
        (f"{GPU_A}::x", (f"{GPU_A}::x", None)),  # not a replica annotation
        (f"{GPU_A}::", (f"{GPU_A}::", None)),
        ("::2", ("::2", None)),
    ],
)
def test_normalise_device_id(device_id: str, expected: tuple[str, int | None]) -> None:
    assert normalise_device_id(device_id) == expected


def allocation(pod: str, *device_ids: str, resource: str = "nvidia.com/gpu") -> DeviceAllocation:
    """One container's allocation."""
    return DeviceAllocation(PodUid(f"uid-{pod}"), "ml", pod, "main", resource, device_ids)


def test_is_replicated_names_the_gpus_handed_out_as_replicas() -> None:
    allocations = [
        allocation("a", f"{GPU_A}::0"),
        allocation("b", f"{GPU_A}::2"),
        allocation("c", GPU_B),
        allocation("d", MIG, resource="nvidia.com/mig-1g.10gb"),
    ]
    assert is_replicated(allocations) == {GPU_A}


def test_is_replicated_counts_a_single_replica_too() -> None:
    # one pod holding one replica still shares the GPU with whoever gets the others
    assert is_replicated([allocation("a", f"{GPU_B}::1")]) == {GPU_B}
    assert is_replicated([]) == set()


@pytest.mark.parametrize(
    ("resource", "wanted"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("nvidia.com/mig-3g.40gb", True),
        ("nvidia.com/gpu-extra", False),
        ("intel.com/sriov_netdevice", False),
        ("amd.com/gpu", False),
        ("", False),
    ],
)
def test_resource_filter(resource: str, wanted: bool) -> None:
    gpus = ResourceFilter.of(("nvidia.com/gpu", "nvidia.com/gpu.shared"), ("nvidia.com/mig-",))
    assert gpus(resource) is wanted


def test_resource_filter_without_prefixes_matches_names_only() -> None:
    only_gpu = ResourceFilter.of(("nvidia.com/gpu",), ())
    assert only_gpu("nvidia.com/gpu")
    assert not only_gpu("nvidia.com/mig-1g.10gb")
