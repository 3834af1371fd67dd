"""The workloads of one pod partition: `k8s.workloads` in; `workload.lifecycle` and alerts out.

`k8s.workloads` is keyed by workload uid and co-partitioned with the pod side's inputs,
so partition `q` of it is read by the pod side's partition `q`, which hosts this one
(`PodPartition`) and hands it each new watermark. A workload value is held until the
watermark reaches its `ts`, then applied in `ts` order (ties in the order read), each
workload stepped to the value's time first; then the queued workloads are stepped to the
watermark, so WorkloadQueuedTooLong fires when its time comes however the values and the
other inputs were interleaved (`streams.core.workload.workload_step`). A value behind the watermark
is applied at once and counted late. As on the pod side, held values are not stored: the
partition's stored positions stay at the oldest one held, and what a restart reads again
that a workload's state holds is skipped (`workload_step.is_replay`). A deleted
workload's state goes an hour (event time) after its finish; a finished one still in the
API server stays, as relists send it again.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import NamedTuple

from schemas.k8s_workload import K8sWorkload
from schemas.settings import RuleSettings
from schemas.topics import ALERTS, K8S_WORKLOADS, WORKLOAD_LIFECYCLE
from streams.core.workload import workload_step
from streams.core.workload.workload_step import FINISHED_KEEP_MS, Workload, WorkloadOutputs
from streams.processors.outputs import Counters, Outputs, Source

__all__ = ["WORKLOAD_KEY", "WorkloadPartition"]

WORKLOAD_KEY = b"@workload|"
"""Prefix of the workloads' keys in the pod table (no pod uid starts with "@")."""


class _Held(NamedTuple):
    ts: int
    arrival: int
    offset: int
    value: K8sWorkload


class WorkloadPartition:
    """The workloads of one partition and their values ahead of the watermark."""

    def __init__(
        self,
        prefix: str,
        rules: RuleSettings,
        counters: Counters,
        stored: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        self.topic = K8S_WORKLOADS.full_name(prefix)
        self.rules = rules
        self.counters = counters
        self.workloads: dict[str, Workload] = {}
        self._held: list[_Held] = []
        self._held_offsets: set[int] = set()
        self._arrivals = 0
        self._applied: int | None = None
        self._dirty: set[str] = set()
        self._gone: set[str] = set()
        for _, raw in stored:
            state = workload_step.decode(raw)
            self.workloads[state.uid] = state

    def handle(self, source: Source, raw: bytes, out: Outputs) -> int | None:
        """One `k8s.workloads` value; its event time, None when rejected."""
        value = out.decode(K8S_WORKLOADS, source, raw)
        if value is None:
            return None
        if workload_step.is_replay(self.workloads.get(value.uid), value):
            self.counters.duplicates += 1
            return value.ts
        if self._applied is None or value.ts > self._applied:
            if source.offset in self._held_offsets:
                self.counters.duplicates += 1  # a redelivery of a value still held
                return value.ts
            self._held_offsets.add(source.offset)
            self._arrivals += 1
            bisect.insort(self._held, _Held(value.ts, self._arrivals, source.offset, value))
            return value.ts
        self.counters.applied_late += 1  # behind the watermark by its own time: applied now
        self._apply(value, out)
        return value.ts

    def on_watermark(self, wm: int, out: Outputs) -> None:
        """Apply the values the watermark reached, in `ts` order, then step every queued
        workload to it; forget the workloads finished an hour before it."""
        self._applied = wm
        cut = bisect.bisect_right(self._held, wm, key=lambda h: h.ts)
        ready, self._held = self._held[:cut], self._held[cut:]
        for item in ready:
            self._held_offsets.discard(item.offset)
            if workload_step.is_replay(self.workloads.get(item.value.uid), item.value):
                self.counters.duplicates += 1
                continue
            self._apply(item.value, out)
        for uid in sorted(self.workloads):
            state = self.workloads[uid]
            due = workload_step.next_due(state, self.rules)
            if due is not None and due <= wm:
                after, alerts = workload_step.step_to(state, wm, self.rules)
                self._publish(WorkloadOutputs([], alerts), out)
                self._keep(after)
            elif state.deleted and wm >= state.since + FINISHED_KEEP_MS:
                del self.workloads[uid]
                self._dirty.discard(uid)
                self._gone.add(uid)

    def _apply(self, value: K8sWorkload, out: Outputs) -> None:
        before = self.workloads.get(value.uid)
        if before is not None:
            before, alerts = workload_step.step_to(before, value.ts, self.rules)
            self._publish(WorkloadOutputs([], alerts), out)
        after, outputs = workload_step.apply(before, value, self.rules)
        self._publish(outputs, out)
        self._keep(after)

    def _keep(self, state: Workload) -> None:
        self.workloads[state.uid] = state
        self._dirty.add(state.uid)
        self._gone.discard(state.uid)

    def _publish(self, outputs: WorkloadOutputs, out: Outputs) -> None:
        out.emit_all(WORKLOAD_LIFECYCLE, outputs.lifecycle)
        out.emit_all(ALERTS, outputs.alerts)

    def resume_offsets(self) -> dict[str, int]:
        """The oldest offset still held: where a restart must read `k8s.workloads` from."""
        return {self.topic: min(self._held_offsets)} if self._held_offsets else {}

    def take_writes(self) -> list[tuple[bytes, bytes | None]]:
        """The workloads changed since the last call (None: delete)."""
        writes: list[tuple[bytes, bytes | None]] = [
            (WORKLOAD_KEY + uid.encode(), None) for uid in sorted(self._gone)
        ]
        writes += [
            (WORKLOAD_KEY + uid.encode(), workload_step.encode(self.workloads[uid]))
            for uid in sorted(self._dirty)
        ]
        self._dirty.clear()
        self._gone.clear()
        return writes
