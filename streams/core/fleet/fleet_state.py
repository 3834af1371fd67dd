"""Fleet capacity in the stream: what each node can give, what each queued pod waits for,
and the capacity records and fragmentation alerts derived from both, in event time.

The node side sends a node's view (`FleetNode`) each time it changes, the pod side a
pod's waiting request (`FleetPod`) each time that changes and, after each watermark it
applies, a mark (`FleetMark`); all go to one partition of an internal topic, the fleet
partition (SEMANTICS-capacity.md, Where it runs). There, `FleetState` applies them in
event time once every pod partition's mark has passed them, and evaluates the clusters
they changed with `capacity.assess` at whole steps of event time (`STEP_MS`): a
`PodBlockedByFragmentation` alert fires or resolves there, and a `capacity` record goes
out for each (cluster, model, resource) whose picture changed.

The evaluation time of an input is the end of its step (`step_of`): the inputs of one
step are applied together and the picture taken after them, so the records depend on the
inputs' event times only, never on when the marks came.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from schemas.alert import Alert, AlertName, AlertSubject, Severity
from schemas.capacity import Capacity, ReclaimableGpu
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.k8s_node import K8sNode
from schemas.nvml_sample import NvmlSample
from streams.core.alert_identity import fingerprint, in_cluster, with_cluster
from streams.core.fleet.capacity import (
    UNKNOWN_MODEL,
    Blocked,
    IdleGpu,
    NodeCapacity,
    QueuedPod,
    assess,
)

__all__ = [
    "FLEET_PARTITION",
    "SEVERITY",
    "STEP_MS",
    "FleetAlert",
    "FleetIdle",
    "FleetInput",
    "FleetMark",
    "FleetNode",
    "FleetOwner",
    "FleetPod",
    "FleetState",
    "FleetUse",
    "Item",
    "decode_input",
    "encode_input",
    "node_after_event",
    "node_after_idle_ended",
    "node_after_sample",
    "step_of",
]

FLEET_PARTITION = 0
"""The one partition of the fleet topic that carries anything (hosted by the pod side's)."""
STEP_MS = 1000
"""Capacity is evaluated at the end of each second of event time that changed something."""

SEVERITY: dict[AlertName, Severity] = {
    # Work waits while GPUs sit free: someone should move or resize it, not at night.
    "PodBlockedByFragmentation": "warning",
}

GONE_KEEP_MS = 6 * 3_600_000
"""How long (event time) a deleted node or a pod that stopped waiting is remembered: as
long as the pod side keeps what it may send again (`pod.SENT_AGAIN_KEEP_MS`)."""

GPU_RESOURCE = "nvidia.com/gpu"


class FleetIdle(msgspec.Struct, frozen=True, array_like=True):
    """An allocated GPU whose GpuIdleAllocated alert fires: idle since `since`."""

    uuid: str
    resource: str
    since: int
    pods: tuple[str, ...] = ()


class FleetNode(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node"):
    """What a node can allocate, as its k8s.nodes event at `ts` says."""

    node: str
    cluster: str = DEFAULT_CLUSTER
    ts: int
    model: str | None = None
    schedulable: bool = True
    allocatable: dict[str, int] = msgspec.field(default_factory=dict)
    deleted: bool = False


class FleetUse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="use"):
    """What is allocated on a node, and which of its allocated GPUs idle, as of `ts` (from
    its samples); `rev` counts the node's uses (ties in `ts`)."""

    node: str
    cluster: str = DEFAULT_CLUSTER
    ts: int
    rev: int = 0
    allocated: dict[str, int] = msgspec.field(default_factory=dict)
    idle: tuple[FleetIdle, ...] = ()
    model: str | None = None
    """The model NVML names the node's GPUs by (the GPU series' `model`)."""


def _capacity(node: FleetNode, use: FleetUse | None) -> NodeCapacity:
    return NodeCapacity(
        node=node.node,
        allocatable=node.allocatable,
        allocated={} if use is None else use.allocated,
        model=node.model,
        schedulable=node.schedulable,
        idle=() if use is None else tuple(IdleGpu(*msgspec.structs.astuple(i)) for i in use.idle),
        cluster=node.cluster,
    )


class FleetPod(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="pod"):
    """A pod's GPU request as of `ts`: `waiting` while it is queued and bound to no node."""

    uid: str
    namespace: str
    pod: str
    cluster: str = DEFAULT_CLUSTER
    ts: int
    waiting: bool
    request: dict[str, int] = msgspec.field(default_factory=dict)
    models: tuple[str, ...] | None = None
    since: int = 0
    """When it began to wait (its queued spell's start)."""
    owner: str | None = None
    """Its workload owner, `Kind/name`."""


class FleetMark(msgspec.Struct, frozen=True, kw_only=True, tag="mark"):
    """A partition of one side applied a tick whose pod-side watermark is `watermark`:
    what it had to send up to then is sent."""

    side: str
    """`node` or `pod`."""
    partition: int
    watermark: int


class FleetOwner(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="owner"):
    """A pod's workload owner (`Kind/name`), sent when the pod is first seen and again when
    it finishes (`gone`), at those transitions' times."""

    uid: str
    owner: str
    ts: int
    gone: bool = False


class FleetAlert(msgspec.Struct, frozen=True, kw_only=True, tag="alert"):
    """A GPU health alert of the node side, to go out with its pods' owners; `ts` orders it
    among the fleet's inputs (never before the partition's usage frontier), the alert keeps
    its own times."""

    ts: int
    alert: Alert


FleetInput = FleetNode | FleetUse | FleetPod | FleetOwner | FleetAlert | FleetMark
Item = FleetNode | FleetUse | FleetPod | FleetOwner | FleetAlert
"""An input the fleet partition applies in event time (a mark is not one)."""

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(FleetInput)


def encode_input(value: FleetInput) -> bytes:
    return _ENCODER.encode(value)


def decode_input(raw: bytes) -> FleetInput:
    """An input of the fleet partition; msgspec.DecodeError when it is none."""
    return _DECODER.decode(raw)


def step_of(ts: int) -> int:
    """The end of the step holding `ts`: when an input of that time is evaluated."""
    return -(-ts // STEP_MS) * STEP_MS


# --- the node side's view of one node


def node_after_event(last: FleetNode | None, event: K8sNode) -> FleetNode | None:
    """What the node can allocate after a k8s.nodes event; None when that is unchanged."""
    if event.type == "DELETED":
        view = FleetNode(node=event.node, cluster=event.cluster, ts=event.ts, deleted=True)
    else:
        view = FleetNode(
            node=event.node,
            cluster=event.cluster,
            ts=event.ts,
            model=event.gpu_product,
            schedulable=event.ready and not event.unschedulable,
            allocatable=dict(sorted(event.gpu_allocatable.items())),
        )
    if last is not None and msgspec.structs.replace(last, ts=view.ts) == view:
        return None
    return view


def node_after_sample(
    last: FleetUse | None,
    sample: NvmlSample,
    idle: Iterable[tuple[str, int, tuple[str, ...]]],
    ts: int,
) -> FleetUse | None:
    """What is allocated and idle on the node after a sample, sent at `ts`; `idle` its GPUs
    whose idle alert fires (uuid, since, holders). None when unchanged."""
    allocated: dict[str, int] = {}
    resource_of: dict[str, str] = {}
    claimed: set[tuple[str, str]] = set()  # a claim's device, whichever pods share it
    for a in sample.allocations:
        if a.claim is None:  # a device plugin's: each id is a device (a replica) of its own
            count = len(a.device_ids)
        else:  # one claim shared by several pods is one allocation of its devices
            fresh = {(a.claim, uuid) for uuid in a.device_ids} - claimed
            claimed |= fresh
            count = len(fresh)
        allocated[a.resource] = allocated.get(a.resource, 0) + count
        for uuid in a.device_ids:
            resource_of[uuid] = a.resource
    idle_gpus = tuple(
        FleetIdle(uuid, resource_of.get(uuid, GPU_RESOURCE), since, pods)
        for uuid, since, pods in sorted(idle)
    )
    allocated = dict(sorted(allocated.items()))
    model = next((g.model for g in sample.gpus if g.parent_uuid is None), None)
    if last is not None:
        model = model or last.model
        if (last.allocated, last.idle, last.model) == (allocated, idle_gpus, model):
            return None
    return FleetUse(
        node=sample.node,
        cluster=sample.cluster,
        ts=ts,
        rev=0 if last is None else last.rev + 1,
        allocated=allocated,
        idle=idle_gpus,
        model=model,
    )


def node_after_idle_ended(last: FleetUse | None, firing: set[str], ts: int) -> FleetUse | None:
    """The node's use once only the GPUs `firing` still have an idle alert firing (the
    others' ended without a sample: telemetry missing, the node removed); None: unchanged."""
    if last is None:
        return None
    idle = tuple(i for i in last.idle if i.uuid in firing)
    if idle == last.idle:
        return None
    return msgspec.structs.replace(last, idle=idle, ts=ts, rev=last.rev + 1)


# --- the fleet partition


class BlockedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A firing PodBlockedByFragmentation: since when, and its labels as it fired."""

    since: int
    labels: dict[str, str]
    cluster: str = DEFAULT_CLUSTER


@dataclass
class FleetState:
    """What the fleet partition knows: each node's view, the waiting pods, the firing
    fragmentation alerts, the capacity pictures last sent, and the pod partitions' marks.

    `changed` collects the keys to store (`node|…`, `pod|…`, `blocked|…`, `picture|…`,
    `marks`).
    """

    partitions: int
    nodes: dict[tuple[str, str], FleetNode] = field(default_factory=dict)
    uses: dict[tuple[str, str], FleetUse] = field(default_factory=dict)
    pods: dict[str, FleetPod] = field(default_factory=dict)
    owners: dict[str, FleetOwner] = field(default_factory=dict)
    blocked: dict[str, BlockedRun] = field(default_factory=dict)
    pictures: dict[str, Capacity] = field(default_factory=dict)
    marks: dict[tuple[str, int], int] = field(default_factory=dict)
    """(side, partition) -> the latest mark of each partition of each side."""
    evaluated: int | None = None
    """The last step evaluated: an input of a step at or before it is late."""
    changed: set[str] = field(default_factory=set)

    def watermark(self) -> int | None:
        """The lowest mark over every partition of both sides; None until each has marked."""
        if len(self.marks) < 2 * self.partitions:
            return None
        return min(self.marks.values())

    def mark(self, m: FleetMark) -> bool:
        """Take a mark; whether it moved its partition's."""
        if not 0 <= m.partition < self.partitions or m.side not in ("node", "pod"):
            return False
        key = (m.side, m.partition)
        if m.watermark <= self.marks.get(key, -(2**62)):
            return False
        self.marks[key] = m.watermark
        self.changed.add("meta")
        return True

    def is_replay(self, item: Item) -> bool:
        """Whether the state holds `item` or something newer of its node or pod."""
        if isinstance(item, FleetNode):
            node = self.nodes.get((item.cluster, item.node))
            return node is not None and (item.ts < node.ts or item == node)
        if isinstance(item, FleetUse):
            # By the node side's own revision first: the view an idle alert's end sends can
            # carry a later time than the sample after it (a later revision), and must not
            # undo that sample's view.
            use = self.uses.get((item.cluster, item.node))
            return use is not None and (item.rev, item.ts) <= (use.rev, use.ts)
        if isinstance(item, FleetOwner):
            owner = self.owners.get(item.uid)
            return owner is not None and (item.ts, item.gone) <= (owner.ts, owner.gone)
        if isinstance(item, FleetAlert):
            return False  # sent again, it goes out again: the same alert, once more
        pod = self.pods.get(item.uid)
        return pod is not None and (item.ts < pod.ts or item == pod)

    def is_noop(self, item: Item) -> bool:
        """Whether `item` would change nothing: a pod that is not waiting, a node deleted
        or an owner gone, of which nothing is known (never seen, or forgotten)."""
        if isinstance(item, FleetPod):
            return not item.waiting and item.uid not in self.pods
        if isinstance(item, FleetNode):
            return item.deleted and (item.cluster, item.node) not in self.nodes
        if isinstance(item, FleetOwner):
            return item.gone and item.uid not in self.owners
        return False

    def with_owners(self, alert: Alert) -> Alert:
        """A GPU alert with the workload owners of the pods it names (`owner`, or `owners`
        in the order of `pod_uids`); as it was where none is known."""
        labels = alert.labels
        uids = labels["pod_uids"].split(",") if "pod_uids" in labels else []
        if "pod_uid" in labels:
            uids = [labels["pod_uid"]]
        owners = [o.owner if (o := self.owners.get(uid)) is not None else "" for uid in uids]
        if not any(owners):
            return alert
        extra = {"owner": owners[0]} if len(owners) == 1 else {"owners": ",".join(owners)}
        return msgspec.structs.replace(alert, labels={**labels, **extra})

    def apply(self, item: Item) -> str | None:
        """Apply one input; the cluster it changed, None when it changed nothing (an owner,
        an alert: the caller sends the alert)."""
        if self.is_replay(item):
            return None
        if isinstance(item, FleetOwner):
            self.owners[item.uid] = item
            self.changed.add(f"owner|{item.uid}")
            return None
        if isinstance(item, FleetAlert):
            return None
        if isinstance(item, FleetNode | FleetUse):
            key = (item.cluster, item.node)
            name = f"{item.cluster}/{item.node}"
            if isinstance(item, FleetUse):
                self.uses[key] = item
                self.changed.add(f"use|{name}")
            else:
                # A deleted node is kept (as deleted) for a while: an older view of it read
                # again after a restart must not bring it back (`expire`).
                self.nodes[key] = item
                self.changed.add(f"node|{name}")
            return item.cluster
        pod = self.pods.get(item.uid)
        if pod is None and not item.waiting:
            return None
        # A pod that stopped waiting is kept (not waiting) for a while, for the same reason.
        self.pods[item.uid] = item
        self.changed.add(f"pod|{item.uid}")
        return item.cluster

    def expire(self, watermark: int) -> None:
        """Forget the deleted nodes and the pods that stopped waiting `GONE_KEEP_MS` before
        `watermark`: nothing of theirs older can be read again by then."""
        cut = watermark - GONE_KEEP_MS
        for key, node in list(self.nodes.items()):
            if node.deleted and node.ts < cut:
                del self.nodes[key]
                self.uses.pop(key, None)
                self.changed |= {f"node|{key[0]}/{key[1]}", f"use|{key[0]}/{key[1]}"}
        for uid, pod in list(self.pods.items()):
            if not pod.waiting and pod.ts < cut:
                del self.pods[uid]
                self.changed.add(f"pod|{uid}")
        for uid, owner in list(self.owners.items()):
            if owner.gone and owner.ts < cut:
                del self.owners[uid]
                self.changed.add(f"owner|{uid}")

    def evaluate(self, cluster: str, at: int) -> tuple[list[Alert], list[Capacity]]:
        """The alerts and capacity records of `cluster` at event time `at`."""
        nodes = [
            _capacity(n, self.uses.get(key))
            for key, n in self.nodes.items()
            if key[0] == cluster and not n.deleted
        ]
        waiting = [p for p in self.pods.values() if p.cluster == cluster and p.waiting]
        queued = [_queued(p) for p in waiting]
        fleet = assess(nodes, queued, now_ms=at, idle_after_ms=0)
        alerts = self._alerts(cluster, fleet.blocked, at)
        names = self._names(cluster)
        pictures = []
        seen: set[str] = set()
        for m in fleet.models:
            model = names.get(m.model, m.model)
            free_by_node = {
                NodeName(node): free[m.resource]
                for (c, node), free in fleet.free.items()
                if c == cluster and free.get(m.resource) and self._model(c, node) == m.model
            }
            picture = Capacity(
                schema="gpuwatch.capacity/v1",
                ts=at,
                cluster=cluster,
                model=model,
                product=None if m.model == UNKNOWN_MODEL else m.model,
                resource=m.resource,
                free=m.free,
                stranded=m.stranded,
                reclaimable=len(m.reclaimable),
                free_by_node=dict(sorted(free_by_node.items())),
                reclaimable_gpus=tuple(
                    ReclaimableGpu(
                        node=NodeName(node), uuid=GpuUuid(g.uuid), since=g.since, pods=g.pods
                    )
                    for node, g in m.reclaimable
                ),
                queued=m.queued,
                blocked=m.blocked,
            )
            seen.add(picture.key())
            pictures.append(picture)
        for key, old in list(self.pictures.items()):
            if old.cluster == cluster and key not in seen:
                pictures.append(
                    msgspec.structs.replace(
                        old,
                        ts=at,
                        free=0,
                        stranded=0,
                        reclaimable=0,
                        free_by_node={},
                        reclaimable_gpus=(),
                        queued=0,
                        blocked=0,
                    )
                )
        out = []
        for picture in pictures:
            key = picture.key()
            last = self.pictures.get(key)
            if last is not None and msgspec.structs.replace(last, ts=at) == picture:
                continue
            if key in seen:
                self.pictures[key] = picture
            else:
                del self.pictures[key]
            self.changed.add(f"picture|{key}")
            out.append(picture)
        return alerts, out

    def _names(self, cluster: str) -> dict[str, str]:
        """Each node label's model as NVML names it (the name the GPU series carry), where a
        node of the label has sent a sample."""
        names: dict[str, str] = {}
        for key in sorted(self.nodes):
            use = self.uses.get(key)
            node = self.nodes[key]
            if key[0] == cluster and use is not None and use.model and not node.deleted:
                names.setdefault(node.model or UNKNOWN_MODEL, use.model)
        return names

    def _model(self, cluster: str, node: str) -> str:
        return self.nodes[(cluster, node)].model or UNKNOWN_MODEL

    def _alerts(self, cluster: str, blocked: Iterable[Blocked], at: int) -> list[Alert]:
        now = {b.pod.uid: b for b in blocked}
        out = []
        for uid in sorted(u for u, run in self.blocked.items() if run.cluster == cluster):
            if uid in now:
                continue
            run = self.blocked.pop(uid)
            self.changed.add(f"blocked|{uid}")
            out.append(
                _blocked_alert(uid, run, "resolved", at, cluster=cluster, pod=self.pods.get(uid))
            )
        for uid in sorted(now):
            if uid in self.blocked:
                continue
            run = _run(now[uid], self.pods[uid], at)
            self.blocked[uid] = run
            self.changed.add(f"blocked|{uid}")
            out.append(_blocked_alert(uid, run, "firing", at, cluster=cluster, pod=self.pods[uid]))
        return out


def _queued(p: FleetPod) -> QueuedPod:
    return QueuedPod(
        uid=p.uid,
        namespace=p.namespace,
        pod=p.pod,
        request=p.request,
        since=p.since,
        models=p.models,
        cluster=p.cluster,
    )


def _run(b: Blocked, pod: FleetPod, at: int) -> BlockedRun:
    labels = {
        "namespace": pod.namespace,
        "pod": pod.pod,
        "resource": b.resource,
        "models": ",".join(pod.models) if pod.models is not None else "any",
        "wanted": str(b.wanted),
        "best_node": b.best_node or "",
        "best_free": str(b.best_free),
        "fleet_free": str(b.fleet_free),
    }
    if pod.owner is not None:
        labels["owner"] = pod.owner
    return BlockedRun(since=at, labels=with_cluster(labels, pod.cluster), cluster=pod.cluster)


def _blocked_alert(
    uid: str, run: BlockedRun, status: str, at: int, *, cluster: str, pod: FleetPod | None
) -> Alert:
    labels = run.labels
    who = f"{labels['namespace']}/{labels['pod']}"
    if status == "firing":
        summary = (
            f"{who} wants {labels['wanted']} {labels['resource']}: best node "
            f"{labels['best_node']} has {labels['best_free']} free, {labels['fleet_free']} "
            "free over the nodes it could use"
        )
    else:
        why = "no longer waiting" if pod is None or not pod.waiting else "capacity changed"
        summary = (
            f"{who} no longer blocked by fragmentation ({why}) after {(at - run.since) // 1000} s"
        )
    return Alert(
        schema="gpuwatch.alert/v1",
        fingerprint=fingerprint("PodBlockedByFragmentation", "pod", uid, cluster),
        name="PodBlockedByFragmentation",
        status="firing" if status == "firing" else "resolved",
        severity=SEVERITY["PodBlockedByFragmentation"],
        ts=at,
        since=run.since,
        subject=AlertSubject(kind="pod", uid=PodUid(uid), uuid=None, node=None),
        labels=labels,
        summary=in_cluster(summary, cluster),
        value=float(labels["wanted"]),
        cluster=cluster,
    )
