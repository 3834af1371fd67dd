"""The fleet partition: node views, waiting pods and marks in; capacity and fragmentation out.

Partition `FLEET_PARTITION` of the worker's internal fleet topic (`<prefix><app_id>.fleet`)
gets every node's capacity view from the node side and every pod's waiting request and
each pod partition's watermark marks from the pod side; the pod side's processor of that
partition hosts this one (`PodPartition`), so its state lives in the pod table under
`@fleet|` keys and its positions with the partition's.

Inputs wait in memory, by the step of event time they belong to, until the lowest mark of
every node and pod partition has passed the step's end (`streams.core.fleet.fleet_state`).
A partition marks a watermark once it has applied a tick of it, and a tick is applied once
the partition has read every input that was in Kafka when it was sent: a pod partition has
sent the requests of the pods that watermark released, a node partition what its node
events and samples up to then said (a sample's use no earlier than its usage frontier,
which is never behind the watermark), before the mark, into the same topic partition. So
when the marks pass a step its inputs are all here, however the inputs were interleaved:
a node event read after samples far ahead of it counts at its own time. As on the pod
side, what waits is not stored: the stored positions stay at the oldest input waiting, and
what a restart reads again that the state already holds is skipped (`FleetState.is_replay`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import msgspec

from schemas.capacity import Capacity
from schemas.topics import ALERTS, CAPACITY
from streams.core.fleet.fleet_state import (
    FLEET_PARTITION,
    STEP_MS,
    BlockedRun,
    FleetAlert,
    FleetMark,
    FleetNode,
    FleetOwner,
    FleetPod,
    FleetState,
    FleetUse,
    Item,
    decode_input,
    step_of,
)
from streams.core.pod.pod_state import PodState
from streams.processors.outputs import Counters, Outputs, Source

__all__ = ["FLEET_KEY", "FLEET_PARTITION", "FleetPartition", "fleet_pod"]

FLEET_KEY = b"@fleet|"
"""Prefix of the fleet partition's keys in the pod table (no pod uid starts with "@")."""
FLEET_META = FLEET_KEY + b"meta"
"""Its marks and last step evaluated (`FleetPartition.checkpoint`)."""


def fleet_pod(state: PodState, ts: int, *, waiting: bool) -> FleetPod:
    """A pod's request as of a transition at `ts` into, within or out of queued: `waiting`
    while it is queued and bound to no node. A pod's GPU request and allowed models do not
    change over its life; they are taken from its state."""
    owner = state.owner
    return FleetPod(
        uid=state.uid,
        namespace=state.namespace,
        pod=state.name,
        cluster=state.cluster_name(),
        ts=ts,
        waiting=waiting,
        request=state.gpu_request,
        models=state.gpu_products,
        since=state.created_at or ts,
        owner=None if owner is None else f"{owner.kind}/{owner.name}",
    )


_Waiting = tuple[int, int, int, int, Item]
"""(step, its kind's rank (`_KIND`: nodes, uses, pods and owners, alerts), event time,
arrival, input)."""
_KIND = {FleetNode: 0, FleetUse: 1, FleetPod: 2, FleetOwner: 2, FleetAlert: 3}


class FleetPartition:
    """The fleet partition's state and the inputs waiting for the marks."""

    def __init__(
        self, partitions: int, counters: Counters, stored: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        self.state = FleetState(partitions=partitions)
        self.counters = counters
        self._waiting: list[_Waiting] = []
        self._offsets: dict[int, int] = {}
        """Arrival number -> offset of each waiting input."""
        self._topic: str | None = None
        self._arrivals = 0
        for key, raw in stored:
            self._load(key.removeprefix(FLEET_KEY).decode(), raw)
        self.state.changed.clear()

    def _load(self, key: str, raw: bytes) -> None:
        kind, _, name = key.partition("|")
        s = self.state
        if kind == "node":
            node = msgspec.json.decode(raw, type=FleetNode)
            s.nodes[(node.cluster, node.node)] = node
        elif kind == "owner":
            owner = msgspec.json.decode(raw, type=FleetOwner)
            s.owners[owner.uid] = owner
        elif kind == "use":
            use = msgspec.json.decode(raw, type=FleetUse)
            s.uses[(use.cluster, use.node)] = use
        elif kind == "pod":
            pod = msgspec.json.decode(raw, type=FleetPod)
            s.pods[pod.uid] = pod
        elif kind == "blocked":
            s.blocked[name] = msgspec.json.decode(raw, type=BlockedRun)
        elif kind == "picture":
            s.pictures[name] = CAPACITY.decode(raw)
        elif kind == "meta":
            meta = json.loads(raw)
            s.marks = {(side, int(p)): int(w) for side, p, w in meta["marks"]}
            s.evaluated = meta.get("evaluated")

    def handle(self, source: Source, raw: bytes, out: Outputs) -> int | None:
        """One input of the fleet topic; its event time, None when rejected."""
        self._topic = source.topic
        try:
            item = decode_input(raw)
        except msgspec.DecodeError as exc:
            out.dead(source, raw, f"not a fleet input: {exc}", "schema")
            return None
        if isinstance(item, FleetMark):
            if self.state.mark(item):
                self._advance(out)
            return None
        if self.state.is_replay(item):
            self.counters.duplicates += 1  # read again after a restart: the state has it
            return item.ts
        step = step_of(item.ts)
        wm, evaluated = self.state.watermark(), self.state.evaluated
        if evaluated is not None and step <= evaluated:
            # Its second is evaluated already. Changing nothing, it was sent again by a
            # restarted side (an input of a second not yet evaluated waits instead, and may
            # come before the one it undoes).
            if self.state.is_noop(item):
                self.counters.duplicates += 1
                return item.ts
            # Applied in the next second evaluated. A change is late (a node event the
            # watcher sent late; a late pod event is counted where the pod side applies it);
            # an alert sent again by a restarted node side goes out again, as the node side
            # would send it, and is not.
            if not isinstance(item, FleetAlert | FleetPod):
                self.counters.applied_late += 1
            step = evaluated + STEP_MS
        self._arrivals += 1
        kind = _KIND[type(item)]
        self._waiting.append((step, kind, item.ts, self._arrivals, item))
        self._offsets[self._arrivals] = source.offset
        if wm is not None and step <= wm:
            self._advance(out)
        return item.ts

    def _advance(self, out: Outputs) -> None:
        """Apply and evaluate every step the marks have passed, in event time."""
        wm = self.state.watermark()
        if wm is None or not self._waiting:
            return
        self._waiting.sort(key=lambda w: w[:4])
        cut = 0
        while cut < len(self._waiting) and self._waiting[cut][0] <= wm:
            cut += 1
        ready, self._waiting = self._waiting[:cut], self._waiting[cut:]
        s = self.state
        at = 0
        clusters: set[str] = set()
        for n, (step, _, _, arrival, item) in enumerate(ready):
            del self._offsets[arrival]
            if isinstance(item, FleetAlert):
                out.emit(ALERTS, s.with_owners(item.alert))  # its pods' owners as of its step
            elif (cluster := s.apply(item)) is not None:
                clusters.add(cluster)
            at = step
            if n + 1 < len(ready) and ready[n + 1][0] == step:
                continue
            for name in sorted(clusters):
                alerts, pictures = s.evaluate(name, at)
                out.emit_all(ALERTS, alerts)
                out.emit_all(CAPACITY, pictures)
            clusters.clear()
            s.evaluated = at
            s.changed.add("meta")
        s.expire(wm)

    def resume_offsets(self) -> dict[str, int]:
        """The oldest offset still waiting: where a restart must read the fleet topic from."""
        if self._topic is None or not self._offsets:
            return {}
        return {self._topic: min(self._offsets.values())}

    def take_writes(self) -> list[tuple[bytes, bytes | None]]:
        """The keys changed since the last call (None: delete)."""
        s = self.state
        writes: list[tuple[bytes, bytes | None]] = []
        for changed in sorted(s.changed):
            kind, _, name = changed.partition("|")
            key = changed
            value: bytes | None = None
            if kind in ("node", "use"):
                cluster, _, node = name.partition("/")
                known = (s.nodes if kind == "node" else s.uses).get((cluster, node))
                value = None if known is None else msgspec.json.encode(known)
            elif kind == "pod":
                pod = s.pods.get(name)
                value = None if pod is None else msgspec.json.encode(pod)
            elif kind == "owner":
                owner = s.owners.get(name)
                value = None if owner is None else msgspec.json.encode(owner)
            elif kind == "blocked":
                run = s.blocked.get(name)
                value = None if run is None else msgspec.json.encode(run)
            elif kind == "picture":
                picture: Capacity | None = s.pictures.get(name)
                value = None if picture is None else CAPACITY.encode(picture)
            elif kind in ("meta", "marks"):
                continue  # with the positions (`checkpoint`)
            writes.append((FLEET_KEY + key.encode(), value))
        s.changed.clear()
        return list(dict(writes).items())

    def checkpoint(self) -> tuple[bytes, bytes]:
        """The marks and the last step evaluated, stored with the positions they go with
        (`agent_loop`, CHECKPOINT): stored ahead of the other keys, the inputs of the
        steps evaluated since would be read again as late."""
        s = self.state
        marks = [[side, p, w] for (side, p), w in sorted(s.marks.items())]
        return FLEET_META, json.dumps({"marks": marks, "evaluated": s.evaluated}).encode()
