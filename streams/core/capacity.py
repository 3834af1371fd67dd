"""Fleet capacity: free GPUs per node, queued pods blocked by fragmentation, GPUs free but
stranded, and idle allocated GPUs that queued work could use (reclaimable).

A pure function of the latest view of each node (what it can allocate, what is allocated
on it, which allocated GPUs idle) and of the queued pods with their GPU requests: the same
inputs give the same answer, whatever order they came in. Semantics and the choices made:
streams/SEMANTICS-capacity.md.

What a queued pod could use is told by its cluster, GPU resource name and GPU model alone
(`K8sPod.gpu_products`, the model its node selector or required affinity allows):
taints, tolerations, other node selectors and the pod's CPU and memory requests are out
of scope, so "fits" here is necessary for the scheduler to place the pod, not sufficient.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schemas.fields import DEFAULT_CLUSTER

__all__ = [
    "Blocked",
    "Fleet",
    "IdleGpu",
    "ModelCapacity",
    "NodeCapacity",
    "QueuedPod",
    "assess",
]

UNKNOWN_MODEL = "unknown"
"""The model of a node without the `nvidia.com/gpu.product` label."""


@dataclass(frozen=True, slots=True)
class IdleGpu:
    """An allocated GPU idle since `since` (epoch ms), and the pods (`ns/pod`) holding it."""

    uuid: str
    resource: str
    since: int
    pods: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What a node can allocate and has allocated now, by GPU resource name."""

    node: str
    allocatable: Mapping[str, int]
    allocated: Mapping[str, int] = field(default_factory=dict)
    model: str | None = None
    schedulable: bool = True
    """Ready and not cordoned: a node that cannot take pods has nothing free."""
    idle: tuple[IdleGpu, ...] = ()
    cluster: str = DEFAULT_CLUSTER

    def free(self, resource: str) -> int:
        """Devices of `resource` a new pod could be given here now."""
        if not self.schedulable:
            return 0
        return max(0, self.allocatable.get(resource, 0) - self.allocated.get(resource, 0))

    @property
    def model_name(self) -> str:
        return self.model or UNKNOWN_MODEL


@dataclass(frozen=True, slots=True)
class QueuedPod:
    """A pod waiting for GPUs: its request by resource, the models it allows (None: any)."""

    uid: str
    namespace: str
    pod: str
    request: Mapping[str, int]
    since: int
    models: tuple[str, ...] | None = None
    cluster: str = DEFAULT_CLUSTER

    def can_use(self, node: NodeCapacity) -> bool:
        """Whether the pod could ever run on `node`: its cluster, an allowed model, and
        every resource it asks for allocatable there."""
        if node.cluster != self.cluster:
            return False
        if self.models is not None and node.model not in self.models:
            return False
        return all(node.allocatable.get(resource, 0) > 0 for resource in self.request)

    def fits(self, node: NodeCapacity) -> bool:
        """Whether the pod's whole request is free on `node` now."""
        return self.can_use(node) and all(
            node.free(resource) >= count for resource, count in self.request.items()
        )


@dataclass(frozen=True, slots=True)
class Blocked:
    """A queued pod whose request the fleet's free GPUs cover, but no single node's."""

    pod: QueuedPod
    resource: str
    """The resource no node has enough of (the largest part of the request that fails)."""
    wanted: int
    best_node: str | None
    """The usable node with the most free devices of it (first by name on a tie)."""
    best_free: int
    fleet_free: int
    """Free devices of it over every node the pod could use."""


@dataclass(frozen=True, slots=True)
class ModelCapacity:
    """One cluster's GPUs of one model and resource: free, stranded, reclaimable."""

    cluster: str
    model: str
    resource: str
    free: int
    stranded: int
    """Free devices on nodes that queued pods wanting this model and resource could use
    but fit on none of them: capacity the queue cannot take as it is spread."""
    reclaimable: tuple[tuple[str, IdleGpu], ...] = ()
    """(node, GPU) of the idle allocated GPUs queued pods could use, longest idle first."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """The capacity picture: per node, per model, and the pods blocked by fragmentation."""

    free: Mapping[tuple[str, str], Mapping[str, int]]
    """(cluster, node) -> resource -> free devices, for every node that allocates GPUs."""
    models: tuple[ModelCapacity, ...]
    blocked: tuple[Blocked, ...]


def assess(
    nodes: Iterable[NodeCapacity],
    queued: Iterable[QueuedPod],
    *,
    now_ms: int,
    idle_after_ms: int,
) -> Fleet:
    """The fleet's capacity at `now_ms`: an allocated GPU is reclaimable once idle for
    `idle_after_ms` (the idle alert's threshold) while a queued pod could use it."""
    nodes = sorted(nodes, key=lambda n: (n.cluster, n.node))
    waiting = sorted((p for p in queued if p.request), key=lambda p: (p.since, p.uid))
    free = {
        (n.cluster, n.node): {r: n.free(r) for r in sorted(n.allocatable)}
        for n in nodes
        if n.allocatable
    }
    blocked = tuple(b for p in waiting if (b := _blocked(p, nodes)) is not None)
    return Fleet(free=free, models=_models(nodes, waiting, now_ms, idle_after_ms), blocked=blocked)


def _blocked(pod: QueuedPod, nodes: list[NodeCapacity]) -> Blocked | None:
    usable = [n for n in nodes if pod.can_use(n)]
    if not usable or any(pod.fits(n) for n in usable):
        return None  # nothing it could ever use here, or a node has room: not fragmentation
    totals = {r: sum(n.free(r) for n in usable) for r in pod.request}
    if any(totals[r] < count for r, count in pod.request.items()):
        return None  # the fleet has too few free: a shortage, not fragmentation
    failing = [r for r, count in pod.request.items() if max(n.free(r) for n in usable) < count]
    resource = max(failing, key=lambda r: (pod.request[r], r))
    best = max(usable, key=lambda n: n.free(resource))  # the first by name on a tie
    return Blocked(
        pod=pod,
        resource=resource,
        wanted=pod.request[resource],
        best_node=best.node,
        best_free=best.free(resource),
        fleet_free=totals[resource],
    )


def _models(
    nodes: list[NodeCapacity], waiting: list[QueuedPod], now_ms: int, idle_after_ms: int
) -> tuple[ModelCapacity, ...]:
    keys = sorted({(n.cluster, n.model_name, r) for n in nodes for r in n.allocatable})
    out = []
    for cluster, model, resource in keys:
        mine = [
            n
            for n in nodes
            if (n.cluster, n.model_name) == (cluster, model) and resource in n.allocatable
        ]
        wanting = [p for p in waiting if resource in p.request]
        stranded = sum(
            n.free(resource)
            for n in mine
            if any(p.can_use(n) for p in wanting) and not any(p.fits(n) for p in wanting)
        )
        idle = [
            (n.node, gpu)
            for n in mine
            if any(p.can_use(n) for p in wanting)
            for gpu in n.idle
            if gpu.resource == resource and gpu.since + idle_after_ms <= now_ms
        ]
        idle.sort(key=lambda item: (item[1].since, item[0], item[1].uuid))
        out.append(
            ModelCapacity(
                cluster=cluster,
                model=model,
                resource=resource,
                free=sum(n.free(resource) for n in mine),
                stranded=stranded,
                reclaimable=tuple(idle),
            )
        )
    return tuple(out)
