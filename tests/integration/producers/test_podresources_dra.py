"""DRA-allocated GPUs through the agent's gRPC path: the kubelet lists claim devices under
`dynamic_resources`, the node's ResourceSlices name their GPUs."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest
from support.kubelet import FakeKubelet, Serve, claim, devices, pod

from producers.base.devices import is_replicated
from producers.base.dra import DeviceKey, DraDevice
from producers.base.ports import DeviceAllocation
from producers.podresources.client import KubeletAllocationSource
from producers.podresources.poduids import PodLogUids
from producers.podresources.proto import api_pb2 as pb
from schemas.ids import GpuUuid, PodUid

NODE = "gpu-node-1"
DRIVER = "gpu.nvidia.com"
GPU = [f"GPU-{i:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b" for i in range(4)]
MIG = "MIG-4f0c2d9a-7b61-5e3a-9c8d-2b1a0f9e8d7c"
MIG_NAME = "gpu-3-mig-1g10gb-9-0"
UIDS = {
    "train-0": "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b",
    "infer-a": "11111111-2222-4333-8444-555555555555",
    "infer-b": "66666666-7777-4888-9999-000000000000",
    "mig-job": "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
    "plugin-pod": "12345678-9abc-4def-8123-456789abcdef",
}
SLICES = {
    (DRIVER, NODE, f"gpu-{i}"): DraDevice(DRIVER, NODE, f"gpu-{i}", GpuUuid(GPU[i]))
    for i in range(3)
} | {
    (DRIVER, NODE, MIG_NAME): DraDevice(
        DRIVER, NODE, MIG_NAME, GpuUuid(MIG), "mig", "1g.10gb", GpuUuid(GPU[3])
    )
}

NODE_PODS = pb.ListPodResourcesResponse(
    pod_resources=[
        pod(
            "ml",
            "train-0",
            pb.ContainerResources(
                name="trainer",
                dynamic_resources=[claim("ml", "train-0-gpus-x7k2p", DRIVER, NODE, "gpu-0")],
            ),
            pb.ContainerResources(name="sidecar", cpu_ids=[1]),
        ),
        pod(  # one claim shared by two pods: both use gpu-1
            "ml",
            "infer-a",
            pb.ContainerResources(
                name="server", dynamic_resources=[claim("ml", "shared-gpu", DRIVER, NODE, "gpu-1")]
            ),
        ),
        pod(
            "ml",
            "infer-b",
            pb.ContainerResources(
                name="server", dynamic_resources=[claim("ml", "shared-gpu", DRIVER, NODE, "gpu-1")]
            ),
        ),
        pod(
            "ml",
            "mig-job",
            pb.ContainerResources(
                name="worker",
                dynamic_resources=[
                    claim("ml", "mig-job-mig", DRIVER, NODE, MIG_NAME),
                    claim("ml", "mig-job-nic", "nic.example.com", NODE, "eth1"),  # not a GPU
                    claim("ml", "mig-job-late", DRIVER, NODE, "gpu-9"),  # in no slice yet
                ],
            ),
        ),
        pod(  # a device plugin's GPU on the same node
            "ml",
            "plugin-pod",
            pb.ContainerResources(name="main", devices=[devices("nvidia.com/gpu", GPU[2])]),
        ),
    ]
)


class Slices:
    """This node's ResourceSlices, counting the lookups."""

    def __init__(self) -> None:
        self.asked: list[set[DeviceKey]] = []

    def find(self, keys: Collection[DeviceKey]) -> Mapping[DeviceKey, DraDevice]:
        self.asked.append(set(keys))
        return {k: SLICES[k] for k in keys if k in SLICES}


@pytest.fixture
def log_root(tmp_path: Path) -> Path:
    for name, uid in UIDS.items():
        (tmp_path / f"ml_{name}_{uid}").mkdir()
    return tmp_path


def alloc(
    name: str, container: str, resource: str, *ids: str, claim: str | None
) -> DeviceAllocation:
    return DeviceAllocation(PodUid(UIDS[name]), "ml", name, container, resource, ids, claim=claim)


def test_claim_devices_are_listed_as_allocations_of_their_gpus(
    serve: Serve, sock: Path, log_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    serve(FakeKubelet(NODE_PODS))
    slices = Slices()
    caplog.set_level(logging.INFO, logger="producers.podresources.client")
    with KubeletAllocationSource(
        sock, timeout_s=1.0, pod_uids=PodLogUids(log_root), devices=slices
    ) as source:
        allocations = source.list_allocations()
        assert allocations == (
            alloc("plugin-pod", "main", "nvidia.com/gpu", GPU[2], claim=None),
            alloc(
                "train-0", "trainer", "gpu.nvidia.com/gpu", GPU[0], claim="ml/train-0-gpus-x7k2p"
            ),
            alloc("infer-a", "server", "gpu.nvidia.com/gpu", GPU[1], claim="ml/shared-gpu"),
            alloc("infer-b", "server", "gpu.nvidia.com/gpu", GPU[1], claim="ml/shared-gpu"),
            alloc("mig-job", "worker", "gpu.nvidia.com/mig-1g.10gb", MIG, claim="ml/mig-job-mig"),
        )
        assert is_replicated(allocations) == {GPU[1]}
        # The NIC claim is not asked for; the unknown GPU is counted and warned about once.
        assert slices.asked[0] == {
            (DRIVER, NODE, "gpu-0"),
            (DRIVER, NODE, "gpu-1"),
            (DRIVER, NODE, MIG_NAME),
            (DRIVER, NODE, "gpu-9"),
        }
        assert source.unmapped_devices == 1
        source.list_allocations()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "claim=ml/mig-job-late" in warnings[0]
        assert "device=gpu-9" in warnings[0]


def test_without_a_device_table_claims_are_left_out(
    serve: Serve, sock: Path, log_root: Path
) -> None:
    serve(FakeKubelet(NODE_PODS))
    with KubeletAllocationSource(sock, timeout_s=1.0, pod_uids=PodLogUids(log_root)) as source:
        assert source.list_allocations() == (
            alloc("plugin-pod", "main", "nvidia.com/gpu", GPU[2], claim=None),
        )
