"""Which pod holds which GPU on this node: the kubelet PodResources v1 API over its unix socket.

The kubelet is a dependency the agent must outlive: when the socket is missing or a
call fails, a tick publishes its samples without allocations (None here) and the next
tick tries again on a fresh channel. One outage logs one WARNING, the recovery INFO.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

import grpc
from google.protobuf.message import Message

from producers.base.dra import DEFAULT_DRA_DRIVERS, DeviceKey, DeviceLookup
from producers.base.ports import AllocationSource, DeviceAllocation
from producers.base.resources import ResourceFilter
from producers.podresources.claims import ClaimDevice, claim_allocations
from producers.podresources.poduids import PodLogUids
from producers.podresources.proto import api_pb2, method_path
from schemas.ids import PodUid

__all__ = [
    "DEFAULT_RESOURCES",
    "DEFAULT_RESOURCE_PREFIXES",
    "DEFAULT_SOCKET",
    "KubeletAllocationSource",
    "PodUidLookup",
    "allocations_from_response",
    "claim_devices_from_response",
]

logger = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# `nvidia.com/gpu.shared` is what the NVIDIA plugin advertises for time-slicing or MPS
# replicas when `renameByDefault: true`; MIG with the `mixed` strategy gets one
# resource per profile (`nvidia.com/mig-1g.10gb`).
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
DEFAULT_RESOURCE_PREFIXES = ("nvidia.com/mig-",)
# A List answer is a few KiB per hundred pods, far below gRPC's 4 MiB default; the
# headroom is for nodes with a raised maxPods and CPU/memory pinning on every container,
# where an oversized answer would fail every tick with RESOURCE_EXHAUSTED.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

R = TypeVar("R", bound=Message)


class PodUidLookup(Protocol):
    """(namespace, pod name) -> pod uid; the PodResources API carries no uid."""

    def refresh(self) -> None:
        """Re-read the source; called once before each List is converted."""
        ...

    def lookup(self, namespace: str, pod: str) -> PodUid | None:
        """The uid of `namespace/pod`, or None when unknown."""
        ...


def allocations_from_response(
    response: api_pb2.ListPodResourcesResponse,
    wanted: Callable[[str], bool],
    uids: PodUidLookup,
) -> tuple[DeviceAllocation, ...]:
    """One DeviceAllocation per container and wanted resource; pods of unknown uid skipped."""
    allocations: list[DeviceAllocation] = []
    for pod in response.pod_resources:
        devices = [
            (container.name, device)
            for container in pod.containers
            for device in container.devices
            if device.device_ids and wanted(device.resource_name)
        ]
        if not devices:
            continue
        uid = uids.lookup(pod.namespace, pod.name)
        if uid is None:
            logger.debug("allocation skipped: pod uid unknown pod=%s/%s", pod.namespace, pod.name)
            continue
        allocations.extend(
            DeviceAllocation(
                pod_uid=uid,
                namespace=pod.namespace,
                pod=pod.name,
                container=container,
                resource=device.resource_name,
                device_ids=tuple(device.device_ids),
            )
            for container, device in devices
        )
    return tuple(allocations)


def claim_devices_from_response(
    response: api_pb2.ListPodResourcesResponse,
    drivers: Collection[str],
    uids: PodUidLookup,
) -> tuple[ClaimDevice, ...]:
    """Every device of `drivers` a container holds through a ResourceClaim
    (`dynamic_resources`), in the kubelet's order; pods of unknown uid skipped."""
    if not drivers:
        return ()
    found: list[ClaimDevice] = []
    for pod in response.pod_resources:
        held = [
            (container.name, claim, resource)
            for container in pod.containers
            for claim in container.dynamic_resources
            for resource in claim.claim_resources
            if resource.driver_name in drivers
        ]
        if not held:
            continue
        uid = uids.lookup(pod.namespace, pod.name)
        if uid is None:
            logger.debug("claim skipped: pod uid unknown pod=%s/%s", pod.namespace, pod.name)
            continue
        found.extend(
            ClaimDevice(
                pod_uid=uid,
                namespace=pod.namespace,
                pod=pod.name,
                container=container,
                claim=f"{claim.claim_namespace or pod.namespace}/{claim.claim_name}",
                driver=resource.driver_name,
                pool=resource.pool_name,
                device=resource.device_name,
            )
            for container, claim, resource in held
        )
    return tuple(found)


class KubeletAllocationSource:
    """AllocationSource reading the kubelet's PodResources socket (gRPC v1 List).

    Devices of the device plugins' GPU resources come with their uuids. Devices that
    `dra_drivers` allocated through ResourceClaims are named by driver, pool and device:
    `devices` (this node's ResourceSlices) turns them into GPU uuids. A claim device it
    does not know (yet) is left out of that tick and counted in `unmapped_devices`.
    """

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        resources: Sequence[str] = DEFAULT_RESOURCES,
        resource_prefixes: Sequence[str] = DEFAULT_RESOURCE_PREFIXES,
        timeout_s: float = 2.0,
        pod_uids: PodUidLookup | None = None,
        *,
        dra_drivers: Collection[str] = DEFAULT_DRA_DRIVERS,
        devices: DeviceLookup | None = None,
    ) -> None:
        self._socket_path = socket_path
        self._wanted = ResourceFilter.of(resources, resource_prefixes)
        self._timeout_s = timeout_s
        self._pod_uids: PodUidLookup = pod_uids if pod_uids is not None else PodLogUids()
        self._dra_drivers = frozenset(dra_drivers) if devices is not None else frozenset()
        self._devices = devices
        self._channel: grpc.Channel | None = None
        self._failures = 0
        """Failed calls since the last success; the first one of an outage warns."""
        self.unmapped_devices = 0
        """Claim devices of the last List that no ResourceSlice named (left out)."""
        self._unmapped_logged: frozenset[DeviceKey] = frozenset()

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        """Current GPU allocations of this node; None while the kubelet cannot be read."""
        request = api_pb2.ListPodResourcesRequest()
        response = self._call("List", request, api_pb2.ListPodResourcesResponse)
        if response is None:
            return None
        self._pod_uids.refresh()
        plugin = allocations_from_response(response, self._wanted, self._pod_uids)
        uses = claim_devices_from_response(response, self._dra_drivers, self._pod_uids)
        if not uses or self._devices is None:
            self.unmapped_devices = 0
            return plugin
        table = self._devices.find({use.key for use in uses})
        claimed, unknown = claim_allocations(uses, table)
        self._note_unmapped(unknown)
        return plugin + claimed

    @property
    def slice_read_failures(self) -> int:
        """Failed reads of the ResourceSlices (0 without a device table that counts them)."""
        return int(getattr(self._devices, "failures", 0))

    def _note_unmapped(self, unknown: tuple[ClaimDevice, ...]) -> None:
        """Count claim devices left out; log each device once while it stays unknown."""
        self.unmapped_devices = len(unknown)
        keys = frozenset(use.key for use in unknown)
        for use in unknown:
            if use.key not in self._unmapped_logged:
                logger.warning(
                    "claim device not in this node's ResourceSlices: pod=%s/%s claim=%s "
                    "driver=%s pool=%s device=%s; its GPU is left unallocated until it is",
                    use.namespace,
                    use.pod,
                    use.claim,
                    use.driver,
                    use.pool,
                    use.device,
                )
        self._unmapped_logged = keys

    def allocatable(self) -> tuple[str, ...] | None:
        """Device ids of the GPU resources the kubelet can allocate; None where not served."""
        request = api_pb2.AllocatableResourcesRequest()
        response = self._call(
            "GetAllocatableResources", request, api_pb2.AllocatableResourcesResponse, optional=True
        )
        if response is None:
            return None
        return tuple(sorted(_wanted_ids(response.devices, self._wanted)))

    def close(self) -> None:
        """Close the channel; a later call opens a new one."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> Self:
        """The source itself; closed on exit."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the channel."""
        self.close()

    def _call(
        self, name: str, request: Message, response_type: type[R], optional: bool = False
    ) -> R | None:
        """Run one v1 RPC; None (logged) when the socket is missing or the call fails.

        `optional` RPCs answering UNIMPLEMENTED (an older kubelet, a disabled feature
        gate) give None without counting as an outage.
        """
        if not self._socket_path.exists():
            self.close()
            self._failed(f"kubelet pod-resources socket missing at {self._socket_path}")
            return None
        if self._channel is None:
            target = f"unix://{self._socket_path.absolute()}"
            options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
            self._channel = grpc.insecure_channel(target, options=options)
        rpc = self._channel.unary_unary(
            method_path(name),
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        try:
            result: R = rpc(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if optional and code == grpc.StatusCode.UNIMPLEMENTED:
                logger.debug("kubelet pod-resources rpc=%s not served", name)
                return None
            self.close()
            self._failed(
                f"kubelet pod-resources call failed socket={self._socket_path} rpc={name} "
                f"code={code.name if code is not None else None} detail={exc.details()!r}"
            )
            return None
        if self._failures:
            logger.info(
                "kubelet pod-resources available again socket=%s failed_calls=%d",
                self._socket_path,
                self._failures,
            )
            self._failures = 0
        return result

    def _failed(self, what: str) -> None:
        """Count a failed call: WARNING for the first of an outage, DEBUG for the rest."""
        level = logging.WARNING if self._failures == 0 else logging.DEBUG
        self._failures += 1
        logger.log(level, "%s; publishing samples without allocations; retrying", what)


def _wanted_ids(
    devices: Iterable[api_pb2.ContainerDevices], wanted: Callable[[str], bool]
) -> list[str]:
    """Device ids of the wanted resources."""
    return [i for device in devices if wanted(device.resource_name) for i in device.device_ids]


if TYPE_CHECKING:
    _conforms: AllocationSource = KubeletAllocationSource()
