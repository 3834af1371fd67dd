"""GPU and node alert rules where node samples land: idle allocations, leaks, missing
telemetry, and GPU health (`gpu_health`: Xid errors, ECC, row remapping, slowdowns).

The worker keeps one `NodeAlertState` per node (a Table keyed by node) and calls `on_sample`
per node sample and `on_watermark` per node on each stream-time tick. Alerts follow changes of
what the state says is firing, so a replayed sample repeats none. Semantics and the choices
made where docs/DESIGN.md §4 leaves room: streams/SEMANTICS-alerts.md.

A node is `(cluster, node)`. The alerts of a node of a named cluster carry the cluster
in `cluster` and in their labels, name it in the summary and have a fingerprint of their
own (`alert_identity`); those of the default cluster are as before clusters existed.
"""

from typing import Literal

import msgspec

from schemas.alert import Alert, AlertName, AlertSubject, Severity
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import GpuReading, NvmlSample
from schemas.settings import RuleSettings
from streams.core.alert_identity import fingerprint, in_cluster, with_cluster
from streams.core.node.gpu_health import (
    HEALTH_SEVERITY,
    Fault,
    gpu_labels,
    health_expired,
    health_firing,
    health_removed,
    health_step,
)
from streams.core.node.idleness import gpu_idle
from streams.core.split import AllocationIndex, SampleView, sample_view

__all__ = [
    "IDLE_ALERT_AFTER_S",
    "SEVERITY",
    "TELEMETRY_MISSING_AFTER_S",
    "THROTTLE_ALERT_AFTER_S",
    "NodeAlertState",
    "Run",
    "on_node_removed",
    "on_sample",
    "on_watermark",
    "still_firing",
]

IDLE_ALERT_AFTER_S = 60  # the product promises idle alerts in seconds, not minutes
TELEMETRY_MISSING_AFTER_S = 30  # 30 ticks at 1 Hz: a lost sample or two is not a dead node
THROTTLE_ALERT_AFTER_S = 60  # a slowdown a minute long, not a blip of a boost clock
SEVERITY: dict[AlertName, Severity] = {
    "GpuIdleAllocated": "warning",  # waste: for a person in working hours, not a page
    "GpuUnallocatedAccess": "critical",  # a pod uses a GPU it does not hold: security, billing
    "NodeTelemetryMissing": "critical",  # every GPU of the node goes unobserved and unbilled
    **HEALTH_SEVERITY,
}
_MS = 1000


class Run(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A condition on a GPU or node since `since`; `labels` (node, gpu...) once it fires."""

    since: int
    firing: bool = False
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class NodeAlertState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the GPU and node rules remember of one node; a Faust Table value keyed by node.

    JSON via `msgspec.json.encode` / `decode(raw, type=NodeAlertState)`, unknown fields ignored.
    `seen_until`: end of the newest sample applied; `watermark`: newest tick; `missing`:
    NodeTelemetryMissing fires; `idle`: GPUs in an idle run; `leaks`: by `uuid/pod_uid`.
    """

    node: NodeName
    cluster: str = DEFAULT_CLUSTER
    seq: int | None = None
    seen_until: int | None = None
    watermark: int = 0
    missing: bool = False
    idle: dict[GpuUuid, Run] = msgspec.field(default_factory=dict)
    leaks: dict[str, Run] = msgspec.field(default_factory=dict)
    faults: dict[str, Fault] = msgspec.field(default_factory=dict)
    """GPU health conditions (`gpu_health`), by `kind/uuid[/code]`."""
    dbe: dict[GpuUuid, int] = msgspec.field(default_factory=dict)
    """The last volatile double-bit ECC count of each GPU that read above 0."""


def _alert(
    name: AlertName, key: str, run: Run, ts: int, summary: str, *, value: float | None = None
) -> Alert:
    """A message of `run`'s alert: firing while `run.firing`; `value` defaults to seconds in it.

    The cluster is the one `run.labels` name (a named cluster's runs carry it, `_labels`).
    """
    labels = run.labels
    cluster = labels.get("cluster", DEFAULT_CLUSTER)
    uuid = GpuUuid(labels["gpu"]) if "gpu" in labels else None
    kind: Literal["gpu", "node"] = "node" if uuid is None else "gpu"
    subject = AlertSubject(kind=kind, uid=None, uuid=uuid, node=NodeName(labels["node"]))
    return Alert(
        schema="gpuwatch.alert/v1",
        fingerprint=fingerprint(name, kind, key, cluster),
        name=name,
        status="firing" if run.firing else "resolved",
        severity=SEVERITY[name],
        ts=ts,
        since=run.since,
        subject=subject,
        labels=labels,
        summary=in_cluster(summary, cluster),
        value=max(ts - run.since, 0) / _MS if value is None else value,
        cluster=cluster,
    )


def _idle_fired(uuid: GpuUuid, run: Run, who: list[str], idle_ms: int) -> Alert:
    """The firing message of a GpuIdleAllocated alert; `who` names the holders (`ns/pod`)."""
    labels = run.labels
    where = f"{uuid} ({labels['model']}) on {labels['node']}"
    summary = f"{where} allocated to {', '.join(who)} and idle for {idle_ms // _MS} s"
    return _alert("GpuIdleAllocated", uuid, run, run.since + idle_ms, summary)


def _idle_resolved(uuid: GpuUuid, run: Run, ts: int, why: str) -> Alert:
    """The resolved message of a firing GpuIdleAllocated alert, saying why it ended."""
    secs = max(ts - run.since, 0) // _MS
    summary = f"{uuid} on {run.labels['node']} no longer idle-allocated ({why}) after {secs} s"
    return _alert("GpuIdleAllocated", uuid, msgspec.structs.replace(run, firing=False), ts, summary)


def _leak_alert(key: str, leak: Run, ts: int, pids: int) -> Alert:
    """A GpuUnallocatedAccess message: firing with the pod's pid count, resolved with 0."""
    labels = leak.labels
    who = f"{labels['namespace']}/{labels['pod']}" if "pod" in labels else labels["pod_uid"]
    where = f"{labels['gpu']} ({labels['model']}) on {labels['node']}"
    if pids:
        summary = f"pod {who} runs pid {labels['pids']} on {where} without an allocation of it"
    else:
        summary = f"pod {who} no longer runs on {where}"
        leak = msgspec.structs.replace(leak, firing=False)
    return _alert("GpuUnallocatedAccess", key, leak, ts, summary, value=float(pids))


def _telemetry(state: NodeAlertState, firing: bool, since: int, ts: int) -> Alert:
    """A NodeTelemetryMissing message of `state`'s node."""
    node = state.node
    text = f"no NVML samples from {node} for" if firing else f"NVML samples from {node} again after"
    run = Run(since=since, firing=firing, labels=with_cluster({"node": node}, state.cluster))
    return _alert("NodeTelemetryMissing", node, run, ts, f"{text} {max(ts - since, 0) // _MS} s")


def _end_idle(runs: dict[GpuUuid, Run], ts: int, why: str, keep: set[GpuUuid]) -> list[Alert]:
    """Resolve the firing idle alerts of the GPUs not in `keep`, in uuid order."""
    return [
        _idle_resolved(uuid, run, ts, why)
        for uuid, run in sorted(runs.items())
        if run.firing and uuid not in keep
    ]


def _lost(state: NodeAlertState, seen: int, due: int) -> tuple[NodeAlertState, list[Alert]]:
    """Telemetry is missing from `due` on: fire, and end the idle runs (unknown is not idle)."""
    out = _end_idle(state.idle, seen, "telemetry missing", set())
    out.append(_telemetry(state, True, seen, due))
    return msgspec.structs.replace(state, missing=True, idle={}), out


def on_watermark(
    state: NodeAlertState,
    watermark_ms: int,
    rules: RuleSettings,
    *,
    telemetry_missing_after_s: int = TELEMETRY_MISSING_AFTER_S,
) -> tuple[NodeAlertState, list[Alert]]:
    """Fire NodeTelemetryMissing once the watermark passes the last sample's end + threshold."""
    if watermark_ms <= state.watermark:
        return state, []
    state = msgspec.structs.replace(state, watermark=watermark_ms)
    expired: list[Alert] = []
    if state.faults:  # an Xid's hold runs out in stream time: the GPU may say nothing more
        faults, expired = health_expired(state.faults, watermark_ms, rules.xid_alert_hold_s * _MS)
        if expired:
            state = msgspec.structs.replace(state, faults=faults)
    seen = state.seen_until
    if seen is None or state.missing:
        return state, expired
    due = seen + telemetry_missing_after_s * _MS
    if watermark_ms <= due:
        return state, expired
    state, out = _lost(state, seen, due)
    return state, expired + out


def _missing_seqs(last: int | None, seq: int) -> int:
    """Samples lost between two accepted ones, by `seq`; a reset (agent restart) counts from 0."""
    return 0 if last is None else seq - last - 1 if seq > last else seq


def _idle_step(
    sample: NvmlSample,
    gpu: GpuReading,
    run: Run | None,
    ctx: tuple[AllocationIndex, float, int],
) -> tuple[Run | None, Alert | None]:
    """One GPU's idle run after the sample, and the alert it starts or ends, if any: the
    GPU is idle when every holder is by its own share (`idleness.gpu_idle`)."""
    index, idle_util_pct, idle_ms = ctx
    uuid = gpu.uuid
    holders = index.holders.get(uuid)
    if not holders and run is None:
        return None, None
    now_idle = gpu_idle(gpu, holders, idle_util_pct) if holders else False
    if not (now_idle and holders):
        if run is None or not run.firing:
            return None, None
        why = "not allocated" if not holders else "busy" if now_idle is False else "unknown"
        return None, _idle_resolved(uuid, run, sample.ts, why)
    if run is None:
        run = Run(since=sample.ts)
    if run.firing or sample.ts + sample.interval_ms - run.since < idle_ms:
        return run, None
    who = sorted("/".join(index.names[uid]) for uid in holders)
    run = Run(since=run.since, firing=True, labels=gpu_labels(sample, gpu, who))
    return run, _idle_fired(uuid, run, who, idle_ms)


def _leak_step(
    sample: NvmlSample, gpu: GpuReading, index: AllocationIndex, old: dict[str, Run]
) -> tuple[dict[str, Run], list[Alert]]:
    """Pods on `gpu` holding neither it nor its parent (by `uuid/pod_uid`), new ones fired."""
    allowed = index.holders.get(gpu.uuid, [])
    if gpu.parent_uuid is not None:  # holding the whole GPU covers its instances
        allowed = allowed + index.holders.get(gpu.parent_uuid, [])
    pids: dict[PodUid, list[int]] = {}
    for proc in gpu.processes:
        uid = proc.pod_uid
        if uid is not None and uid not in allowed:  # a host process (of no pod) is no leak
            pids.setdefault(uid, []).append(proc.pid)
    leaks, out = {}, []
    for uid, found in pids.items():
        key = f"{gpu.uuid}/{uid}"
        leak = old.get(key)
        if leak is None:
            labels = gpu_labels(sample, gpu, [])
            labels["pod_uid"] = uid
            labels["pids"] = ",".join(str(pid) for pid in sorted(found))
            if uid in index.names:  # it holds another GPU of the node, so it can be named
                labels["namespace"], labels["pod"] = index.names[uid]
            leak = Run(since=sample.ts, firing=True, labels=labels)
            out.append(_leak_alert(key, leak, sample.ts, len(found)))
        leaks[key] = leak
    return leaks, out


def on_sample(
    state: NodeAlertState | None,
    sample: NvmlSample,
    rules: RuleSettings,
    *,
    idle_alert_after_s: int = IDLE_ALERT_AFTER_S,
    telemetry_missing_after_s: int = TELEMETRY_MISSING_AFTER_S,
    view: SampleView | None = None,
) -> tuple[NodeAlertState, list[Alert], int]:
    """Apply one node sample: the alerts it starts or ends, and how many samples were lost.

    `view` is the sample's `sample_view`, where the caller has it already.
    """
    node, ts = sample.node, sample.ts
    if state is None:
        named = sample.cluster != DEFAULT_CLUSTER  # the default as itself: omitted when stored
        state = NodeAlertState(node=node, cluster=sample.cluster if named else DEFAULT_CLUSTER)
    seen = state.seen_until
    if seen is not None and ts < seen:
        return state, [], 0  # a replay, or an overlap with what was applied: nothing new
    lost = _missing_seqs(state.seq, sample.seq)
    out: list[Alert] = []
    if seen is not None:
        due = seen + telemetry_missing_after_s * _MS
        if not state.missing and ts > due:  # a gap no tick noticed (a replay of history)
            state, out = _lost(state, seen, due)
        if state.missing:
            out.append(_telemetry(state, False, seen, ts))
    if view is None:
        view = sample_view(sample)
    index, gpus = view
    ctx = (index, rules.idle_util_pct, idle_alert_after_s * _MS)
    old_idle, old_leaks = state.idle, state.leaks
    idle: dict[GpuUuid, Run] = {}
    leaks: dict[str, Run] = {}
    for gpu in gpus:
        found, fired = _leak_step(sample, gpu, index, old_leaks) if gpu.processes else ({}, [])
        run, alert = _idle_step(sample, gpu, old_idle.get(gpu.uuid), ctx)
        if run is not None:
            idle[gpu.uuid] = run
        if alert is not None:
            out.append(alert)
        leaks.update(found)
        out += fired
    if old_idle:
        out += _end_idle(old_idle, ts, "no longer reported", {gpu.uuid for gpu in gpus})
    if old_leaks:
        out += [
            _leak_alert(k, leak, ts, 0) for k, leak in sorted(old_leaks.items()) if k not in leaks
        ]
    faults, dbe, health = health_step(
        state.faults,
        state.dbe,
        sample,
        index,
        hold_ms=rules.xid_alert_hold_s * _MS,
        throttle_ms=rules.throttle_alert_after_s * _MS,
    )
    out += health
    end = ts + sample.interval_ms
    state = NodeAlertState(
        node=node,
        cluster=state.cluster,
        seq=sample.seq,
        seen_until=end,
        watermark=state.watermark,
        idle=idle,
        leaks=leaks,
        faults=faults,
        dbe=dbe,
    )
    return state, out, lost


def on_node_removed(state: NodeAlertState, ts: int) -> tuple[NodeAlertState, list[Alert]]:
    """Resolve every firing alert of a node deleted from the cluster (k8s.nodes DELETED).

    Else a node an autoscaler removed keeps NodeTelemetryMissing firing; the state returned
    is empty (the caller may drop the node's key instead).
    """
    out = _end_idle(state.idle, ts, "node removed", set())
    out += [_leak_alert(key, leak, ts, 0) for key, leak in sorted(state.leaks.items())]
    out += health_removed(state.faults, ts)
    if state.missing and state.seen_until is not None:
        out.append(_telemetry(state, False, state.seen_until, ts))
    return NodeAlertState(node=state.node, cluster=state.cluster, watermark=state.watermark), out


def still_firing(
    state: NodeAlertState,
    *,
    idle_alert_after_s: int = IDLE_ALERT_AFTER_S,
    telemetry_missing_after_s: int = TELEMETRY_MISSING_AFTER_S,
    throttle_alert_after_s: int = THROTTLE_ALERT_AFTER_S,
) -> list[Alert]:
    """The firing messages, as sent, of the alerts `state` says are firing.

    For a worker that loads the state (a restart, a partition taken over) and must show
    them again without sending them again. Every field is the sent one's, given the
    thresholds it fired with: a threshold changed since moves `ts`, `value` and the
    summary, not `since` or the labels. Idle GPUs by uuid, then leaks by key, then the
    node, then GPU health faults by key.
    """
    out = []
    for uuid, run in sorted(state.idle.items()):
        if run.firing:  # holders named by `pod` (one) or `pods` (several): `gpu_labels`
            labels = run.labels
            one = "pod" in labels
            who = [f"{labels['namespace']}/{labels['pod']}"] if one else labels["pods"].split(",")
            out.append(_idle_fired(uuid, run, who, idle_alert_after_s * _MS))
    for key, leak in sorted(state.leaks.items()):
        out.append(_leak_alert(key, leak, leak.since, len(leak.labels["pids"].split(","))))
    if state.missing and state.seen_until is not None:
        due = state.seen_until + telemetry_missing_after_s * _MS
        out.append(_telemetry(state, True, state.seen_until, due))
    out += health_firing(state.faults, throttle_alert_after_s * _MS)
    return out
