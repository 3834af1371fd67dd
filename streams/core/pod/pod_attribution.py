"""Per-pod attribution windows: pod usage bucketed by event time into `attribution` records.

A pod's usage arrives as contiguous intervals `[ts, end_ts)`; each is cut at window
boundaries (integrals in proportion to the time in each window, peaks kept whole) and
added to the pod's open windows. The pod side's watermark is a usage frontier (every
usage ending before it is in, the node side's lateness already allowed for), so a window
closes when the watermark reaches its end; a finished pod's windows all close when it
reaches the finish plus the allowed lateness. Closing emits one `Attribution`.

Usage for a closed window revises it while the window ends within the revision horizon
of `closed_until` (`WindowSettings.revision_horizon_s`): it is added to the window, kept
in `revisable`, and the whole record is emitted again with the next `revision`. Older
usage is late: counted by the caller, never emitted. Usage arrives in order per pod (its
node's), and usage up to `attributed_until` is a redelivery, so only windows whose end the
pod's usage had not reached when they closed can be revised: only those are kept (a pod
whose node went quiet, or whose usage ended), never the windows of pods that report on
time; and a kept window the pod's usage has passed the end of is complete and forgotten.
"""

from __future__ import annotations

import bisect
from typing import Any, Literal

import msgspec

from schemas.attribution import Attribution, GpuAttribution
from schemas.fields import AttributionMethod
from schemas.pod_usage import GpuUsage, PodUsage
from schemas.settings import WindowSettings
from streams.core.integrals import PRECISION, least_precise
from streams.core.pod.lifecycle import state_at
from streams.core.pod.pod_state import (
    ClosedWindow,
    GpuTotals,
    OpenWindow,
    PodState,
    new_state,
    stored_cluster,
)
from streams.core.windows import window_start

__all__ = [
    "PRECISION",
    "UNKNOWN_POD_GRACE_MS",
    "UsageOutcome",
    "add_usage",
    "close_windows",
    "finish_closes_at",
    "least_precise",
    "revision_records",
    "window_start",
]

UsageOutcome = Literal["added", "late", "duplicate"]
"""What became of a usage message: counted, (partly) late, or a replay of counted usage."""

UNKNOWN_POD_GRACE_MS = 300_000
"""How much longer the windows of a pod with no pod event yet stay open, so that the
record can name the pod: 5 minutes cover a watcher restart and its relist, which
re-sends every live pod."""


def _added(totals: GpuTotals | None, gpu: GpuUsage, fraction: float) -> GpuTotals:
    """`totals` plus `fraction` of one GPU's usage (the peak whole: it is no integral)."""
    if totals is None:
        totals = GpuTotals(uuid=gpu.uuid, model=gpu.model, sharing=gpu.sharing, method=gpu.method)
    return GpuTotals(
        uuid=gpu.uuid,
        model=gpu.model,
        sharing=gpu.sharing,
        method=totals.method
        if totals.method == gpu.method
        else least_precise([totals.method, gpu.method]),
        allocated_seconds=totals.allocated_seconds + gpu.allocated_seconds * fraction,
        used_gpu_seconds=totals.used_gpu_seconds + gpu.used_gpu_seconds * fraction,
        idle_seconds=totals.idle_seconds + gpu.idle_seconds * fraction,
        vram_byte_seconds=totals.vram_byte_seconds + gpu.vram_byte_seconds * fraction,
        vram_peak_bytes=max(totals.vram_peak_bytes, gpu.vram_peak_bytes),
        energy_joules=totals.energy_joules + gpu.energy_joules * fraction,
        cost_usd=totals.cost_usd + gpu.cost_usd * fraction,
        waste_usd=totals.waste_usd + gpu.waste_usd * fraction,
    )


def _accumulated(window: OpenWindow, usage: PodUsage, fraction: float) -> OpenWindow:
    totals, used = window.gpus, usage.gpus
    if len(used) == 1 and (not totals or (len(totals) == 1 and totals[0].uuid == used[0].uuid)):
        # One GPU in the usage and none other in the window (nearly always): no index.
        gpus: tuple[GpuTotals, ...] = (_added(totals[0] if totals else None, used[0], fraction),)
    else:
        by_uuid = {gpu.uuid: gpu for gpu in totals}
        for gpu in used:
            by_uuid[gpu.uuid] = _added(by_uuid.get(gpu.uuid), gpu, fraction)
        gpus = tuple(by_uuid[k] for k in sorted(by_uuid))
    units = window.units
    if usage.units:
        done = dict(units)
        for name, count in usage.units.items():
            done[name] = done.get(name, 0.0) + count * fraction
        units = tuple(sorted(done.items()))
    return OpenWindow(start=window.start, gpus=gpus, units=units)


def add_usage(
    state: PodState | None,
    usage: PodUsage,
    windows: WindowSettings,
    revised: list[ClosedWindow] | None = None,
) -> tuple[PodState, UsageOutcome]:
    """Count a usage into the pod's open windows.

    Usage up to `attributed_until` was counted already (a redelivery) and is skipped; an
    interval that overlaps it counts only its new part. A usage covering no time carries
    no integrals and is skipped too. With `revised`, a part for a closed window within the
    revision horizon revises it, and the window as revised is appended there (its record:
    `revision_records`, once the lifecycle has seen the usage too); without it (or past
    the horizon) the part is late.
    """
    state = state if state is not None else new_state(usage.uid)
    length = usage.end_ts - usage.ts
    start = max(usage.ts, state.attributed_until or 0)
    if length <= 0 or start >= usage.end_ts:
        return state, "duplicate"
    window_ms = windows.window_s * 1000
    oldest = _oldest_revisable(state.closed_until, windows) if revised is not None else None
    open_ = list(state.windows)  # by start, as the state keeps them
    closed: dict[int, ClosedWindow] | None = None
    touched: list[int] = []
    late = False
    cut = start
    while cut < usage.end_ts:
        bucket = window_start(cut, window_ms)
        stop = min(bucket + window_ms, usage.end_ts)
        fraction = (stop - cut) / length
        if bucket >= state.closed_until:
            _add_to_open(open_, bucket, usage, fraction)
        elif (
            oldest is not None
            and bucket + window_ms > oldest
            and not (state.state == "finished" and cut >= state.since)
        ):
            # A closed window within the horizon; usage after a finish stays late (the
            # finish's window was emitted ending there).
            if closed is None:
                closed = {c.window.start: c for c in state.revisable}
            kept = closed.get(bucket) or ClosedWindow(
                window=OpenWindow(start=bucket), end=_end_of(state, bucket, window_ms)
            )
            closed[bucket] = msgspec.structs.replace(
                kept, window=_accumulated(kept.window, usage, fraction)
            )
            touched.append(bucket)
        else:
            late = True
        cut = stop
    state = msgspec.structs.replace(
        state,
        cluster=state.cluster if state.event_ts is not None else stored_cluster(usage.cluster),
        node=state.node if state.node is not None else usage.node,
        windows=tuple(open_),
        attributed_until=usage.end_ts,
    )
    if closed is not None and revised is not None:
        for bucket in touched:
            kept = closed[bucket]
            revised.append(kept)
            closed[bucket] = msgspec.structs.replace(kept, copies=kept.copies + 1)
        # A window the pod's usage has passed the end of is complete: nothing more comes.
        state = msgspec.structs.replace(
            state,
            revisable=tuple(closed[k] for k in sorted(closed) if closed[k].end > usage.end_ts),
        )
    return state, "late" if late else "added"


def _add_to_open(open_: list[OpenWindow], bucket: int, usage: PodUsage, fraction: float) -> None:
    """Add `fraction` of a usage to the open window starting at `bucket`, made if new,
    keeping `open_` by start. Usage comes in order, so the window is nearly always the
    last one or a new last one: no index of the windows is needed."""
    last = open_[-1].start if open_ else None
    if last == bucket:
        open_[-1] = _accumulated(open_[-1], usage, fraction)
    elif last is None or last < bucket:
        open_.append(_accumulated(OpenWindow(start=bucket), usage, fraction))
    else:
        i = bisect.bisect_left(open_, bucket, key=lambda w: w.start)
        if i < len(open_) and open_[i].start == bucket:
            open_[i] = _accumulated(open_[i], usage, fraction)
        else:
            open_.insert(i, _accumulated(OpenWindow(start=bucket), usage, fraction))


def revision_records(
    state: PodState, revised: list[ClosedWindow], windows: WindowSettings
) -> list[Attribution]:
    """The records of windows `add_usage` revised, with the pod's names and lifecycle of
    `state`; each with the revision its copy count gives."""
    window_ms = windows.window_s * 1000
    return [
        # The end as of now: a pod event applied late may have finished it inside.
        _record(state, kept.window, _end_of(state, kept.window.start, window_ms), kept.copies)
        for kept in revised
    ]


def _oldest_revisable(closed_until: int, windows: WindowSettings) -> int | None:
    """The end a closed window must be past to be revised; None: revisions are off."""
    horizon_ms = windows.revision_horizon_s * 1000
    return closed_until - horizon_ms if horizon_ms > 0 else None


def _end_of(state: PodState, start: int, window_ms: int) -> int:
    """The end of the pod's window starting at `start`: the finish where it holds it."""
    end = start + window_ms
    if state.state == "finished" and start < state.since < end:
        return state.since
    return end


def _record(state: PodState, window: OpenWindow, end: int, revision: int = 0) -> Attribution:
    """The attribution record of one window of the pod, ending at `end`."""
    gpus = window.gpus
    allocated, used, idle, vram_s, vram_peak, energy, cost, waste, method = _totals(gpus)
    return Attribution(
        schema="gpuwatch.attribution/v1",
        **state.names(),
        owner=state.owner,
        ts=end,
        window_start=window.start,
        window_end=end,
        # Usage proves a process on a GPU: a pod no pod event described yet is running.
        state=state_at(state, end) or "running",
        gpus=tuple(
            GpuAttribution(
                uuid=g.uuid,
                model=g.model,
                sharing=g.sharing,
                allocated_gpu_seconds=g.allocated_seconds,
                used_gpu_seconds=g.used_gpu_seconds,
                idle_gpu_seconds=g.idle_seconds,
                vram_peak_bytes=g.vram_peak_bytes,
                cost_usd=g.cost_usd,
                method=g.method,
            )
            for g in gpus
        ),
        allocated_gpu_seconds=allocated,
        used_gpu_seconds=used,
        idle_gpu_seconds=idle,
        vram_byte_seconds=vram_s,
        vram_peak_bytes=vram_peak,
        energy_joules=energy,
        cost_usd=cost,
        waste_usd=waste,
        method=method,
        **_per_unit(window, cost),
        revision=revision,
    )


_Totals = tuple[float, float, float, float, int, float, float, float, AttributionMethod]


def _totals(gpus: tuple[GpuTotals, ...]) -> _Totals:
    """A window's totals over its GPUs: allocated, used and idle GPU-seconds, VRAM
    byte-seconds and peak, energy, cost, waste, and the least precise method.

    One GPU (nearly every window) without the generators: `sum` of one value is `0 + x`
    in every Python version, so the totals are the same to the bit."""
    if len(gpus) == 1:
        (g,) = gpus
        return (
            0 + g.allocated_seconds,
            0 + g.used_gpu_seconds,
            0 + g.idle_seconds,
            0 + g.vram_byte_seconds,
            0 + g.vram_peak_bytes,
            0 + g.energy_joules,
            0 + g.cost_usd,
            0 + g.waste_usd,
            g.method,
        )
    return (
        sum(g.allocated_seconds for g in gpus),
        sum(g.used_gpu_seconds for g in gpus),
        sum(g.idle_seconds for g in gpus),
        sum(g.vram_byte_seconds for g in gpus),
        sum(g.vram_peak_bytes for g in gpus),
        sum(g.energy_joules for g in gpus),
        sum(g.cost_usd for g in gpus),
        sum(g.waste_usd for g in gpus),
        least_precise([g.method for g in gpus]),
    )


def _per_unit(window: OpenWindow, cost: float) -> dict[str, dict[str, Any]]:
    """`work_units` and `cost_per_unit` of a window (neither when the pod reported none)."""
    if not window.units:
        return {}
    units = dict(window.units)
    per_unit = {name: (cost / count if count > 0 else None) for name, count in units.items()}
    return {"work_units": units, "cost_per_unit": per_unit}


def finish_closes_at(state: PodState, windows: WindowSettings) -> int:
    """When a finished pod's windows close: at the finish once its usage reaches the finish
    (a sample that covers the finish has come whole; the watermark, a usage frontier, has
    the lateness in it already), else when the watermark passes the end of the window
    holding the finish (its usage stopped before it: the GPU gone from the samples)."""
    if (state.attributed_until or 0) >= state.since:
        return state.since
    window_ms = windows.window_s * 1000
    return window_start(state.since - 1, window_ms) + window_ms


def close_windows(
    state: PodState, windows: WindowSettings, now_ms: int | None = None
) -> tuple[PodState, list[Attribution]]:
    """Emit the windows that the watermark has closed.

    `now_ms` is the pod side's watermark (None: nothing closes). A window closes when the
    watermark reaches its end, later by `UNKNOWN_POD_GRACE_MS` for a pod no pod event has
    described. A finished pod's windows all close together (`finish_closes_at`), so the
    usage of its last seconds (the GPU held until the kubelet lets it go, a long sample
    that covers the finish) still counts.
    The record of the window that holds the finish ends at the finish; windows wholly
    after it keep their end.
    """
    if now_ms is None:
        return state, []
    window_ms = windows.window_s * 1000
    finished = state.state == "finished"
    if finished:
        if now_ms < finish_closes_at(state, windows):
            return state, []
        # The window of the pod's last running instant: a finish on a window boundary
        # leaves the next window to the usage after the finish.
        ends = [window_start(state.since - 1, window_ms) + window_ms]
        closed_until = max(
            [state.closed_until, *ends, *(w.start + window_ms for w in state.windows)]
        )
    else:
        grace = UNKNOWN_POD_GRACE_MS if state.event_ts is None else 0
        closed_until = max(state.closed_until, window_start(now_ms - grace, window_ms))
    due = [w for w in state.windows if w.start < closed_until]
    if not due and closed_until == state.closed_until:
        return state, []
    records = []
    oldest = _oldest_revisable(closed_until, windows)
    reached = state.attributed_until or 0
    kept = [c for c in state.revisable if oldest is not None and c.end > max(oldest, reached)]
    for window in due:
        end = window.start + window_ms
        if finished and window.start < state.since < end:
            end = state.since
        records.append(_record(state, window, end))
        if oldest is not None and reached < end and end > oldest:
            # The pod's usage has not reached its end: what comes later revises it.
            kept.append(ClosedWindow(window=window, end=end, copies=1))
    # Keep the last state change at or before every window still to come or still to be
    # revised (within the horizon: usage can still come for it), and later ones.
    kept.sort(key=lambda c: c.window.start)
    trim = closed_until if oldest is None else min(closed_until, oldest)
    keep = sum(1 for when, _ in state.history if when <= trim)
    state = msgspec.structs.replace(
        state,
        windows=tuple(w for w in state.windows if w.start >= closed_until),
        closed_until=closed_until,
        history=state.history[max(keep - 1, 0) :],
        revisable=tuple(kept),
    )
    return state, records
