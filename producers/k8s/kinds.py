"""Pods and nodes as the watch loop sees them: decode, key, select, observe."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from producers.k8s.api import Resource
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
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod

O = TypeVar("O")  # noqa: E741 - the object type, as in the API's own generics
V = TypeVar("V", K8sPod, K8sNode)


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


class PodKind:
    """Pods: keyed by uid, GPU pods and named pods, owners resolved."""

    resource: Resource = "pods"

    def __init__(self, rules: PodRules, selection: PodSelection, owners: OwnerResolver) -> None:
        self.rules = rules
        self.selection = selection
        self.owners = owners

    def decode_list(self, raw: bytes) -> Page[Pod]:
        """A PodList page."""
        return decode_pod_list(raw)

    def decode_event(self, line: bytes) -> WatchEvent[Pod]:
        """One pod watch event."""
        return decode_event(line, POD_DECODER)

    def key(self, obj: Pod) -> str:
        """The pod's uid."""
        return pod_key(obj)

    def version(self, obj: Pod) -> str | None:
        """The pod's resourceVersion."""
        return (obj.get("metadata") or {}).get("resourceVersion")

    def wanted(self, obj: Pod) -> bool:
        """GPU pods and the pods the configuration names."""
        return self.selection.wanted(obj)

    def observe(self, obj: Pod) -> Observed[K8sPod]:
        """The pod's value, owner resolved."""
        meta = obj.get("metadata") or {}
        owner = self.owners.resolve(meta.get("namespace") or "", meta.get("ownerReferences"))
        value = normalise_pod(obj, self.rules, owner)
        return Observed(value.uid, value.resource_version, value, pod_stamps(obj))


class NodeKind:
    """Nodes: keyed by name, GPU nodes only."""

    resource: Resource = "nodes"

    def __init__(self, rules: NodeRules, selection: NodeSelection) -> None:
        self.rules = rules
        self.selection = selection

    def decode_list(self, raw: bytes) -> Page[Node]:
        """A NodeList page."""
        return decode_node_list(raw)

    def decode_event(self, line: bytes) -> WatchEvent[Node]:
        """One node watch event."""
        return decode_event(line, NODE_DECODER)

    def key(self, obj: Node) -> str:
        """The node's name."""
        return node_key(obj)

    def version(self, obj: Node) -> str | None:
        """The node's resourceVersion."""
        return (obj.get("metadata") or {}).get("resourceVersion")

    def wanted(self, obj: Node) -> bool:
        """GPU nodes."""
        return self.selection.wanted(obj)

    def observe(self, obj: Node) -> Observed[K8sNode]:
        """The node's value."""
        value = normalise_node(obj, self.rules)
        version = (obj.get("metadata") or {}).get("resourceVersion") or ""
        return Observed(value.node, version, value, node_stamps(obj))
