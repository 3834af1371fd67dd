"""KubeletAllocationSource against a real gRPC server speaking our PodResources v1 proto."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.kubelet import FakeKubelet, Serve, devices, pod

from producers.base.devices import is_replicated
from producers.base.ports import DeviceAllocation
from producers.podresources.client import KubeletAllocationSource
from producers.podresources.poduids import PodLogUids
from producers.podresources.proto import api_pb2
from schemas.ids import PodUid

pb = api_pb2

GPU_0 = "GPU-8f3c6a1e-58d2-8a34-1b2c-9d0e7f6a5b4c"
GPU_1 = "GPU-1c2d3e4f-5a6b-7c8d-9e0f-a1b2c3d4e5f6"
GPU_2 = "GPU-77aa1b2c-3d4e-5f60-7182-93a4b5c6d7e8"
GPU_3 = "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
MIG_0 = "MIG-4f0c2d9a-7b61-5e3a-9c8d-2b1a0f9e8d7c"
UIDS = {
    ("ml", "train-0"): "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b",
    ("team-a", "infer-0"): "11111111-2222-4333-8444-555555555555",
    ("team-a", "infer-1"): "66666666-7777-4888-9999-000000000000",
    ("ml", "mig-job"): "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
    ("net", "dpdk-0"): "12345678-9abc-4def-8123-456789abcdef",
    ("ml", "eval-2c"): "fedcba98-7654-4321-8fed-cba987654321",
}


NODE_PODS = pb.ListPodResourcesResponse(
    pod_resources=[
        pod(
            "ml",
            "train-0",
            pb.ContainerResources(name="trainer", devices=[devices("nvidia.com/gpu", GPU_0)]),
            pb.ContainerResources(name="log-shipper", cpu_ids=[2, 3]),
        ),
        pod(  # two time-slicing replicas of GPU_1 in two pods
            "team-a",
            "infer-0",
            pb.ContainerResources(
                name="server", devices=[devices("nvidia.com/gpu", f"{GPU_1}::0")]
            ),
        ),
        pod(
            "team-a",
            "infer-1",
            pb.ContainerResources(
                name="server", devices=[devices("nvidia.com/gpu", f"{GPU_1}::3")]
            ),
        ),
        pod(
            "ml",
            "mig-job",
            pb.ContainerResources(
                name="worker", devices=[devices("nvidia.com/mig-1g.10gb", MIG_0)]
            ),
        ),
        pod(  # no GPU at all: filtered out
            "net",
            "dpdk-0",
            pb.ContainerResources(
                name="app", devices=[devices("intel.com/sriov_netdevice", "0000:3b:02.1")]
            ),
        ),
        pod(
            "ml",
            "eval-2c",
            pb.ContainerResources(
                name="trainer",
                devices=[devices("nvidia.com/gpu", GPU_2), devices("example.com/fpga", "fpga-0")],
            ),
            pb.ContainerResources(name="evaluator", devices=[devices("nvidia.com/gpu", GPU_3)]),
        ),
        pod(  # running before its log directory was seen: no uid yet, skipped
            "ml",
            "just-started",
            pb.ContainerResources(name="main", devices=[devices("nvidia.com/gpu", GPU_3)]),
        ),
    ]
)


def expected(ns: str, name: str, container: str, resource: str, *ids: str) -> DeviceAllocation:
    """An allocation the client should return."""
    return DeviceAllocation(PodUid(UIDS[(ns, name)]), ns, name, container, resource, ids)


def node_kubelet() -> FakeKubelet:
    """A kubelet serving NODE_PODS."""
    return FakeKubelet(NODE_PODS)


class AllocatableKubelet(FakeKubelet):
    """A kubelet of Kubernetes >= 1.21, which serves GetAllocatableResources."""

    def GetAllocatableResources(  # noqa: N802  (the gRPC method name)
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        return pb.AllocatableResourcesResponse(
            devices=[
                devices("nvidia.com/gpu", GPU_2, GPU_0),
                devices("intel.com/sriov_netdevice", "0000:3b:02.1"),
                devices("nvidia.com/mig-1g.10gb", MIG_0),
            ],
            cpu_ids=[0, 1, 2, 3],
        )


@pytest.fixture(autouse=True)
def _client_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Capture every level of the client's log, so counts of WARNING and INFO mean something."""
    caplog.set_level(logging.DEBUG, logger="producers.podresources.client")


@pytest.fixture
def log_root(tmp_path: Path) -> Path:
    """/var/log/pods with a directory for every known pod."""
    for (namespace, name), uid in UIDS.items():
        (tmp_path / f"{namespace}_{name}_{uid}").mkdir()
    return tmp_path


@pytest.fixture
def source(sock: Path, log_root: Path) -> Iterator[KubeletAllocationSource]:
    """The client under test, with 1 s timeouts."""
    with KubeletAllocationSource(sock, timeout_s=1.0, pod_uids=PodLogUids(log_root)) as client:
        yield client


def warnings_and_infos(caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    """The client's WARNING and INFO messages so far."""
    records = [r for r in caplog.records if r.name == "producers.podresources.client"]
    return (
        [r.getMessage() for r in records if r.levelno == logging.WARNING],
        [r.getMessage() for r in records if r.levelno == logging.INFO],
    )


def test_lists_gpu_allocations_per_container(serve: Serve, source: KubeletAllocationSource) -> None:
    serve(node_kubelet())
    allocations = source.list_allocations()
    assert allocations == (
        expected("ml", "train-0", "trainer", "nvidia.com/gpu", GPU_0),
        expected("team-a", "infer-0", "server", "nvidia.com/gpu", f"{GPU_1}::0"),
        expected("team-a", "infer-1", "server", "nvidia.com/gpu", f"{GPU_1}::3"),
        expected("ml", "mig-job", "worker", "nvidia.com/mig-1g.10gb", MIG_0),
        expected("ml", "eval-2c", "trainer", "nvidia.com/gpu", GPU_2),
        expected("ml", "eval-2c", "evaluator", "nvidia.com/gpu", GPU_3),
    )
    assert is_replicated(allocations) == {GPU_1}


def test_configured_resources_replace_the_defaults(
    serve: Serve, sock: Path, log_root: Path
) -> None:
    serve(node_kubelet())
    with KubeletAllocationSource(
        sock, ("intel.com/sriov_netdevice",), (), 1.0, PodLogUids(log_root)
    ) as only_nics:
        assert only_nics.list_allocations() == (
            expected("net", "dpdk-0", "app", "intel.com/sriov_netdevice", "0000:3b:02.1"),
        )


def test_allocatable_lists_gpu_devices_only(serve: Serve, source: KubeletAllocationSource) -> None:
    serve(AllocatableKubelet(NODE_PODS))
    assert source.allocatable() == tuple(sorted((GPU_0, GPU_2, MIG_0)))


def test_allocatable_unimplemented_is_none_and_no_outage(
    serve: Serve, source: KubeletAllocationSource, caplog: pytest.LogCaptureFixture
) -> None:
    serve(node_kubelet())  # the generated base class answers UNIMPLEMENTED
    assert source.allocatable() is None
    assert source.list_allocations() is not None
    assert warnings_and_infos(caplog) == ([], [])


def test_missing_socket_warns_once_then_info_when_the_kubelet_appears(
    serve: Serve, source: KubeletAllocationSource, sock: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert [source.list_allocations() for _ in range(4)] == [None] * 4
    warnings, infos = warnings_and_infos(caplog)
    assert warnings == [
        f"kubelet pod-resources socket missing at {sock}; "
        "publishing samples without allocations; retrying"
    ]
    assert infos == []
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 3

    serve(node_kubelet())
    allocations = source.list_allocations()
    assert allocations is not None
    assert len(allocations) == 6
    warnings, infos = warnings_and_infos(caplog)
    assert len(warnings) == 1
    assert len(infos) == 1
    assert "available again" in infos[0]
    assert "failed_calls=4" in infos[0]


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED]
)
def test_server_error_gives_none_then_recovers(
    serve: Serve,
    source: KubeletAllocationSource,
    caplog: pytest.LogCaptureFixture,
    code: grpc.StatusCode,
) -> None:
    kubelet = serve(node_kubelet())
    kubelet.fail_with = code
    assert source.list_allocations() is None
    assert source.list_allocations() is None
    warnings, _ = warnings_and_infos(caplog)
    assert len(warnings) == 1
    assert f"rpc=List code={code.name}" in warnings[0]
    kubelet.fail_with = None
    assert source.list_allocations() is not None
    assert len(warnings_and_infos(caplog)[1]) == 1


def test_deadline_exceeded_gives_none(
    serve: Serve, sock: Path, log_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = serve(node_kubelet())
    kubelet.hang.set()
    with KubeletAllocationSource(sock, timeout_s=0.2, pod_uids=PodLogUids(log_root)) as client:
        started = time.monotonic()
        assert client.list_allocations() is None
        assert time.monotonic() - started < 2
    assert "code=DEADLINE_EXCEEDED" in warnings_and_infos(caplog)[0][0]


def test_stale_socket_without_listener_gives_none_then_reconnects(
    serve: Serve, source: KubeletAllocationSource, sock: Path
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # the kubelet died: the file is there, nobody accepts
    stale.close()
    assert source.list_allocations() is None
    sock.unlink()
    serve(node_kubelet())
    assert source.list_allocations() is not None


def test_close_is_idempotent_and_the_next_call_reconnects(
    serve: Serve, source: KubeletAllocationSource
) -> None:
    serve(node_kubelet())
    assert source.list_allocations() is not None
    source.close()
    source.close()
    assert source.list_allocations() is not None
