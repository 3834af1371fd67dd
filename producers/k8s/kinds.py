"""Pods, nodes, Workloads and ResourceSlices as the watch loop sees them: decode, key,
select, observe."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Generic, Protocol, TypeVar

import msgspec

from producers.base.kubeapi import Resource
from producers.k8s.claims import ClaimRequests
from producers.k8s.dra import (
    SLICE_DECODER,
    DraInventory,
    ResourceSlice,
    SliceDevices,
    decode_slice_list,
    merge_counts,
    observe_slice,
    slice_key,
)
from producers.k8s.normalise import (
    NodeRules,
    PodRules,
    node_key,
    node_stamps,
    normalise_node,
    normalise_pod,
    pod_key,
    pod_stamps,
)
from producers.k8s.objects import (
    NODE_DECODER,
    POD_DECODER,
    Node,
    Page,
    Pod,
    WatchEvent,
    decode_event,
    decode_node_list,
    decode_pod_list,
)
from producers.k8s.owners import OwnerResolver
from producers.k8s.resync import Observed
from producers.k8s.selection import NodeSelection, PodSelection
from producers.k8s.workloads import (
    WORKLOAD_DECODER,
    Workload,
    decode_workload_list,
    normalise_workload,
    pod_set_templates,
    workload_key,
    workload_stamps,
)
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.k8s_workload import K8sWorkload

O = TypeVar("O")  # noqa: E741 - the object type, as in the API's own generics
V = TypeVar("V", K8sPod, K8sNode, K8sWorkload, SliceDevices)
K = TypeVar("K", Pod, Node, Workload, ResourceSlice)
S_contra = TypeVar("S_contra", contravariant=True)


class Kind(Protocol, Generic[O, V]):
    """What the watch loop needs to know about one resource."""

    resource: Resource

    def decode_list(self, raw: bytes) -> Page[O]:
        """A list page; MalformedObject when it is not one."""
        ...

    def decode_event(self, line: bytes) -> WatchEvent[O]:
        """One watch line; MalformedObject when it is not one."""
        ...

    def key(self, obj: O) -> str:
        """The message key; MalformedObject when the object has none."""
        ...

    def version(self, obj: O) -> str | None:
        """The object's resourceVersion."""
        ...

    def wanted(self, obj: O) -> bool:
        """Whether an object not yet published should be."""
        ...

    def observe(self, obj: O) -> Observed[V]:
        """Normalise; MalformedObject when the object lacks what a value needs."""
        ...

    def forget(self, key: str) -> None:
        """The object of `key` is no longer published: drop what is kept of it."""
        ...


class Selection(Protocol[S_contra]):
    """Which objects of a kind are published (`PodSelection`, `NodeSelection`)."""

    def wanted(self, obj: S_contra) -> bool:
        """Whether `obj` is."""
        ...


class _ApiKind(Generic[K]):
    """What is the same for every kind: the API's JSON decoded, the key and resourceVersion
    read, the selection asked."""

    _decode_list: Callable[[bytes], Page[K]]
    _decoder: msgspec.json.Decoder[K]
    _key: Callable[[K], str]
    _selection: Selection[K]

    def __init__(
        self,
        selection: Selection[K],
        key: Callable[[K], str],
        decode_list: Callable[[bytes], Page[K]],
        decoder: msgspec.json.Decoder[K],
    ) -> None:
        self._selection = selection
        self._key = key
        self._decode_list = decode_list
        self._decoder = decoder

    def decode_list(self, raw: bytes) -> Page[K]:
        """A list page."""
        return self._decode_list(raw)

    def decode_event(self, line: bytes) -> WatchEvent[K]:
        """One watch event."""
        return decode_event(line, self._decoder)

    def key(self, obj: K) -> str:
        """The message key."""
        return self._key(obj)

    def version(self, obj: K) -> str | None:
        """The object's resourceVersion."""
        return (obj.get("metadata") or {}).get("resourceVersion")

    def wanted(self, obj: K) -> bool:
        """Whether the selection wants an object not yet published."""
        return self._selection.wanted(obj)

    def forget(self, key: str) -> None:
        """Nothing is kept of an object but what the watch keeps."""


class PodKind(_ApiKind[Pod]):
    """Pods: keyed by uid, GPU pods and the pods the configuration names, owners resolved."""

    resource: Resource = "pods"

    def __init__(
        self,
        rules: PodRules,
        selection: PodSelection,
        owners: OwnerResolver,
        claims: ClaimRequests | None = None,
    ) -> None:
        super().__init__(selection, pod_key, decode_pod_list, POD_DECODER)
        self.rules = rules
        self.owners = owners
        self.claims = claims or ClaimRequests(None)

    def observe(self, obj: Pod) -> Observed[K8sPod]:
        """The pod's value, owner resolved, its claims' GPU devices counted."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        owner = self.owners.resolve(namespace, meta.get("ownerReferences"))
        claimed = self.claims.of(namespace, obj.get("spec") or {})
        value = normalise_pod(obj, self.rules, owner, claimed)
        return Observed(value.uid, value.resource_version, value, pod_stamps(obj))


class _Everything:
    """Every workload is published: Kueue admits GPU and CPU jobs alike, and a queue's
    story is told whole (`gpu_request` says which want GPUs)."""

    def wanted(self, obj: Workload) -> bool:
        return True


class WorkloadKind(_ApiKind[Workload]):
    """Kueue Workloads: keyed by uid, every one, owners resolved as a pod's are."""

    resource: Resource = "workloads"

    def __init__(
        self, rules: PodRules, owners: OwnerResolver, claims: ClaimRequests | None = None
    ) -> None:
        super().__init__(_Everything(), workload_key, decode_workload_list, WORKLOAD_DECODER)
        self.rules = rules
        self.owners = owners
        self.claims = claims or ClaimRequests(None)

    def observe(self, obj: Workload) -> Observed[K8sWorkload]:
        """The workload's value, its job's owner resolved, its pod sets' claims counted."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        owner = self.owners.resolve(namespace, meta.get("ownerReferences"))
        claimed: dict[str, int] = {}
        for count, spec in pod_set_templates(obj):
            for device_class, n in self.claims.of(namespace, spec).items():
                claimed[device_class] = claimed.get(device_class, 0) + n * count
        value = normalise_workload(obj, self.rules, owner, claimed)
        return Observed(value.uid, value.resource_version, value, workload_stamps(obj))


class NodeKind(_ApiKind[Node]):
    """Nodes: keyed by name, GPU nodes only. With `devices`, a node's DRA devices are added
    to its GPU capacity and allocatable (under resource names the device plugin does not
    report), and a node with such devices is a GPU node.

    The value each node had without them is kept, so that `reobserve` can tell the node's
    value again when only its devices changed (no event of the node's own)."""

    resource: Resource = "nodes"

    def __init__(
        self, rules: NodeRules, selection: NodeSelection, devices: DraInventory | None = None
    ) -> None:
        super().__init__(selection, node_key, decode_node_list, NODE_DECODER)
        self.rules = rules
        self.devices = devices
        self._plain: dict[str, Observed[K8sNode]] = {}
        self._lock = threading.Lock()

    def wanted(self, obj: Node) -> bool:
        """GPU nodes: the selection's, and those with DRA devices."""
        if super().wanted(obj):
            return True
        return self.devices is not None and bool(self.devices.counts(node_key(obj)))

    def observe(self, obj: Node) -> Observed[K8sNode]:
        """The node's value, its DRA devices counted."""
        value = normalise_node(obj, self.rules)
        plain = Observed(value.node, self.version(obj) or "", value, node_stamps(obj))
        if self.devices is not None:
            with self._lock:
                self._plain[plain.key] = plain
        return self._with_devices(plain)

    def reobserve(self, key: str) -> Observed[K8sNode] | None:
        """The last observed node of `key` with its DRA devices as they are now; None for
        a node not observed (or forgotten)."""
        with self._lock:
            plain = self._plain.get(key)
        return None if plain is None else self._with_devices(plain)

    def forget(self, key: str) -> None:
        """The node is no longer published."""
        with self._lock:
            self._plain.pop(key, None)

    def _with_devices(self, plain: Observed[K8sNode]) -> Observed[K8sNode]:
        if self.devices is None:
            return plain
        dra = self.devices.counts(plain.key)
        if not dra:
            return plain
        value = msgspec.structs.replace(
            plain.value,
            gpu_capacity=merge_counts(plain.value.gpu_capacity, dra),
            gpu_allocatable=merge_counts(plain.value.gpu_allocatable, dra),
        )
        return Observed(plain.key, plain.resource_version, value, plain.stamps)


class SliceKind(_ApiKind[ResourceSlice]):
    """ResourceSlices of the GPU DRA drivers that name their node: keyed by name, each
    one's devices counted per resource name."""

    resource: Resource = "resourceslices"

    def __init__(self, drivers: Collection[str]) -> None:
        super().__init__(
            _OfDrivers(frozenset(drivers)), slice_key, decode_slice_list, SLICE_DECODER
        )

    def observe(self, obj: ResourceSlice) -> Observed[SliceDevices]:
        """The slice's devices, counted."""
        value = observe_slice(obj)
        return Observed(value.slice, self.version(obj) or "", value, frozenset())


class _OfDrivers:
    """Slices of `drivers` with a node (a slice of devices reachable from several nodes
    adds to no one node's capacity)."""

    def __init__(self, drivers: frozenset[str]) -> None:
        self.drivers = drivers

    def wanted(self, obj: ResourceSlice) -> bool:
        spec = obj.get("spec") or {}
        return spec.get("driver") in self.drivers and bool(spec.get("nodeName"))
