"""The capacity rules written the plain way, one node and one pod at a time: the reference
the grouped `streams.core.fleet.capacity.assess` must agree with on any input."""

from __future__ import annotations

from collections.abc import Iterable

from streams.core.fleet.capacity import Blocked, Fleet, ModelCapacity, NodeCapacity, QueuedPod

__all__ = ["reference_assess"]


def reference_assess(
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
    stuck = {b.pod.uid for b in blocked}
    models = _models(nodes, waiting, now_ms, idle_after_ms, stuck)
    return Fleet(free=free, models=models, blocked=blocked)


def _blocked(pod: QueuedPod, nodes: list[NodeCapacity]) -> Blocked | None:
    usable = [n for n in nodes if pod.can_use(n)]
    if not usable or any(pod.fits(n) for n in usable):
        return None  # nothing it could ever use here, or a node has room: not fragmentation
    totals = {r: sum(n.free(r) for n in usable) for r in pod.request}
    if any(totals[r] < count for r, count in pod.request.items()):
        return None  # the fleet has too few free: a shortage, not fragmentation
    failing = [
        r for r, count in pod.request.items() if max(n.free(r) for n in usable) < count
    ] or list(pod.request)  # each free enough somewhere, never all on one node
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
    nodes: list[NodeCapacity],
    waiting: list[QueuedPod],
    now_ms: int,
    idle_after_ms: int,
    stuck: set[str],
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
        users = [p for p in wanting if any(p.can_use(n) for n in mine)]
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
                queued=len(users),
                blocked=len({p.uid for p in users} & stuck),
            )
        )
    return tuple(out)
