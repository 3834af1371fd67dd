"""Pod alert rules in the stream: PodStalled and PodQueuedTooLong, from lifecycle transitions.

PodStalled fires when a pod enters stalled and resolves when it leaves (finishing
included); PodQueuedTooLong fires once a pod has been queued `queued_alert_after_s`, at
the event time that happened (queued since + the threshold, found by any message or a
watermark tick), and resolves when it leaves queued. Alerts follow changes of the flags
kept in `PodState`, so a repeated input repeats no alert.

The alerts of a pod of a named cluster carry the cluster in `cluster` and in their labels,
name it in the summary and have a fingerprint of their own (`alert_identity`); those of the
default cluster are as before clusters existed.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from schemas.alert import Alert, AlertName, AlertStatus, AlertSubject, Severity
from schemas.pod_lifecycle import PodLifecycle
from schemas.settings import RuleSettings
from streams.core.alert_identity import fingerprint, in_cluster, with_cluster
from streams.core.pod.lifecycle import IDLE
from streams.core.pod.lifecycle_reasons import CRASH_LOOP
from streams.core.pod.pod_state import PodState

__all__ = ["SEVERITY", "alert_labels", "evaluate", "still_firing"]

SEVERITY: dict[AlertName, Severity] = {
    # Warnings: both waste money or time but need a person, not a page at night.
    "PodStalled": "warning",
    "PodQueuedTooLong": "warning",
}


def alert_labels(state: PodState) -> dict[str, str]:
    """Routing labels of a pod's alerts: namespace, pod, team (when labelled), node (bound),
    cluster (a named one)."""
    labels = {"namespace": state.namespace, "pod": state.name}
    if "team" in state.labels:
        labels["team"] = state.labels["team"]
    if state.node is not None:
        labels["node"] = state.node
    return with_cluster(labels, state.cluster_name())


def _alert(
    state: PodState, name: AlertName, status: AlertStatus, *, ts: int, since: int, summary: str
) -> Alert:
    cluster = state.cluster_name()
    return Alert(
        schema="gpuwatch.alert/v1",
        fingerprint=fingerprint(name, "pod", state.uid, cluster),
        name=name,
        status=status,
        severity=SEVERITY[name],
        ts=ts,
        since=since,
        subject=AlertSubject(kind="pod", uid=state.uid, uuid=None, node=state.node),
        labels=alert_labels(state),
        summary=in_cluster(summary, cluster),
        value=max(ts - since, 0) / 1000,
        cluster=cluster,
    )


def _stalled_fired(
    state: PodState, ts: int, since: int, reason: str | None, rules: RuleSettings
) -> Alert:
    """The firing message of PodStalled, raised at `ts` for `reason`."""
    pod = f"{state.namespace}/{state.name}"
    if reason == IDLE:
        summary = f"{pod} stalled: idle on all its GPUs for {rules.stall_after_s} s"
    else:
        summary = f"{pod} stalled: {reason}"
    return _alert(state, "PodStalled", "firing", ts=ts, since=since, summary=summary)


def _queued_fired(state: PodState, since: int, reason: str | None, queued_ms: int) -> Alert:
    """The firing message of PodQueuedTooLong, queued since `since` for `reason`."""
    pod = f"{state.namespace}/{state.name}"
    summary = f"{pod} queued for {queued_ms // 1000} s ({reason or 'no reason given'})"
    return _alert(
        state, "PodQueuedTooLong", "firing", ts=since + queued_ms, since=since, summary=summary
    )


def _stalled(
    state: PodState, step: PodLifecycle, since: int | None, rules: RuleSettings, pod: str
) -> tuple[int | None, Alert | None]:
    """The PodStalled alert a transition calls for, if any, and the firing alert's `since`
    after it (None: not firing). An Idle stall began when the pod's idle run did."""
    if step.to_state == "stalled" and since is None:
        idle = step.reason == IDLE
        since = max(step.ts - rules.stall_after_s * 1000, 0) if idle else step.ts
        return since, _stalled_fired(state, step.ts, since, step.reason, rules)
    if step.to_state != "stalled" and since is not None:
        summary = f"{pod} no longer stalled ({step.to_state})"
        alert = _alert(state, "PodStalled", "resolved", ts=step.ts, since=since, summary=summary)
        return None, alert
    return since, None


def evaluate(
    before: PodState | None,
    after: PodState,
    transitions: Sequence[PodLifecycle],
    rules: RuleSettings,
) -> tuple[PodState, list[Alert]]:
    """The alerts a step's transitions and its new event time (`after.horizon`) call for.

    `before` is the state before the step (None for a new pod), `after` the state the
    lifecycle step left, with its transitions in order.
    """
    if not transitions and (after.queued_alert_since is None or after.queued_alert_firing):
        return after, []  # no transition, and no queued alert that could fall due: no change
    pod = f"{after.namespace}/{after.name}"
    queued_ms = rules.queued_alert_after_s * 1000
    queued_since, queued_firing = after.queued_alert_since, after.queued_alert_firing
    stalled_since = after.stalled_alert_since
    reason = before.reason if before is not None else None
    out: list[Alert] = []

    def queued_due(until: int, *, left: bool) -> None:
        """Fire if the pod was queued the threshold by `until` (still queued at it unless
        `left`: a pod that leaves queued exactly at the threshold was not queued past it)."""
        nonlocal queued_firing
        if queued_since is None or queued_firing:
            return
        if queued_since + queued_ms > until or (left and queued_since + queued_ms == until):
            return
        out.append(_queued_fired(after, queued_since, reason, queued_ms))
        queued_firing = True

    for step in transitions:
        queued_due(step.ts, left=step.to_state != "queued")
        if step.to_state == "queued":
            queued_since = step.ts if step.from_state != "queued" else queued_since
        elif queued_since is not None:
            if queued_firing:
                seconds = (step.ts - queued_since) // 1000
                summary = f"{pod} no longer queued ({step.to_state}) after {seconds} s"
                resolved = _alert(
                    after,
                    "PodQueuedTooLong",
                    "resolved",
                    ts=step.ts,
                    since=queued_since,
                    summary=summary,
                )
                out.append(resolved)
            queued_since, queued_firing = None, False
        stalled_since, alert = _stalled(after, step, stalled_since, rules, pod)
        if alert is not None:
            out.append(alert)
        reason = step.reason
    queued_due(after.horizon, left=False)
    after = msgspec.structs.replace(
        after,
        queued_alert_since=queued_since,
        queued_alert_firing=queued_firing,
        stalled_alert_since=stalled_since,
    )
    return after, out


def still_firing(state: PodState, rules: RuleSettings) -> list[Alert]:
    """The firing messages of the pod alerts `state` says are firing, as far as it tells.

    For a worker that loads the state (a restart, a partition taken over) and must show
    them again without sending them again. Fingerprint, name, severity, `since`, subject
    and `value` are the sent ones'; `ts` too, given the thresholds it fired with. The state
    keeps no copy of the sent message, so what it says now stands for what it said then:
    the labels and subject are the pod's current ones (they differ when the pod was bound
    to a node, or its team label changed, after the alert fired), and PodQueuedTooLong's
    summary gives the current reason (the one in force at the threshold may have changed).
    PodStalled's reason is known: an Idle stall's `since` is before it entered stalled.
    """
    out = []
    since = state.queued_alert_since
    if state.queued_alert_firing and since is not None:
        out.append(_queued_fired(state, since, state.reason, rules.queued_alert_after_s * 1000))
    since = state.stalled_alert_since
    if since is not None:
        # It fired as it entered stalled (`state.since`: a reason change within stalled
        # keeps it, leaving resolves). Stalls are Idle or a crash loop.
        idle = since != state.since
        reason = IDLE if idle else state.reason if state.reason != IDLE else CRASH_LOOP
        out.append(_stalled_fired(state, state.since, since, reason, rules))
    return out
