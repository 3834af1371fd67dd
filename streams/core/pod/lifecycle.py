"""The lifecycle state machine of a GPU pod: queued, running, stalled, finished.

Pod events (`on_pod_event`) and the pod's GPU usage (`on_usage`) move it; the partition's
stream time (`on_watermark`) only advances the pod's event time, which the queued alert
is due by. Each returns the next state and the transitions it caused, as `pod.lifecycle`
values. All times are event times; see SEMANTICS-lifecycle.md.
"""

from __future__ import annotations

import msgspec

from schemas.fields import LifecycleState
from schemas.k8s_pod import K8sPod
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from schemas.settings import RuleSettings
from streams.core.pod.lifecycle_reasons import CRASH_LOOP, observe
from streams.core.pod.pod_state import PodState, new_state, stored_cluster

__all__ = ["IDLE", "on_pod_event", "on_usage", "on_watermark", "state_at"]

IDLE = "Idle"
"""Reason of a stall by idleness: the pod's own share under idle_util_pct on every GPU."""

_Target = tuple[LifecycleState, str | None, int]


def _newer(state: PodState, event: K8sPod) -> bool:
    """Whether a pod event is not older than the latest one applied.

    Resource versions are etcd revisions, decimal integers on every real API server,
    and are compared as such; where either is not (a fake, a future server) the event
    times decide. An event equal to the latest applied is "not older": re-applying it
    changes nothing, except a DELETED that repeats the last value's version.
    """
    if state.resource_version is None or state.event_ts is None:
        return True
    before, now = state.resource_version, event.resource_version
    if before.isdecimal() and now.isdecimal() and int(before) != int(now):
        return int(now) > int(before)
    return event.ts >= state.event_ts


def _target(state: PodState, ts: int, rules: RuleSettings) -> _Target | None:
    """The state the inputs call for, its reason and when it began; None: no change."""
    if state.base is None or state.state == "finished":
        return None
    if state.base != "running":
        return state.base, state.base_reason, ts
    if state.crashloop:
        return "stalled", CRASH_LOOP, ts
    stall_at = None if state.idle_since is None else state.idle_since + rules.stall_after_s * 1000
    # Idle is known as far as the usage goes, not as far as `horizon`: a pod event or a
    # watermark ahead of the usage (a relist read before the minutes of usage it follows,
    # usage still pending on the node side) says nothing about whether the pod stayed idle.
    if stall_at is not None and state.usage_until is not None and stall_at <= state.usage_until:
        # Stalled already (crash loop ended): Idle is the reason from this input on.
        return "stalled", IDLE, max(stall_at, ts) if state.state == "stalled" else stall_at
    return "running", None, ts


def _move(
    state: PodState, to: LifecycleState, reason: str | None, ts: int
) -> tuple[PodState, PodLifecycle | None]:
    """Enter `to` at `ts` (never before the time already counted): the transition."""
    before = state.state
    if before == to and state.reason == reason:
        return state, None
    spent = {
        "queued_ms": state.queued_ms,
        "running_ms": state.running_ms,
        "stalled_ms": state.stalled_ms,
    }
    if before is None:
        # Queued since creation, though the first event may come later (a late watcher).
        ts = min(ts, state.created_at) if to == "queued" and state.created_at is not None else ts
    else:
        ts = max(ts, state.accrued_until)  # clocks go backwards; time spent never does
        spent[f"{before}_ms"] += ts - state.accrued_until
    changed = before != to
    state = msgspec.structs.replace(
        state,
        state=to,
        reason=reason,
        since=ts if changed else state.since,
        accrued_until=ts,
        stall_idle_since=state.idle_since if to == "stalled" and reason == IDLE else None,
        history=(*state.history, (ts, to)) if changed else state.history,
        **spent,
    )
    record = PodLifecycle(
        schema="gpuwatch.pod.lifecycle/v1",
        **state.names(),
        ts=ts,
        from_state=before,
        to_state=to,
        reason=reason,
        queued_ms=spent["queued_ms"],
        running_ms=spent["running_ms"],
        stalled_ms=spent["stalled_ms"],
    )
    return state, record


def _settle(state: PodState, ts: int, rules: RuleSettings) -> tuple[PodState, list[PodLifecycle]]:
    """Make the state what its inputs call for; `ts` is the event time of the new input."""
    target = _target(state, ts, rules)
    if target is None:
        return state, []
    to, reason, at = target
    stalled_idle = to == "stalled" and reason == IDLE
    if not stalled_idle and to == state.state and reason == state.reason:
        return state, []  # already there (most inputs): `_move` would change nothing
    steps: list[tuple[LifecycleState, str | None, int]] = []
    if stalled_idle and at > ts and (state.state, state.reason) != ("stalled", IDLE):
        steps.append(("running", None, ts))  # it ran (or stopped crash-looping) before
    elif (
        stalled_idle
        and state.state == "stalled"
        and state.reason == IDLE
        and state.idle_since is not None
        and state.stall_idle_since is not None
        and state.idle_since > state.stall_idle_since
    ):
        steps.append(("running", None, ts))  # active in between: left, then idle again
    steps.append((to, reason, at))
    out: list[PodLifecycle] = []
    for step in steps:
        state, record = _move(state, *step)
        if record is not None:
            out.append(record)
    return state, out


def on_pod_event(
    state: PodState | None, event: K8sPod, rules: RuleSettings
) -> tuple[PodState, list[PodLifecycle]]:
    """Apply a pod event (RESYNC like MODIFIED); an older or repeated one changes nothing."""
    state = state if state is not None else new_state(event.uid)
    if state.state == "finished" or not _newer(state, event):
        return state, []
    seen = observe(event)
    base = seen.base if seen.base is not None else state.base
    running = base == "running"
    state = msgspec.structs.replace(
        state,
        cluster=stored_cluster(event.cluster),
        namespace=event.namespace,
        name=event.name,
        node=event.node if event.node is not None else state.node,
        labels=dict(event.labels),
        owner=event.owner,
        created_at=event.created_at,
        gpu_request={r: n for r, n in sorted(event.gpu_request.items()) if n > 0},
        gpu_products=event.gpu_products,
        resource_version=event.resource_version,
        event_ts=event.ts,
        deleted=event.type == "DELETED",
        base=base,
        base_reason=seen.reason if seen.base is not None else state.base_reason,
        crashloop=running and (seen.crash_loop or (state.crashloop and not seen.healthy)),
        horizon=max(state.horizon, event.ts),
    )
    return _settle(state, event.ts, rules)


def on_usage(
    state: PodState | None, usage: PodUsage, rules: RuleSettings
) -> tuple[PodState, list[PodLifecycle]]:
    """Apply a pod's usage: idleness may stall it or end a stall (kept before any pod event)."""
    state = state if state is not None else new_state(usage.uid)
    if state.usage_until is not None and usage.end_ts <= state.usage_until:
        return state, []  # a replay of usage already seen
    state = msgspec.structs.replace(
        state,
        cluster=state.cluster if state.event_ts is not None else stored_cluster(usage.cluster),
        node=state.node if state.node is not None else usage.node,
        idle_since=usage.idle_since,
        usage_until=usage.end_ts,
        horizon=max(state.horizon, usage.end_ts),
    )
    return _settle(state, usage.ts, rules)


def on_watermark(
    state: PodState, now_ms: int, rules: RuleSettings
) -> tuple[PodState, list[PodLifecycle]]:
    """Advance the pod's event time to the partition's stream time (no stall: usage says)."""
    if now_ms <= state.horizon:
        return state, []
    return _settle(msgspec.structs.replace(state, horizon=now_ms), now_ms, rules)


def state_at(state: PodState, ts: int) -> LifecycleState | None:
    """The state in force at `ts` by the kept history (the earliest kept one before it)."""
    found = state.history[0][1] if state.history else None
    for when, what in state.history:
        if when > ts:
            break
        found = what
    return found
