"""A Kueue workload's lifecycle and its WorkloadQueuedTooLong alert, one step at a time.

A workload is `queued` from its creation (with the reason `workloads.standing` reads off
Kueue's conditions), `admitted` when Kueue admits it (its Job's pods take the story over
from there, `pod.lifecycle`), `finished` when Kueue says so or it is deleted. A change of
reason within queued is a transition too (`from_state == to_state`); an eviction sends an
admitted workload back to queued. WorkloadQueuedTooLong fires once a workload has been
queued `queued_alert_after_s` without a break (reasons may change meanwhile), dated when
that happened, and resolves when it leaves queued.

Times: the first transition is at the workload's creation; a workload first seen admitted
or finished (the watcher started later) gets its admission and finish at the times of
those conditions. Every later transition is at the `ts` of the value that shows it (when
the watcher saw it), never before the current state began. The caller applies values in
`ts` order and steps the workload to its watermark in between (`step_to`), so the
transitions and alerts are a function of the values alone, whenever and in whatever
interleaving with other inputs they were read.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import msgspec

from schemas.alert import Alert, AlertName, AlertStatus, AlertSubject, Severity
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import PodUid
from schemas.k8s_pod import Owner
from schemas.k8s_workload import K8sWorkload
from schemas.settings import RuleSettings
from schemas.workload_lifecycle import WorkloadLifecycle, WorkloadState
from streams.core.alert_identity import fingerprint, in_cluster, with_cluster
from streams.core.workload.workloads import WorkloadStanding, standing

__all__ = [
    "ALERT",
    "FINISHED_KEEP_MS",
    "SEVERITY",
    "Workload",
    "WorkloadOutputs",
    "apply",
    "decode",
    "encode",
    "is_replay",
    "next_due",
    "step_to",
]

ALERT: Final[AlertName] = "WorkloadQueuedTooLong"
SEVERITY: Final[dict[AlertName, Severity]] = {ALERT: "warning"}  # as PodQueuedTooLong
FINISHED_KEEP_MS: Final = 3_600_000
"""A deleted workload's state is kept this long (event time) after its finish, for values
sent again. One finished but not deleted is kept: a relist sends it again."""


class Workload(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the worker keeps of one workload (stored in the pod table)."""

    uid: str
    namespace: str = ""
    name: str = ""
    cluster: str = DEFAULT_CLUSTER
    queue: str | None = None
    cluster_queue: str | None = None
    job_uid: str | None = None
    owner: Owner | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    pods: int = 0
    gpu_request: dict[str, int] = msgspec.field(default_factory=dict)
    state: WorkloadState = "queued"
    reason: str | None = None
    message: str | None = None
    since: int = 0
    """When the current state began."""
    queued_since: int | None = None
    """Start of the current unbroken queued stretch; None while not queued."""
    queued_ms: int = 0
    admitted_ms: int = 0
    """Time spent in each state before `since`."""
    alerted: bool = False
    """WorkloadQueuedTooLong fires."""
    deleted: bool = False
    """The workload is gone from the API server: no value of it comes again but replays."""
    seen_ts: int = -1
    seen_version: str = ""
    """The last value applied (`ts`, resource version): a value at or before it is a replay."""


ADMITTED: Final = WorkloadStanding("admitted", None, None)


class WorkloadOutputs(NamedTuple):
    """What one step publishes."""

    lifecycle: list[WorkloadLifecycle]
    alerts: list[Alert]


def is_replay(state: Workload | None, value: K8sWorkload) -> bool:
    """Whether the state holds `value` already (read again after a restart)."""
    if state is None:
        return False
    return value.ts < state.seen_ts or (
        value.ts == state.seen_ts and value.resource_version == state.seen_version
    )


def next_due(state: Workload, rules: RuleSettings) -> int | None:
    """The event time the workload's alert fires at if nothing changes first; None: none."""
    if state.state != "queued" or state.alerted or state.queued_since is None:
        return None
    return state.queued_since + _after_ms(state, rules)


def _after_ms(state: Workload, rules: RuleSettings) -> int:
    return rules.of(state.cluster).queued_alert_after_s * 1000


def step_to(state: Workload, ts: int, rules: RuleSettings) -> tuple[Workload, list[Alert]]:
    """The workload at event time `ts`: its alert fired if it has been queued long enough."""
    due = next_due(state, rules)
    if due is None or due > ts:
        return state, []
    assert state.queued_since is not None  # next_due says it is queued
    fired = _alert(state, "firing", ts=due, since=state.queued_since)
    return msgspec.structs.replace(state, alerted=True), [fired]


def apply(
    state: Workload | None, value: K8sWorkload, rules: RuleSettings
) -> tuple[Workload, WorkloadOutputs]:
    """Apply one `k8s.workloads` value (not a replay: `is_replay`) at its own `ts`."""
    out = WorkloadOutputs([], [])
    now = standing(value)
    named = _named(state, value)
    if state is None:
        first = msgspec.structs.replace(
            named, since=value.created_at, queued_since=value.created_at
        )
        waiting = now if now.state == "queued" else WorkloadStanding("queued", None, None)
        state = _enter(first, None, value.created_at, waiting, out)
        if now.state != "queued":
            if now.state == "admitted" or value.admitted_at is not None:
                admitted = value.admitted_at if value.admitted_at is not None else value.ts
                state = _move(state, ADMITTED, admitted, rules, out)
            if now.state == "finished":
                ended = value.finished_at if value.finished_at is not None else value.ts
                state = _move(state, now, ended, rules, out)
    else:
        state = named
        if state.state != "finished" and (now.state, now.reason) != (state.state, state.reason):
            state = _move(state, now, value.ts, rules, out)
        elif state.state == now.state and now.message != state.message:
            state = msgspec.structs.replace(state, message=now.message)
    state = msgspec.structs.replace(state, seen_ts=value.ts, seen_version=value.resource_version)
    return state, out


def _named(state: Workload | None, value: K8sWorkload) -> Workload:
    """The workload's names and request as this value gives them."""
    base = state if state is not None else Workload(uid=value.uid)
    return msgspec.structs.replace(
        base,
        namespace=value.namespace,
        name=value.name,
        cluster=value.cluster,
        queue=value.queue,
        cluster_queue=value.cluster_queue
        if value.cluster_queue is not None
        else base.cluster_queue,
        job_uid=value.job_uid,
        owner=value.owner,
        labels=dict(value.labels),
        pods=value.pods,
        gpu_request=dict(value.gpu_request),
        deleted=base.deleted or value.type == "DELETED",
    )


def _move(
    state: Workload, to: WorkloadStanding, ts: int, rules: RuleSettings, out: WorkloadOutputs
) -> Workload:
    """Leave the current state (or reason) for `to` at `ts` (not before the current began)."""
    ts = max(ts, state.since)
    state, fired = step_to(state, ts, rules)
    out.alerts.extend(fired)
    spent = ts - state.since
    state = msgspec.structs.replace(
        state,
        queued_ms=state.queued_ms + (spent if state.state == "queued" else 0),
        admitted_ms=state.admitted_ms + (spent if state.state == "admitted" else 0),
    )
    if to.state != "queued" and state.queued_since is not None:
        if state.alerted:
            out.alerts.append(_alert(state, "resolved", ts=ts, since=state.queued_since, to=to))
        state = msgspec.structs.replace(state, queued_since=None, alerted=False)
    elif to.state == "queued" and state.queued_since is None:
        state = msgspec.structs.replace(state, queued_since=ts)
    return _enter(state, state.state, ts, to, out)


def _enter(
    state: Workload,
    from_state: WorkloadState | None,
    ts: int,
    to: WorkloadStanding,
    out: WorkloadOutputs,
) -> Workload:
    """The workload in `to` from `ts`, the transition published."""
    state = msgspec.structs.replace(
        state, state=to.state, reason=to.reason, message=to.message, since=ts
    )
    out.lifecycle.append(
        WorkloadLifecycle(
            schema="gpuwatch.workload.lifecycle/v1",
            uid=state.uid,
            namespace=state.namespace,
            name=state.name,
            queue=state.queue,
            cluster_queue=state.cluster_queue,
            job_uid=state.job_uid,
            owner=state.owner,
            labels=state.labels,
            pods=state.pods,
            gpu_request=state.gpu_request,
            ts=ts,
            from_state=from_state,
            to_state=to.state,
            reason=to.reason,
            message=to.message,
            queued_ms=state.queued_ms,
            admitted_ms=state.admitted_ms,
            cluster=state.cluster,
        )
    )
    return state


def _alert(
    state: Workload,
    status: AlertStatus,
    *,
    ts: int,
    since: int,
    to: WorkloadStanding | None = None,
) -> Alert:
    workload = f"{state.namespace}/{state.name}"
    if status == "firing":
        waited = (ts - since) // 1000
        why = state.reason or "no reason given"
        summary = f"{workload} queued in Kueue for {waited} s ({why})"
        if state.queue:
            summary += f" in queue {state.queue}"
    else:
        summary = f"{workload} no longer queued in Kueue ({to.state if to else state.state})"
    labels = {"namespace": state.namespace, "workload": state.name}
    if state.queue:
        labels["queue"] = state.queue
    if "team" in state.labels:
        labels["team"] = state.labels["team"]
    if state.job_uid is not None:
        labels["job_uid"] = state.job_uid  # its pods' controller_uid: replay finds it by them
    with_cluster(labels, state.cluster)
    return Alert(
        schema="gpuwatch.alert/v1",
        fingerprint=fingerprint(ALERT, "workload", state.uid, state.cluster),
        name=ALERT,
        status=status,
        severity=SEVERITY[ALERT],
        ts=ts,
        since=since,
        subject=AlertSubject(kind="workload", uid=PodUid(state.uid), uuid=None, node=None),
        labels=labels,
        summary=in_cluster(summary, state.cluster),
        value=max(ts - since, 0) / 1000,
        cluster=state.cluster,
    )


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Workload)


def encode(state: Workload) -> bytes:
    """The state as compact JSON."""
    return _ENCODER.encode(state)


def decode(raw: bytes) -> Workload:
    """A state `encode` wrote."""
    return _DECODER.decode(raw)
