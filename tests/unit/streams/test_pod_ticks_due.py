"""A tick steps only the pods something is due of: the outputs equal stepping every pod.

The reference here is the plain rule (every pod of the partition released and stepped to
every new watermark, in uid order; an input ahead of the watermark held, one behind it
applied at once); `PodPartition` steps the pods `next_due` names and catches a pod up
before a late input. Over generated histories of several pods both publish the same
records in the same order, and forget the same finished pods.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pod_fixtures import RULES, UID, WINDOWS, pod, usage
from test_pod_properties import Input, Tick, histories

from schemas import ALERTS, ATTRIBUTION, K8S_PODS, POD_LIFECYCLE, POD_USAGE
from schemas.codec import TopicSpec
from schemas.ids import PodUid
from schemas.k8s_pod import K8sPod
from schemas.pod_usage import PodUsage
from streams.core.pod.pod_state import Held, PodState, new_state
from streams.core.pod.pod_step import (
    next_due,
    release,
    step_pod_event,
    step_usage,
    step_watermark,
)
from streams.core.ticks import Tick as WorkerTick
from streams.processors.outputs import Counters, Outputs, Source
from streams.processors.pod import FINISHED_KEEP_MS, PodConfig, PodPartition

S = 1000
PREFIX = "t."
PODS, USAGE = K8S_PODS.full_name(PREFIX), POD_USAGE.full_name(PREFIX)
UIDS = [PodUid(f"{i}{UID[1:]}") for i in range(1, 4)]
OUTPUTS: tuple[TopicSpec[Any], ...] = (POD_LIFECYCLE, ATTRIBUTION, ALERTS)


class EveryPod:
    """The reference: every pod stepped on every tick whose watermark moved."""

    def __init__(self) -> None:
        self.pods: dict[PodUid, PodState] = {}
        self.held: dict[PodUid, list[Held]] = {}
        self.applied: int | None = None
        self.records: list[tuple[str, Any]] = []

    def feed(self, item: Input) -> None:
        if isinstance(item, Tick):
            if self.applied is not None and item.now_ms <= self.applied:
                return
            self.applied = item.now_ms
            for uid in sorted(self.pods):
                held = self.held.get(uid, [])
                ready = [h for h in held if h.key <= item.now_ms]
                self.held[uid] = held[len(ready) :]
                after, out = release(self.pods[uid], ready, item.now_ms, RULES, WINDOWS)
                self._publish(out)
                finished = after.state == "finished" and not after.windows and not self.held[uid]
                if finished and item.now_ms >= after.since + FINISHED_KEEP_MS:
                    del self.pods[uid]
                else:
                    self.pods[uid] = after
            return
        before = self.pods.get(item.uid)
        key = item.ts + 1 if isinstance(item, PodUsage) else item.ts
        if self.applied is None or key > self.applied:
            held = (
                Held(key=key, usage=item)
                if isinstance(item, PodUsage)
                else Held(key=key, event=item)
            )
            queue = self.held.setdefault(item.uid, [])
            queue.append(held)
            queue.sort(key=Held.order)  # stable: arrival order at one time
            self.pods.setdefault(item.uid, before or new_state(item.uid))
            return
        if isinstance(item, PodUsage):
            after, out = step_usage(before, item, RULES, WINDOWS)
        else:
            after, out = step_pod_event(before, item, RULES, WINDOWS)
        self._publish(out)
        self.pods[item.uid] = after

    def _publish(self, out: Any) -> None:
        for spec, records in zip(OUTPUTS, out[:3], strict=True):
            self.records += [(spec.name, r) for r in records]


def due_only(inputs: list[Input]) -> tuple[list[tuple[str, Any]], PodPartition]:
    counters = Counters()
    part = PodPartition(0, PodConfig(PREFIX, 1, RULES, WINDOWS), counters)
    out = Outputs(PREFIX, counters)
    for offset, item in enumerate(inputs):
        if isinstance(item, Tick):
            # The watermark is the usage frontier, the lateness behind the claim.
            late_ms = WINDOWS.allowed_lateness_s * S
            part.on_tick(WorkerTick(sender="w", claims={0: item.now_ms + late_ms}), out)
        elif isinstance(item, PodUsage):
            part.handle(Source(USAGE, 0, offset, None), POD_USAGE.encode(item), out)
        else:
            part.handle(Source(PODS, 0, offset, item.uid.encode()), K8S_PODS.encode(item), out)
    assert counters.deadletter == 0
    records = []
    for record in out.records:
        spec = next(s for s in OUTPUTS if s.full_name(PREFIX) == record.topic)
        records.append((spec.name, spec.decode(record.value)))
    return records, part


# The generated histories start at event time 1,000 s; the processor's checks want real
# epoch times, so each is moved by a whole number of windows.
SHIFT = 1_764_399_960_000


def _at(ts: int | None) -> int | None:
    return None if ts is None else ts + SHIFT


def as_pod(item: Input, uid: PodUid) -> Input:
    """`item` of the pod `uid`, at real epoch times."""
    if isinstance(item, Tick):
        return Tick(item.now_ms + SHIFT)
    if isinstance(item, PodUsage):
        return msgspec.structs.replace(
            item,
            uid=uid,
            ts=item.ts + SHIFT,
            end_ts=item.end_ts + SHIFT,
            idle_since=_at(item.idle_since),
        )
    return msgspec.structs.replace(
        item,
        uid=uid,
        ts=item.ts + SHIFT,
        created_at=item.created_at + SHIFT,
        scheduled_at=_at(item.scheduled_at),
        started_at=_at(item.started_at),
        finished_at=_at(item.finished_at),
    )


@st.composite
def fleets(draw: st.DrawFn) -> list[Input]:
    """Histories of three pods, interleaved in a drawn order that keeps each pod's own."""
    queues = [[as_pod(i, uid) for i in draw(histories())] for uid in UIDS]
    merged: list[Input] = []
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues if q]))
        merged.append(queue.pop(0))
    return merged


@settings(max_examples=100, deadline=None)
@given(fleets())
def test_stepping_the_due_pods_publishes_what_stepping_every_pod_does(inputs: list[Input]) -> None:
    reference = EveryPod()
    for item in inputs:
        reference.feed(item)
    records, part = due_only(inputs)
    assert records == reference.records
    assert sorted(part.pods) == sorted(reference.pods)


T = 1_000 * S


def running_at(ts: int) -> K8sPod:
    return pod("Running", ts=ts, rv=1, created_at=ts)


def test_a_running_pod_with_nothing_open_is_not_due() -> None:
    state, _ = step_pod_event(None, running_at(1_000 * S), RULES, WINDOWS)
    assert next_due(state, RULES, WINDOWS) is None


def test_due_names_the_window_close_the_queued_alert_and_the_forgetting() -> None:
    queued, _ = step_pod_event(None, pod("Pending", ts=T, rv=1, created_at=T), RULES, WINDOWS)
    assert next_due(queued, RULES, WINDOWS) == 1_000 * S + RULES.queued_alert_after_s * S
    running, _ = step_pod_event(None, running_at(1_000 * S), RULES, WINDOWS)
    counted, _ = step_usage(running, usage(1_000 * S, 1_005 * S), RULES, WINDOWS)
    window_ms = WINDOWS.window_s * S
    start = 1_000 * S - 1_000 * S % window_ms
    assert next_due(counted, RULES, WINDOWS) == start + window_ms
    done, _ = step_pod_event(counted, pod("Succeeded", ts=1_006 * S, rv=2), RULES, WINDOWS)
    # Its usage stops short of the finish: the window holding the finish ends first.
    assert next_due(done, RULES, WINDOWS) == start + window_ms
    reached, _ = step_usage(done, usage(1_005 * S, 1_007 * S), RULES, WINDOWS)
    assert next_due(reached, RULES, WINDOWS) == 1_006 * S
    closed, out = step_watermark(reached, 1_006 * S, RULES, WINDOWS)
    assert out.attributions
    assert next_due(closed, RULES, WINDOWS) == 1_006 * S + FINISHED_KEEP_MS


def test_a_tick_steps_only_the_due_pods() -> None:
    counters = Counters()
    part = PodPartition(0, PodConfig(PREFIX, 1, RULES, WINDOWS), counters)
    out = Outputs(PREFIX, counters)
    for n, uid in enumerate(UIDS):
        event: K8sPod = pod("Running", ts=SHIFT, rv=1, uid=uid, created_at=SHIFT)
        part.handle(Source(PODS, 0, n, uid.encode()), K8S_PODS.encode(event), out)
    busy = usage(SHIFT, SHIFT + 5 * S, uid=UIDS[0])
    part.handle(Source(USAGE, 0, 0, None), POD_USAGE.encode(busy), out)
    part.on_tick(WorkerTick(sender="w", claims={0: SHIFT + 10 * S}), out)
    part.take_writes()
    before = dict(part.pods)
    part.on_tick(WorkerTick(sender="w", claims={0: SHIFT + 1_000 * S}), out)
    assert counters.deadletter == 0
    assert [r.topic for r in out.records].count(ATTRIBUTION.full_name(PREFIX)) == 1
    assert part.pods[UIDS[1]] is before[UIDS[1]]  # nothing due: not stepped
    assert part.pods[UIDS[0]] is not before[UIDS[0]]
