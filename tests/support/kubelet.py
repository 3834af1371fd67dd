"""A fake kubelet: a real gRPC server on a unix socket speaking our PodResources v1 proto."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from producers.podresources.proto import api_pb2, grpc_module

pb = api_pb2
api_grpc = grpc_module()


class FakeKubelet(api_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Serves `list_response` to List, or fails as told; other RPCs answer UNIMPLEMENTED."""

    def __init__(self, list_response: pb.ListPodResourcesResponse) -> None:
        self.list_response = list_response
        self.fail_with: grpc.StatusCode | None = None
        self.hang = threading.Event()
        self.hang_released = threading.Event()

    def List(  # noqa: N802  (the gRPC method name)
        self, request: pb.ListPodResourcesRequest, context: Any
    ) -> pb.ListPodResourcesResponse:
        if self.hang.is_set():
            self.hang_released.wait(5)
        if self.fail_with is not None:
            context.abort(self.fail_with, "kubelet says no")
        return self.list_response


Serve = Callable[[FakeKubelet], FakeKubelet]


@contextmanager
def serving(sock: Path) -> Iterator[Serve]:
    """`start(servicer)` serves it on `sock`; every server stops on exit, and no thread
    of theirs is left behind."""
    threads_before = set(threading.enumerate())
    started: list[tuple[grpc.Server, futures.ThreadPoolExecutor, FakeKubelet]] = []

    def start(servicer: FakeKubelet) -> FakeKubelet:
        executor = futures.ThreadPoolExecutor(max_workers=2)
        server = grpc.server(executor)
        api_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        started.append((server, executor, servicer))
        return servicer

    yield start
    for server, executor, servicer in started:
        servicer.hang_released.set()
        server.stop(grace=None).wait(5)
        executor.shutdown(wait=True)
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - threads_before == set(), "threads leaked"


def pod(namespace: str, name: str, *containers: pb.ContainerResources) -> pb.PodResources:
    """A pod as List returns it."""
    return pb.PodResources(name=name, namespace=namespace, containers=containers)


def devices(resource: str, *ids: str) -> pb.ContainerDevices:
    """One resource's devices, with the NUMA node the kubelet reports."""
    numa = pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])
    return pb.ContainerDevices(resource_name=resource, device_ids=ids, topology=numa)


def claim(
    namespace: str, name: str, driver: str, pool: str, *device_names: str
) -> pb.DynamicResource:
    """A ResourceClaim's devices as the kubelet lists them, each with its CDI device name
    (the NVIDIA DRA driver's: `k8s.gpu.nvidia.com/claim=<claim uid>-<device>`)."""
    return pb.DynamicResource(
        claim_name=name,
        claim_namespace=namespace,
        claim_resources=[
            pb.ClaimResource(
                driver_name=driver,
                pool_name=pool,
                device_name=device,
                cdi_devices=[pb.CDIDevice(name=f"k8s.{driver}/claim={name}-{device}")],
            )
            for device in device_names
        ],
    )
