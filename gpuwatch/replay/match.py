"""Which records concern the subject of `gpuwatch replay`, and the story they tell in order.

Pure functions over `gpuwatch.replay.story` types. `resolve` finds the subject's pods, nodes
and GPUs in the records; `assemble` keeps the records about them in the range, once per
identity (at-least-once delivery: SEMANTICS.md), a window at its newest `revision` (the
worker emits a window again whole when usage came after it closed), in event-time order;
`state_bands` turns a pod's transitions into the spans the plot shades.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpuwatch.replay.story import (
    KIND_ORDER,
    Collected,
    Event,
    GpuSamples,
    Scope,
    StateBand,
    Subject,
)
from gpuwatch.timerange import TimeRange
from schemas import Alert, Attribution, GpuWindow, K8sNode, K8sWorkload, PodLifecycle
from streams.core.workload.workloads import WorkloadStanding, standing

__all__ = ["assemble", "replaces", "resolve", "state_bands"]


def resolve(subject: Subject, found: Collected) -> Scope:
    """The subject's pods, nodes and GPUs as the derived records and pod events name them."""
    scope = Scope()
    named: list[PodLifecycle | Attribution] = [*found.lifecycle, *found.attribution]
    if subject.kind == "pod":
        for rec in named:
            if subject.names(rec.namespace, rec.pod):
                scope.uids[rec.uid] = subject.value
                scope.nodes.update([rec.node] if rec.node else [])
        for pod in found.pods:
            if subject.names(pod.namespace, pod.name):
                scope.uids[pod.uid] = subject.value
                scope.nodes.update([pod.node] if pod.node else [])
                scope.jobs.update([pod.controller_uid] if pod.controller_uid else [])
        for rec in found.attribution:
            if rec.uid in scope.uids:
                scope.gpus.update(g.uuid for g in rec.gpus)
        for window in found.gpu_windows:
            for share in window.pods:
                if subject.names(share.namespace, share.pod):
                    scope.uids[share.uid] = subject.value
                    scope.gpus.add(window.uuid)
                    scope.nodes.add(window.node)
    elif subject.kind == "gpu":
        scope.gpus.add(subject.value)
        for window in found.gpu_windows:
            if subject.value in (window.uuid, window.parent_uuid):
                scope.nodes.add(window.node)
                scope.uids.update((p.uid, f"{p.namespace}/{p.pod}") for p in window.pods)
        for rec in found.attribution:
            if any(g.uuid == subject.value for g in rec.gpus):
                scope.uids[rec.uid] = f"{rec.namespace}/{rec.pod}"
                scope.nodes.update([rec.node] if rec.node else [])
        for alert in found.alerts:
            if alert.subject.uuid == subject.value and alert.subject.node:
                scope.nodes.add(alert.subject.node)
    else:
        scope.nodes.add(subject.value)
        for rec in named:
            if rec.node == subject.value:
                scope.uids[rec.uid] = f"{rec.namespace}/{rec.pod}"
        for window in found.gpu_windows:
            if window.node == subject.value:
                scope.gpus.add(window.uuid)
                scope.uids.update((p.uid, f"{p.namespace}/{p.pod}") for p in window.pods)
    return scope


def _alert_concerns(subject: Subject, scope: Scope, alert: Alert) -> bool:
    labels, who = alert.labels, alert.subject
    if subject.kind == "node":
        return subject.value in (who.node, labels.get("node"))
    if who.uid is not None and who.uid in scope.uids:
        return True
    if labels.get("pod_uid") in scope.uids:
        return True
    if who.kind == "workload" and labels.get("job_uid") in scope.jobs:
        return True  # the pod's job waited in Kueue's queue: one history
    if "pod_uids" in labels and not scope.uids.keys().isdisjoint(labels["pod_uids"].split(",")):
        return True  # a GPU fault naming every pod that held the GPU
    if subject.kind == "gpu":
        return subject.value in (who.uuid, labels.get("gpu"))
    named = (labels.get("namespace"), labels.get("pod")) == subject.pod
    return named or subject.value in labels.get("pods", "").split(",")


def _identity(event: Event) -> tuple[Any, ...]:
    """Records equal by identity are one record delivered twice (at-least-once)."""
    r = event.record
    if isinstance(r, PodLifecycle):
        # A reason change (queued -> queued) can share uid, ts and to_state with the transition
        # before it: the whole transition is the identity here.
        return ("lifecycle", r.uid, r.ts, r.from_state or "", r.to_state, r.reason or "")
    if isinstance(r, Attribution):
        return ("attribution", r.uid, r.window_start)
    if isinstance(r, GpuWindow):
        return ("gpu_window", r.uuid, r.window_start)
    if isinstance(r, Alert):
        return ("alert", r.fingerprint, r.status, r.ts)
    if isinstance(r, K8sNode):
        return ("node", r.node, r.ts, r.type)
    if isinstance(r, K8sWorkload):
        return ("workload", r.uid, r.ts, r.type, r.resource_version)
    return ("samples", r.uuid)


def replaces(new: object, kept: object) -> bool:
    """Whether a copy of a record takes the place of the one kept of the same identity:
    a higher `revision` of an attribution or GPU window, or at the same revision (every
    other record) the copy read later."""
    return _revision(new) >= _revision(kept)


def _revision(record: object) -> int:
    return record.revision if isinstance(record, Attribution | GpuWindow) else 0


def assemble(
    subject: Subject,
    span: TimeRange,
    found: Collected,
    scope: Scope,
    samples: Sequence[GpuSamples] = (),
) -> list[Event]:
    """The subject's events in the range, once each, in event-time order."""
    pod, gpu, node = subject.kind == "pod", subject.kind == "gpu", subject.kind == "node"
    events: list[Event] = []
    for change in found.lifecycle:
        if span.holds(change.ts) and (
            change.uid in scope.uids if not node else change.node == subject.value
        ):
            events.append(Event("lifecycle", change.ts, change))
    for rec in found.attribution:
        if not span.overlaps(rec.window_start, rec.window_end):
            continue
        if (
            (pod and rec.uid in scope.uids)
            or (gpu and any(g.uuid == subject.value for g in rec.gpus))
            or (node and rec.node == subject.value)
        ):
            events.append(Event("attribution", rec.ts, rec))
    for alert in found.alerts:
        if span.holds(alert.ts) and _alert_concerns(subject, scope, alert):
            events.append(Event("alert", alert.ts, alert))
    for window in found.gpu_windows:
        if span.overlaps(window.window_start, window.window_end) and (
            (gpu and subject.value in (window.uuid, window.parent_uuid))
            or (node and window.node == subject.value)
        ):
            events.append(Event("gpu_window", window.ts, window))
    for seen in found.nodes:
        if node and seen.node == subject.value and span.holds(seen.ts):
            events.append(Event("node", seen.ts, seen))
    events.extend(_workload_story(found, scope, span) if pod else [])
    events.extend(Event("samples", s.first_ts, s) for s in samples)
    unique: dict[tuple[Any, ...], Event] = {}
    for event in events:
        key = _identity(event)
        kept = unique.get(key)
        if kept is None or replaces(event.record, kept.record):
            unique[key] = event
    # Stable: records of one pod at one instant keep the order their partition gave them.
    return sorted(unique.values(), key=lambda e: (e.ts, KIND_ORDER[e.kind]))


def _workload_story(found: Collected, scope: Scope, span: TimeRange) -> list[Event]:
    """The Kueue workload of the pod's job, where its standing changed: its wait before
    the pod existed (created, why queued, admitted) and its end, one history with the
    pod's. A RESYNC or a status change that moves nothing (the same reason) is left out."""
    mine = sorted(
        (w for w in found.workloads if w.job_uid is not None and w.job_uid in scope.jobs),
        key=lambda w: (w.ts, w.resource_version),
    )
    events: list[Event] = []
    last: tuple[str, WorkloadStanding] | None = None
    for value in mine:
        now = (value.uid, standing(value))
        if last is not None and now[0] == last[0] and now[1][:2] == last[1][:2]:
            continue
        last = now
        if span.holds(value.ts):
            events.append(Event("workload", value.ts, value))
    return events


def state_bands(events: Iterable[Event], span: TimeRange) -> list[StateBand]:
    """Each pod's states over the range, from its transitions (else its windows' states)."""
    changes: dict[str, list[PodLifecycle]] = {}
    windows: dict[str, list[Attribution]] = {}
    for event in events:
        if isinstance(event.record, PodLifecycle):
            changes.setdefault(event.record.uid, []).append(event.record)
        elif isinstance(event.record, Attribution):
            windows.setdefault(event.record.uid, []).append(event.record)
    bands: list[StateBand] = []
    for uid, moves in changes.items():
        moves.sort(key=lambda c: c.ts)
        if moves[0].from_state is not None:
            bands.append(StateBand(uid, moves[0].from_state, span.start_ms, moves[0].ts))
        ends = [c.ts for c in moves[1:]] + [span.end_ms]
        bands.extend(
            StateBand(uid, c.to_state, c.ts, end) for c, end in zip(moves, ends, strict=True)
        )
    for uid, recs in windows.items():
        if uid not in changes:
            bands.extend(StateBand(uid, r.state, r.window_start, r.window_end) for r in recs)
    clipped = [
        StateBand(b.uid, b.state, max(b.start_ms, span.start_ms), min(b.end_ms, span.end_ms))
        for b in bands
    ]
    return sorted((b for b in clipped if b.end_ms > b.start_ms), key=lambda b: (b.start_ms, b.uid))
