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
    queued: int = 0
    """Queued pods that want this resource and could use a node of this model."""
    blocked: int = 0
    """Of those, the pods blocked by fragmentation."""


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
    `idle_after_ms` (the idle alert's threshold) while a queued pod could use it.

    Nodes alike for every pod (one cluster, one model, the same resources allocatable) are
    taken as one group, so a pod's question is asked of each group, not of each node: a
    5,000-node cluster has a few groups, and its waiting pods cost a pass over them each.
    """
    nodes = sorted(nodes, key=lambda n: (n.cluster, n.node))
    waiting = sorted((p for p in queued if p.request), key=lambda p: (p.since, p.uid))
    free = {
        (n.cluster, n.node): {r: n.free(r) for r in sorted(n.allocatable)}
        for n in nodes
        if n.allocatable
    }
    groups = _groups(nodes)
    usable = {p.uid: [g for g in groups if g.usable_by(p)] for p in waiting}
    blocked = tuple(b for p in waiting if (b := _blocked(p, usable[p.uid])) is not None)
    stuck = {b.pod.uid for b in blocked}
    models = _models(
        nodes, groups, waiting, usable, stuck, now_ms=now_ms, idle_after_ms=idle_after_ms
    )
    return Fleet(free=free, models=models, blocked=blocked)


@dataclass(slots=True)
class _Group:
    """Nodes alike for every pod: one cluster, one model, the same resources allocatable
    (more than 0), in name order; each resource's free devices per node, their sum, and
    the most free with the first node that has it."""

    cluster: str
    model: str | None
    resources: frozenset[str]
    nodes: list[NodeCapacity] = field(default_factory=list)
    free: dict[str, list[int]] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    best: dict[str, tuple[int, int]] = field(default_factory=dict)
    """resource -> (most free on one node, index of the first node with that many)."""

    def add(self, node: NodeCapacity) -> None:
        index = len(self.nodes)
        self.nodes.append(node)
        for r in self.resources:
            n = node.free(r)
            self.free.setdefault(r, []).append(n)
            self.total[r] = self.total.get(r, 0) + n
            if r not in self.best or n > self.best[r][0]:
                self.best[r] = (n, index)

    def usable_by(self, pod: QueuedPod) -> bool:
        """`QueuedPod.can_use` of every node of the group."""
        if pod.cluster != self.cluster:
            return False
        if pod.models is not None and self.model not in pod.models:
            return False
        return all(r in self.resources for r in pod.request)

    def fits(self, request: Mapping[str, int], index: int) -> bool:
        """Whether a request is free on the group's node `index`."""
        return all(self.free[r][index] >= count for r, count in request.items())

    @property
    def model_name(self) -> str:
        return self.model or UNKNOWN_MODEL


def _groups(nodes: list[NodeCapacity]) -> list[_Group]:
    groups: dict[tuple[str, str | None, frozenset[str]], _Group] = {}
    for n in nodes:
        resources = frozenset(r for r, count in n.allocatable.items() if count > 0)
        key = (n.cluster, n.model, resources)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(n.cluster, n.model, resources)
        group.add(n)
    return list(groups.values())


def _fits_somewhere(request: Mapping[str, int], groups: list[_Group]) -> bool:
    if len(request) == 1:
        ((r, count),) = request.items()
        return any(g.best[r][0] >= count for g in groups)
    return any(g.fits(request, i) for g in groups for i in range(len(g.nodes)))


def _blocked(pod: QueuedPod, usable: list[_Group]) -> Blocked | None:
    if not usable or _fits_somewhere(pod.request, usable):
        return None  # nothing it could ever use here, or a node has room: not fragmentation
    totals = {r: sum(g.total[r] for g in usable) for r in pod.request}
    if any(totals[r] < count for r, count in pod.request.items()):
        return None  # the fleet has too few free: a shortage, not fragmentation
    most = {r: max(g.best[r][0] for g in usable) for r in pod.request}
    # Each resource may be free enough on some node, just never all on one: then the
    # largest part of the request names it.
    failing = [r for r, count in pod.request.items() if most[r] < count] or list(pod.request)
    resource = max(failing, key=lambda r: (pod.request[r], r))
    best_free = most[resource]
    best = min(  # the first node by name among those with the most free
        g.nodes[g.best[resource][1]].node for g in usable if g.best[resource][0] == best_free
    )
    return Blocked(
        pod=pod,
        resource=resource,
        wanted=pod.request[resource],
        best_node=best,
        best_free=best_free,
        fleet_free=totals[resource],
    )


def _fits_any(requests: list[Mapping[str, int]], group: _Group, index: int) -> bool:
    """Whether one of `requests` is free on the group's node `index`."""
    return any(group.fits(request, index) for request in requests)


def _shapes(pods: list[QueuedPod]) -> list[Mapping[str, int]]:
    """The distinct requests that matter for "does any of them fit": of the requests for
    one resource only, the smallest; every request for several."""
    smallest: dict[str, int] = {}
    several: list[Mapping[str, int]] = []
    for p in pods:
        if len(p.request) == 1:
            ((r, count),) = p.request.items()
            smallest[r] = min(count, smallest.get(r, count))
        elif p.request not in several:
            several.append(p.request)
    return [{r: count} for r, count in smallest.items()] + several


def _models(
    nodes: list[NodeCapacity],
    groups: list[_Group],
    waiting: list[QueuedPod],
    usable: dict[str, list[_Group]],
    blocked: set[str],
    *,
    now_ms: int,
    idle_after_ms: int,
) -> tuple[ModelCapacity, ...]:
    keys = sorted({(n.cluster, n.model_name, r) for n in nodes for r in n.allocatable})
    out = []
    for cluster, model, resource in keys:
        total = stranded = 0
        idle: list[tuple[str, IdleGpu]] = []
        queued: set[str] = set()
        wanting = [p for p in waiting if resource in p.request]
        for g in groups:
            if (g.cluster, g.model_name) != (cluster, model) or resource not in g.resources:
                continue
            total += g.total[resource]
            users = [p for p in wanting if any(u is g for u in usable[p.uid])]
            if not users:
                continue
            queued.update(p.uid for p in users)
            shapes = _shapes(users)
            stranded += sum(
                n for i, n in enumerate(g.free[resource]) if not _fits_any(shapes, g, i)
            )
            idle += [
                (node.node, gpu)
                for node in g.nodes
                for gpu in node.idle
                if gpu.resource == resource and gpu.since + idle_after_ms <= now_ms
            ]
        idle.sort(key=lambda item: (item[1].since, item[0], item[1].uuid))
        out.append(
            ModelCapacity(
                cluster=cluster,
                model=model,
                resource=resource,
                free=total,
                stranded=stranded,
                reclaimable=tuple(idle),
                queued=len(queued),
                blocked=len(queued & blocked),
            )
        )
    return tuple(out)
