"""The pod side of one partition: pod events and usage in; lifecycle, attribution, alerts out.

`k8s.pods` and `pod.usage` are both keyed by pod uid and co-partitioned, so one partition
holds every input of its pods: the join is a dict of `PodState` by uid, stored in a table
(Faust's stream and table joins are not implemented).

The pod side's watermark is the lowest usage frontier of the node partitions that are
not idle (`streams.core.ticks.SourceWatermarks`, SEMANTICS.md, Time); a pod event's time never
moves it. An input ahead of it is held, in memory, in release order; each tick releases,
pod by pod, the held inputs it reached in event-time order (`pod_step.release`),
so the records are the same however pod events and usage were interleaved on the way in:
live, a day behind, or read again after a crash. An input at or behind the watermark is
applied at once (a pod event late by its own time is counted late). A tick steps only the
pods something is due of (`next_due`: a held input, a window to close, a queued alert, a
finished pod to forget), and a pod's late input first steps it to the watermark it missed,
so the outputs are those of stepping every pod on every tick at a fraction of the work.

Held inputs are not stored with the state: a pod holding an hour of usage in a backlog
(its node partition far ahead of the slowest) would rewrite it all every few seconds.
Instead the partition's stored positions stay at the oldest input still held
(`resume_offsets`), so a restart reads the held inputs again (and skips, as replays, what
was released since). A finished pod forgotten meanwhile (an hour after it finished) has
no state to tell a replay by: its newest input offsets and the end of its usage counted
are stored (`FORGOTTEN`, `pod_state.Forgotten`), and an input at or before those offsets,
or usage ending at or before that end, is skipped. The end catches usage a restarted
node side sends again at new offsets: its stored state (written every few seconds) can
be hours of event time behind the claims the pod side's watermark took in a backlog.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from schemas.alert import Alert
from schemas.ids import PodUid
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from schemas.settings import RuleSettings, WindowSettings
from schemas.topics import ALERTS, ATTRIBUTION, K8S_PODS, POD_LIFECYCLE, POD_USAGE
from streams.core.fleet.fleet_state import FleetMark, FleetOwner, encode_input
from streams.core.node.usage import FLUSH_MS
from streams.core.pod import pod_state
from streams.core.pod.pod_alerts import still_firing
from streams.core.pod.pod_state import Forgotten, Held, PodState, new_state
from streams.core.pod.pod_step import (
    FINISHED_KEEP_MS,
    PodOutputs,
    next_due,
    release,
    rules_of,
    step_pod_event,
    step_usage,
    step_watermark,
)
from streams.core.sanity import MAX_CLOCK_SKEW_MS, check_pod
from streams.core.ticks import SourceWatermarks, Tick, usage_frontier
from streams.processors.fleet import (
    FLEET_KEY,
    FLEET_PARTITION,
    FleetPartition,
    fleet_pod,
)
from streams.processors.outputs import Counters, Outputs, Source
from streams.processors.workloads import WORKLOAD_KEY, WorkloadPartition

__all__ = ["FINISHED_KEEP_MS", "FORGOTTEN", "SENT_AGAIN_KEEP_MS", "PodConfig", "PodPartition"]

FORGOTTEN = b"@forgotten|"  # key prefix of a forgotten pod's record (no uid starts with "@")
# How long (event time) after it was forgotten a pod's usage may still be sent again: a
# restarted node side sends again what came after its stored state, written every 5 s and
# whenever its stream time moved an hour (`STATE_EVERY_EVENT_MS`: a backlog goes through
# hours of event time in 5 s), so at most about an hour and a batch behind the claims the
# watermark took; six times that.
SENT_AGAIN_KEEP_MS = 6 * 3_600_000


@dataclass(frozen=True)
class PodConfig:
    """What every pod partition of a worker shares."""

    prefix: str
    partitions: int
    rules: RuleSettings
    windows: WindowSettings
    live: Callable[[PodUsage], None] | None = None
    """Called with each pod usage once processed (live share and VRAM for the sinks)."""
    now_ms: Callable[[], int] | None = None
    """The wall clock: a pod event ahead of it by more than the clock skew allowed is
    refused."""
    max_clock_skew_ms: int = MAX_CLOCK_SKEW_MS
    """How far ahead of `now_ms` a pod event's time may be (`GPUWATCH_MAX_CLOCK_SKEW_S`)."""
    flush_ms: int = FLUSH_MS
    """The node side's usage flush period (for its usage frontier)."""
    firing: Callable[[Alert], None] | None = None
    """Called, when a partition is made from stored state, with each alert that state says
    is firing (`pod_alerts.still_firing`): shown again by the metrics, not sent again."""
    fleet_topic: str | None = None
    """The internal fleet topic (`streams.processors.fleet`): each partition sends its pods'
    waiting requests and its marks there, and the fleet partition's processor is hosted by
    this side's of the same number. None: no fleet capacity."""

    def frontier(self, stream_time: int) -> int:
        """The usage frontier of a node partition at `stream_time`."""
        w = self.windows
        return usage_frontier(
            stream_time, w.allowed_lateness_s * 1000, self.flush_ms, w.window_s * 1000
        )


class PodPartition:
    """The pods of one partition, the node-side claims it has seen and its watermark."""

    def __init__(
        self,
        partition: int,
        config: PodConfig,
        counters: Counters,
        stored: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        self.partition = partition
        self.config = config
        self.counters = counters
        self.pods: dict[PodUid, PodState] = {}
        self._due: dict[PodUid, int] = {}
        """Stream time at which each pod next needs a watermark step (`next_due`)."""
        self._stepped: dict[PodUid, int] = {}
        """The watermark each pod was last stepped to."""
        self._held: dict[PodUid, list[Held]] = {}
        """Each pod's inputs ahead of the watermark, in release order."""
        self._held_at: dict[str, dict[int, PodUid]] = {}
        """Offsets of the held inputs, by topic (a redelivery of one is a duplicate)."""
        self._held_offsets: dict[tuple[PodUid, int], tuple[str, int]] = {}
        self._read_at: dict[PodUid, dict[str, int]] = {}
        """Each pod's newest input offset by topic."""
        self._forgotten: dict[PodUid, Forgotten] = {}
        """What is kept of forgotten pods until no input of theirs can come again: one
        that finds no state would start the pod anew (re-emitting its windows with only
        what came again over the complete records)."""
        self._forgotten_changed: set[PodUid] = set()
        self._fleet_due: list[PodLifecycle] = []
        """The transitions into, within or out of queued not yet told the fleet partition."""
        hosts_fleet = config.fleet_topic is not None and partition == FLEET_PARTITION
        self.fleet = (
            FleetPartition(
                config.partitions, counters, [kv for kv in stored if kv[0].startswith(FLEET_KEY)]
            )
            if hosts_fleet
            else None
        )
        self.workloads = WorkloadPartition(
            config.prefix,
            config.rules,
            counters,
            [kv for kv in stored if kv[0].startswith(WORKLOAD_KEY)],
        )
        for key, raw in stored:
            if key.startswith((FLEET_KEY, WORKLOAD_KEY)):
                continue
            if key.startswith(FORGOTTEN):
                uid = PodUid(key[len(FORGOTTEN) :].decode())
                self._forgotten[uid] = pod_state.decode_forgotten(raw)
            else:
                self._keep(pod_state.decode(raw))
        if config.firing is not None:
            for uid in sorted(self.pods):
                state = self.pods[uid]
                for alert in still_firing(state, rules_of(state, config.rules)):
                    config.firing(alert)
        self.sources = SourceWatermarks(config.partitions, config.frontier)
        self.stream_time: int | None = None
        """Largest event time of the partition's inputs."""
        self.applied: int | None = None
        """The watermark applied last: inputs at or behind it are applied at once."""
        self._pods_topic = K8S_PODS.full_name(config.prefix)
        self._dirty: set[PodUid] = set()
        self._gone: set[PodUid] = set()

    def handle(self, source: Source, raw: bytes | None, out: Outputs) -> int | None:
        """Process one input message; its event time, or None when it was rejected."""
        raw = out.admit(source, raw)
        if raw is None:
            return None
        if source.topic == self._pods_topic:
            at = self._pod_event(source, raw, out)
        elif source.topic == self.config.fleet_topic:
            if self.fleet is None:
                out.dead(
                    source, raw, "fleet input on a partition other than the fleet's", "internal"
                )
                return None
            return self.fleet.handle(source, raw, out)
        elif source.topic == self.workloads.topic:
            return self.workloads.handle(source, raw, out)
        else:
            at = self._usage(source, raw, out)
        if self._fleet_due:
            self._send_fleet(out)  # a late input applied at once
        return at

    def on_tick(self, tick: Tick, out: Outputs) -> None:
        """A tick whose data is in: release and step the pods due by the new watermark."""
        self.counters.ticks += 1
        wm = self.sources.update(tick.claims, tick.idle)
        if wm is None or (self.applied is not None and wm <= self.applied):
            return
        self.applied = wm
        c = self.config
        self.workloads.on_watermark(wm, out)
        for uid in sorted(uid for uid, at in self._due.items() if at <= wm):
            state = self.pods[uid]
            held = self._held.get(uid)
            if held and held[0].key <= wm:
                cut = bisect.bisect_right(held, (wm, 1), key=Held.order)
                ready, rest = held[:cut], held[cut:]
                self._unhold(uid, ready, rest)
                after, outputs = release(state, ready, wm, c.rules, c.windows)
                self.counters.late += outputs.late_usage
                self.counters.revisions += outputs.revisions
                self._publish(outputs, out)
                self._stepped[uid] = wm
                self._keep(after)
                if after != state:
                    self._dirty.add(uid)
            else:
                after = self._catch_up(state, out)
            finished = after.state == "finished" and not after.windows and uid not in self._held
            if finished and wm >= after.since + FINISHED_KEEP_MS:
                del self.pods[uid]
                self._due.pop(uid, None)
                self._stepped.pop(uid, None)
                self._gone.add(uid)
                self._forget(after, wm)
        if self._forgotten:
            resume = self.resume_offsets()
            for uid, kept in list(self._forgotten.items()):
                if _expired(kept, resume, wm):
                    del self._forgotten[uid]
                    self._forgotten_changed.add(uid)
        if c.fleet_topic is not None:
            self._send_fleet(out)
            out.emit_raw(
                c.fleet_topic,
                b"",
                encode_input(FleetMark(side="pod", partition=self.partition, watermark=wm)),
                FLEET_PARTITION,
            )

    def _send_fleet(self, out: Outputs) -> None:
        """What the fleet partition is told of the pods whose lifecycle moved: a GPU pod's
        waiting request at each transition into, within or out of queued; a pod's workload
        owner at its first transition and at its finish (GPU alerts name it)."""
        topic = self.config.fleet_topic
        due, self._fleet_due = self._fleet_due, []
        if topic is None:
            return
        for rec in due:
            state = self.pods.get(rec.uid)
            if state is None:
                continue
            owner = state.owner
            if owner is not None and (rec.from_state is None or rec.to_state == "finished"):
                told = FleetOwner(
                    uid=rec.uid,
                    owner=f"{owner.kind}/{owner.name}",
                    ts=rec.ts,
                    gone=rec.to_state == "finished",
                )
                out.emit_raw(topic, b"", encode_input(told), FLEET_PARTITION)
            if state.gpu_request and "queued" in (rec.from_state, rec.to_state):
                waiting = rec.to_state == "queued" and rec.node is None
                value = encode_input(fleet_pod(state, rec.ts, waiting=waiting))
                out.emit_raw(topic, b"", value, FLEET_PARTITION)

    def _forget(self, state: PodState, wm: int) -> None:
        """Keep what tells a forgotten pod's inputs applied while one could come again."""
        kept = pod_state.forgotten(state, self._read_at.pop(state.uid, {}))
        if not _expired(kept, self.resume_offsets(), wm):
            self._forgotten[state.uid] = kept
            self._forgotten_changed.add(state.uid)

    def _catch_up(self, state: PodState, out: Outputs) -> PodState:
        """The pod stepped to the watermark applied last, unless it was already."""
        uid, wm = state.uid, self.applied
        if wm is None or self._stepped.get(uid) == wm:
            return state
        c = self.config
        after, outputs = step_watermark(state, wm, c.rules, c.windows)
        self._publish(outputs, out)
        self._stepped[uid] = wm
        self._keep(after)
        # A watermark alone moves `horizon`; storing that for every pod on every tick
        # would rewrite the whole table each second. Stepping to it again is a no-op.
        if msgspec.structs.replace(after, horizon=state.horizon) != state:
            self._dirty.add(uid)
        return after

    def _keep(self, state: PodState) -> None:
        """Hold a pod's state and when it is next due."""
        self.pods[state.uid] = state
        due = next_due(state, self.config.rules, self.config.windows)
        held = self._held.get(state.uid)
        if held:
            due = held[0].key if due is None else min(due, held[0].key)
        if due is None:
            self._due.pop(state.uid, None)
        else:
            self._due[state.uid] = due

    def take_writes(self) -> list[tuple[bytes, bytes | None]]:
        """States changed since the last call (None: delete)."""
        writes: list[tuple[bytes, bytes | None]] = [(uid.encode(), None) for uid in self._gone]
        writes += [
            (uid.encode(), pod_state.encode(self.pods[uid]))
            for uid in sorted(self._dirty)
            if uid in self.pods
        ]
        writes += [
            (FORGOTTEN + uid.encode(), _encode_forgotten(self._forgotten.get(uid)))
            for uid in sorted(self._forgotten_changed)
        ]
        self._dirty.clear()
        self._gone.clear()
        self._forgotten_changed.clear()
        writes += self.workloads.take_writes()
        if self.fleet is not None:
            writes += self.fleet.take_writes()
        return writes

    def checkpoint(self) -> tuple[bytes, bytes] | None:
        """The fleet partition's marks, where this partition hosts it (`agent_loop`)."""
        return None if self.fleet is None else self.fleet.checkpoint()

    def _pod_event(self, source: Source, raw: bytes, out: Outputs) -> int | None:
        c = self.config
        event = out.decode(
            K8S_PODS,
            source,
            raw,
            check_pod,
            now_ms=c.now_ms,
            max_ahead_ms=c.max_clock_skew_ms,
            keyed=True,
        )
        if event is None:
            return None
        self._input(source, Held(key=event.ts, event=event), out)
        self._observe(event.ts)
        return event.ts

    def _usage(self, source: Source, raw: bytes, out: Outputs) -> int | None:
        usage = out.decode(POD_USAGE, source, raw)
        if usage is None:
            return None
        c = self.config
        # Released once the watermark is past its start: no usage starting before the
        # usage frontier can come later (SEMANTICS.md, Time).
        self._input(source, Held(key=usage.ts + 1, usage=usage), out)
        self._observe(usage.end_ts)
        if c.live is not None:
            c.live(usage)  # live share and VRAM need not wait for the watermark
        return usage.end_ts

    def resume_offsets(self) -> dict[str, int]:
        """The oldest offset still held of each input: where a restart must read from."""
        held = {topic: min(offsets) for topic, offsets in self._held_at.items() if offsets}
        held.update(self.workloads.resume_offsets())
        if self.fleet is not None:
            held.update(self.fleet.resume_offsets())
        return held

    def _unhold(self, uid: PodUid, ready: list[Held], rest: list[Held]) -> None:
        for item in ready:
            topic, offset = self._held_offsets.pop((uid, id(item)))
            self._held_at[topic].pop(offset, None)
        if rest:
            self._held[uid] = rest
        else:
            del self._held[uid]

    def _input(self, source: Source, item: Held, out: Outputs) -> None:
        """Hold an input ahead of the watermark; apply one at or behind it at once."""
        c = self.config
        uid = item.event.uid if item.event is not None else item.usage.uid  # type: ignore[union-attr]
        gone = self._forgotten.get(uid)
        if gone is not None and gone.replays(source.topic, source.offset, item.usage):
            self.counters.duplicates += 1  # read or sent again after a restart: applied, forgotten
            return
        read = self._read_at.setdefault(uid, {})
        read[source.topic] = max(read.get(source.topic, -1), source.offset)
        if self.applied is None or item.key > self.applied:
            offsets = self._held_at.setdefault(source.topic, {})
            if source.offset in offsets:
                self.counters.duplicates += 1  # a redelivery of an input still held
                return
            offsets[source.offset] = uid
            self._held_offsets[(uid, id(item))] = (source.topic, source.offset)
            bisect.insort(self._held.setdefault(uid, []), item, key=Held.order)
            state = self.pods.get(uid)
            if state is None:
                state = new_state(uid)
                if self.applied is not None:
                    self._stepped[uid] = self.applied  # new: nothing of older ticks to catch up
            self._keep(state)
            self._gone.discard(uid)
            return
        before = self._current(uid, out)
        if item.event is not None:
            after, outputs = step_pod_event(before, item.event, c.rules, c.windows)
            if after != before:
                self.counters.applied_late += 1  # behind the watermark by its own time
        else:
            assert item.usage is not None  # an input is one or the other
            after, outputs = step_usage(before, item.usage, c.rules, c.windows)
            self.counters.late += outputs.late_usage
            self.counters.revisions += outputs.revisions
        self._store(before, after, outputs, out)

    def _store(
        self, before: PodState | None, after: PodState, outputs: PodOutputs, out: Outputs
    ) -> None:
        self._publish(outputs, out)
        if after == before:
            self.counters.duplicates += 1
            return
        if before is None and self.applied is not None:
            # New since the last tick: stepping every pod would not have stepped it yet.
            self._stepped[after.uid] = self.applied
        self._keep(after)
        self._dirty.add(after.uid)
        self._gone.discard(after.uid)

    def _current(self, uid: PodUid, out: Outputs) -> PodState | None:
        """A pod's state as of the watermark applied last (None: a pod not seen)."""
        state = self.pods.get(uid)
        return None if state is None else self._catch_up(state, out)

    def _publish(self, outputs: PodOutputs, out: Outputs) -> None:
        if self.config.fleet_topic is not None:
            self._fleet_due += [
                r
                for r in outputs.lifecycle
                if "queued" in (r.from_state, r.to_state)
                or r.from_state is None
                or r.to_state == "finished"
            ]
        out.emit_all(POD_LIFECYCLE, outputs.lifecycle)
        out.emit_all(ATTRIBUTION, outputs.attributions)
        out.emit_all(ALERTS, outputs.alerts)

    def _observe(self, ts: int) -> None:
        if self.stream_time is None or ts > self.stream_time:
            self.stream_time = ts


def _read_before(read: dict[str, int], resume: dict[str, int]) -> bool:
    """Whether a pod's newest input offsets (`read`) are all before where a restart reads
    again (`resume`, the oldest held input of each topic)."""
    return all(offset < resume[topic] for topic, offset in read.items() if topic in resume)


def _expired(kept: Forgotten, resume: dict[str, int], wm: int) -> bool:
    """Whether no input of a forgotten pod can come again: none read again by a restart
    (`_read_before`), and its usage past the time it may be sent again."""
    if not _read_before(kept.read, resume):
        return False
    return kept.attributed_until is None or wm >= kept.since + FINISHED_KEEP_MS + SENT_AGAIN_KEEP_MS


def _encode_forgotten(kept: Forgotten | None) -> bytes | None:
    return None if kept is None else pod_state.encode_forgotten(kept)
