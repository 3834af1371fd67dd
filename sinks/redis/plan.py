"""Turns a batch of derived records into Redis script calls: pure, deterministic, no I/O.

Every write is a Lua script call (sinks/redis/lua/ holds the scripts) so that each one is a
conditional upsert keyed by the record's identity: a replayed record changes nothing and
an older record never overwrites newer state. Arguments are strings formatted here once,
so the same batch always plans the same commands (the unit tests compare them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.capacity import Capacity
from schemas.fields import DEFAULT_CLUSTER, Cluster, Sharing
from schemas.gpu_window import GpuWindow
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.k8s_workload import K8sWorkload
from schemas.nvml_sample import GpuReading, NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from sinks.redis.keys import RedisKeys
from sinks.redis.script_args import (
    AlertState,
    FieldIfNewer,
    GpuLiveCall,
    HsetIfNewer,
    PodTransition,
    PodWindow,
    ScriptCall,
    ScriptName,
    TimelineAdd,
    WorkloadCall,
)

__all__ = [
    "GPU_LIVE_CHUNK",
    "Command",
    "GpuLive",
    "PlanOptions",
    "ScriptName",
    "SinkRecord",
    "gpu_live",
    "gpu_live_states",
    "plan",
    "plan_live",
]

DELETED_KEEP_MS = 86_400_000
"""How long a Kueue workload's deletion is remembered against late records of it."""
NANO = 1_000_000_000  # cost totals are kept in integer nano-USD so that sums are exact
GPU_LIVE_CHUNK = 500
"""GPUs per `gpu_live` call: one call is one round of Lua in Redis, short enough (about a
millisecond) not to hold other clients up, long enough that the calls of a 40,000-GPU
fleet's second are few."""


class GpuLive(msgspec.Struct, frozen=True, kw_only=True):
    """The live state of one GPU after a node sample: what `gpuwatch:gpu:{uuid}` shows.

    `ts` is the end of the sampled interval (the reading is as of then); `idle_since` is the
    event time the GPU's current idle run began (None while busy or unknown), tracked by the
    worker; `pods` are the pods allocated on it or computing on it; `cluster` is the
    sample's.
    """

    uuid: GpuUuid
    node: NodeName
    model: str
    sharing: Sharing
    parent_uuid: GpuUuid | None
    ts: int
    util_pct: float | None
    mem_used_bytes: int
    mem_total_bytes: int
    pods: tuple[PodUid, ...]
    idle_since: int | None
    cluster: Cluster = DEFAULT_CLUSTER


SinkRecord = PodLifecycle | Attribution | GpuWindow | Alert | Capacity | K8sWorkload | GpuLive


class Command(NamedTuple):
    """One call of a named Lua script: what the executor sends as EVALSHA."""

    script: ScriptName
    keys: tuple[str, ...]
    args: tuple[str, ...]

    @classmethod
    def of(cls, call: ScriptCall) -> Command:
        """The command of a call built by name (`script_args`), flattened in script order."""
        return cls(*call.flat())


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Where and how long: the key prefix, the finished-pod TTL and the stream caps."""

    keys: RedisKeys = field(default_factory=RedisKeys)
    finished_ttl_s: int = 86_400
    timeline_maxlen: int = 1000  # about 1000 transitions and alerts: a pod's whole story
    alerts_maxlen: int = 10_000  # a day of alerts of a large fleet at a few per minute
    leaderboard_ms: int = 3_600_000  # docs/DESIGN.md §5: waste over the last hour

    def __post_init__(self) -> None:
        for name in ("finished_ttl_s", "timeline_maxlen", "alerts_maxlen", "leaderboard_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def gpu_live(
    sample: NvmlSample, gpu: GpuReading, pods: Iterable[PodUid], idle_since: int | None
) -> GpuLive:
    """The live state of one GPU reading of a node sample."""
    return GpuLive(
        uuid=gpu.uuid,
        node=sample.node,
        model=gpu.model,
        sharing=gpu.sharing,
        parent_uuid=gpu.parent_uuid,
        ts=sample.ts + sample.interval_ms,
        util_pct=gpu.util_pct,
        mem_used_bytes=gpu.mem_used_bytes,
        mem_total_bytes=gpu.mem_total_bytes,
        pods=tuple(sorted(set(pods))),
        idle_since=idle_since,
        cluster=sample.cluster,
    )


def gpu_live_states(sample: NvmlSample, idle_since: Mapping[GpuUuid, int | None]) -> list[GpuLive]:
    """Every GPU of a node sample, each with the pods allocated on it or computing on it."""
    holders: dict[GpuUuid, set[PodUid]] = {}
    for allocation in sample.allocations:
        for device in allocation.device_ids:
            holders.setdefault(device, set()).add(allocation.pod_uid)
    states = []
    for gpu in sample.gpus:
        pods = holders.get(gpu.uuid, set()) | {
            p.pod_uid for p in gpu.processes if p.pod_uid is not None
        }
        states.append(gpu_live(sample, gpu, pods, idle_since.get(gpu.uuid)))
    return states


def plan(batch: Iterable[SinkRecord], options: PlanOptions | None = None) -> list[Command]:
    """The script calls that apply `batch`, in batch order.

    GPU live states and GPU windows are coalesced per GPU to the newest one in the batch
    (at 40,000 GPU-samples/s most of a batch is superseded readings; a window by start,
    then revision), and capacity records per key to the one the capacity hash would keep
    (`_capacity`); other records with the same identity are planned once, an attribution
    window as its highest revision in the batch. The live states go out `GPU_LIVE_CHUNK`
    GPUs to a call, where the first of them was in the batch.
    """
    opts = options or PlanOptions()
    newest_gpu: dict[tuple[str, GpuUuid], tuple[int, tuple[int, int], GpuLive | GpuWindow]] = {}
    newest_capacity: dict[str, tuple[int, Command]] = {}
    newest_window: dict[tuple[object, ...], tuple[int, Attribution]] = {}
    planned: list[tuple[int, list[Command]]] = []
    seen: set[tuple[object, ...]] = set()
    for position, record in enumerate(batch):
        if isinstance(record, Capacity | K8sWorkload):
            command = (
                _capacity(record, opts) if isinstance(record, Capacity) else _workload(record, opts)
            )
            held = newest_capacity.get(command.args[0])
            if held is None or _newest_order(command) > _newest_order(held[1]):
                newest_capacity[command.args[0]] = (position, command)
        elif isinstance(record, GpuLive | GpuWindow):
            slot = (type(record).__name__, record.uuid)
            order = (
                (record.ts, 0)
                if isinstance(record, GpuLive)
                else (record.window_start, record.revision)
            )
            if slot not in newest_gpu or order >= newest_gpu[slot][1]:
                newest_gpu[slot] = (position, order, record)
        elif isinstance(record, Attribution):
            window = newest_window.get(identity := _identity(record))
            if window is None or record.revision > window[1].revision:
                newest_window[identity] = (position if window is None else window[0], record)
        elif (identity := _identity(record)) not in seen:
            seen.add(identity)
            planned.append((position, _commands(record, opts)))
    planned += [(position, [command]) for position, command in newest_capacity.values()]
    planned += [(position, [_attribution(r, opts)]) for position, r in newest_window.values()]
    live: list[tuple[int, GpuLive]] = []
    for position, _, record in newest_gpu.values():
        if isinstance(record, GpuLive):
            live.append((position, record))
        else:
            planned.append((position, [_gpu_window(record, opts)]))
    live.sort(key=lambda item: item[0])
    for at in range(0, len(live), GPU_LIVE_CHUNK):
        chunk = live[at : at + GPU_LIVE_CHUNK]
        planned.append((chunk[0][0], [_gpu_live([r for _, r in chunk], opts)]))
    planned.sort(key=lambda item: item[0])
    return [command for _, commands in planned for command in commands]


def plan_live(states: Sequence[GpuLive], options: PlanOptions | None = None) -> list[Command]:
    """The calls that write live states already coalesced (at most one per GPU), in order."""
    opts = options or PlanOptions()
    return [
        _gpu_live(list(states[at : at + GPU_LIVE_CHUNK]), opts)
        for at in range(0, len(states), GPU_LIVE_CHUNK)
    ]


def _identity(record: PodLifecycle | Attribution | Alert) -> tuple[object, ...]:
    """A record's identity: replays of it are the same write."""
    if isinstance(record, PodLifecycle):
        return ("lifecycle", record.uid, record.ts, record.from_state, record.to_state)
    if isinstance(record, Attribution):
        return ("attribution", record.uid, record.window_start)
    return ("alert", record.fingerprint, record.status, record.ts)


def _commands(
    record: PodLifecycle | Attribution | Alert | GpuLive | GpuWindow, opts: PlanOptions
) -> list[Command]:
    """The script calls of one record (capacity records are coalesced first: `plan`)."""
    if isinstance(record, PodLifecycle):
        return _lifecycle(record, opts)
    if isinstance(record, Attribution):
        return [_attribution(record, opts)]
    if isinstance(record, Alert):
        return _alert(record, opts)
    if isinstance(record, GpuLive):
        return [_gpu_live([record], opts)]
    return [_gpu_window(record, opts)]


def _lifecycle(record: PodLifecycle, opts: PlanOptions) -> list[Command]:
    """Timeline entry first, then the state change (which may set the pod's expiry)."""
    keys = opts.keys
    entry = _timeline(
        record.uid,
        f"transition:{record.ts}:{record.from_state or ''}:{record.to_state}",
        record.ts,
        opts,
        {
            "kind": "transition",
            "ts": str(record.ts),
            "from_state": _s(record.from_state),
            "to_state": record.to_state,
            "reason": _s(record.reason),
            "queued_ms": str(record.queued_ms),
            "running_ms": str(record.running_ms),
            "stalled_ms": str(record.stalled_ms),
        },
    )
    pod, windows, timeline, seen = keys.pod_keys(record.uid)
    transition = PodTransition(
        pod=pod,
        windows=windows,
        timeline=timeline,
        seen=seen,
        states=keys.states(),
        uid=record.uid,
        ts=str(record.ts),
        to_state=record.to_state,
        reason=_s(record.reason),
        namespace=record.namespace,
        pod_name=record.pod,
        node=_s(record.node),
        labels=_json(record.labels),
        ttl_s=str(opts.finished_ttl_s),
        cluster=_named(record.cluster),
    )
    return [entry, Command.of(transition)]


def _attribution(record: Attribution, opts: PlanOptions) -> Command:
    """Per-window cost and waste upserts, latest-window fields and the hour leaderboards;
    nothing where a higher revision of the window was applied (pod_window.lua)."""
    keys, ws = opts.keys, record.window_start
    gpus = [
        {
            "uuid": gpu.uuid,
            "model": gpu.model,
            "sharing": gpu.sharing,
            "method": gpu.method,
            "share": _share(gpu.used_gpu_seconds, gpu.allocated_gpu_seconds, gpu.method),
            "vram_peak_bytes": gpu.vram_peak_bytes,
        }
        for gpu in record.gpus
    ]
    share = _share(record.used_gpu_seconds, record.allocated_gpu_seconds, record.method)
    pod, windows, timeline, seen = keys.pod_keys(record.uid)
    window = PodWindow(
        pod=pod,
        windows=windows,
        timeline=timeline,
        seen=seen,
        waste_pods_window=keys.waste_pods_window(ws),
        waste_namespaces_window=keys.waste_namespaces_window(ws),
        waste_pods=keys.waste_pods(),
        waste_namespaces=keys.waste_namespaces(),
        waste_windows=keys.waste_windows(),
        uid=record.uid,
        namespace=record.namespace,
        pod_name=record.pod,
        node=_s(record.node),
        labels=_json(record.labels),
        window_start=str(ws),
        window_end=str(record.window_end),
        cost_nusd=str(_nano(record.cost_usd)),
        waste_nusd=str(_nano(record.waste_usd)),
        vram_bytes=str(record.vram_peak_bytes),
        share=_s(share),
        gpus=_json(gpus),
        state=record.state,
        ttl_s=str(opts.finished_ttl_s),
        hour_ms=str(opts.leaderboard_ms),
        pods_window_prefix=keys.waste_pods_window_prefix(),
        namespaces_window_prefix=keys.waste_namespaces_window_prefix(),
        cluster=_named(record.cluster),
        work_units=_json(record.work_units) if record.work_units else "",
        revision=str(record.revision),
    )
    return Command.of(window)


def _alert(record: Alert, opts: PlanOptions) -> list[Command]:
    """Firing set upsert, the alert stream, and the timeline of each pod it concerns."""
    keys = opts.keys
    identity = f"alert:{record.fingerprint}:{record.status}:{record.ts}"
    fields = {
        "kind": "alert",
        "ts": str(record.ts),
        "fingerprint": record.fingerprint,
        "name": record.name,
        "status": record.status,
        "severity": record.severity,
        "since": str(record.since),
        "summary": record.summary,
        "value": _s(record.value),
        "subject": _json(record.subject),
        "labels": _json(record.labels),
        **_cluster_field(record.cluster),
    }
    state = AlertState(
        firing=keys.alerts_firing(),
        last=keys.alerts_last(),
        fingerprint=record.fingerprint,
        status=record.status,
        ts=str(record.ts),
        json=_json(msgspec.to_builtins(record)),  # `cluster` as the alert has it
        ttl_ms=str(opts.finished_ttl_s * 1000),
    )
    stream = TimelineAdd(
        stream=keys.alerts(),
        seen=keys.alerts_seen(),
        identity=identity,
        ts=str(record.ts),
        maxlen=str(opts.alerts_maxlen),
        ttl_s="0",
        fields=_flat(fields),
    )
    commands = [Command.of(state), Command.of(stream)]
    for uid in _pods_of(record):
        commands.append(_timeline(uid, identity, record.ts, opts, fields))
    return commands


def _capacity(record: Capacity, opts: PlanOptions) -> Command:
    """The record's JSON under its key in the capacity hash, unless a later one is there.

    One hash, not a key per picture: the keys are few (clusters x models x GPU resources)
    and a reader wants them all at once (one HGETALL). The JSON is the record as its topic
    carries it (no `cluster` for the default cluster), keys sorted, so equal records are
    equal strings and the tie at an equal `ts` is the same whatever the arrival order.
    """
    message = _json(msgspec.to_builtins(record))
    call = FieldIfNewer(
        hash=opts.keys.capacity(), field=record.key(), ts=str(record.ts), json=message
    )
    return Command.of(call)


def _workload(record: K8sWorkload, opts: PlanOptions) -> Command:
    """A Kueue workload's latest record under its uid, unless a later one is there; its
    DELETED record removes it (workload.lua)."""
    call = WorkloadCall(
        workloads=opts.keys.workloads(),
        deleted=opts.keys.workloads_deleted(),
        uid=record.uid,
        ts=str(record.ts),
        json=_json(msgspec.to_builtins(record)),
        deletes="1" if record.type == "DELETED" else "",
        keep_ms=str(DELETED_KEEP_MS),
        resource_version=record.resource_version,
    )
    return Command.of(call)


def _newest_order(command: Command) -> tuple[int, bool, int, str]:
    """Which of two writes of one field a hash keeps: the later ts, then a deletion, then
    (a workload's) the later numeric resource version, then the greater JSON
    (field_if_newer.lua, workload.lua)."""
    workload = command.script == "workload"
    deletes = workload and command.args[3] == "1"
    version = command.args[5] if workload else ""
    return (
        int(command.args[1]),
        deletes,
        int(version) if version.isdecimal() else -1,
        command.args[2],
    )


def _pods_of(record: Alert) -> list[PodUid]:
    """The pods whose timelines take the alert: a pod subject's, or the pods a GPU alert
    names by uid (`pod_uid`, or `pod_uids` for a GPU's several holders)."""
    uid = record.subject.uid
    if record.subject.kind == "pod":
        return [] if uid is None else [uid]
    labels = record.labels
    if "pod_uid" in labels:
        return [PodUid(labels["pod_uid"])]
    return [PodUid(u) for u in labels.get("pod_uids", "").split(",") if u]


def _timeline(
    uid: PodUid, identity: str, ts: int, opts: PlanOptions, fields: Mapping[str, str]
) -> Command:
    """Append one entry to a pod's timeline unless its identity is already there."""
    keys = opts.keys
    call = TimelineAdd(
        stream=keys.timeline(uid),
        seen=keys.timeline_seen(uid),
        pod=keys.pod(uid),
        identity=identity,
        ts=str(ts),
        maxlen=str(opts.timeline_maxlen),
        ttl_s=str(opts.finished_ttl_s),
        fields=_flat(fields),
    )
    return Command.of(call)


def _gpu_live(records: list[GpuLive], opts: PlanOptions) -> Command:
    """The GPU hashes' live fields, each unless a newer sample already wrote them.

    One call for many GPUs: keys are the GPU index then each GPU's hash; the one argument
    is a JSON array of rows `[uuid, updated_at, field, value, ...]`, all strings, in the
    order of the keys. Per GPU that is a few string formats here, not a script call.
    """
    keys = opts.keys
    rows = [
        (
            r.uuid,
            str(r.ts),
            "node",
            r.node,
            "model",
            r.model,
            "sharing",
            r.sharing,
            "parent_uuid",
            r.parent_uuid or "",
            "util_pct",
            "" if r.util_pct is None else repr(r.util_pct),
            "mem_used_bytes",
            str(r.mem_used_bytes),
            "mem_total_bytes",
            str(r.mem_total_bytes),
            "pods",
            _json(r.pods),
            "idle_since",
            "" if r.idle_since is None else str(r.idle_since),
            *(("cluster", r.cluster) if r.cluster != DEFAULT_CLUSTER else ()),
        )
        for r in records
    ]
    call = GpuLiveCall(
        index=keys.gpus(),
        gpus=tuple(keys.gpu(r.uuid) for r in records),
        rows=msgspec.json.encode(rows).decode(),
    )
    return Command.of(call)


def _gpu_window(record: GpuWindow, opts: PlanOptions) -> Command:
    """The GPU hash's latest-window fields, unless a later window, or a higher revision of
    this one, already wrote them (`window_revision`: absent for revision 0)."""
    fields = {
        **_cluster_field(record.cluster),
        "node": record.node,
        "model": record.model,
        "window_end": str(record.window_end),
        "window_util_mean_pct": _s(record.util_mean_pct),
        "window_idle_seconds": repr(record.idle_seconds),
        "window_allocated_idle_seconds": repr(record.allocated_idle_seconds),
        "window_unallocated_seconds": repr(record.unallocated_seconds),
        "window_unattributed_ratio": _s(record.unattributed_ratio),
    }
    call = HsetIfNewer(
        hash=opts.keys.gpu(record.uuid),
        order_field="window_start",
        order_value=str(record.window_start),
        tie_field="window_revision",
        tie_value=str(record.revision),
        index_member=record.uuid,
        fields=_flat(fields),
    )
    return Command.of(call)


def _share(used: float, allocated: float, method: str) -> float | None:
    """Mean compute share over the allocated GPU-seconds; None when it is unknown."""
    if method == "unknown" or allocated <= 0:
        return None
    return min(1.0, used / allocated)


def _nano(usd: float) -> int:
    """US dollars as integer nano-dollars (exact to sum, far below a cent of rounding)."""
    return round(usd * NANO)


def _named(cluster: str) -> str:
    """A named cluster, or "" for the default one (whose hashes have no `cluster` field)."""
    return "" if cluster == DEFAULT_CLUSTER else cluster


def _cluster_field(cluster: str) -> dict[str, str]:
    """The `cluster` field of a hash or stream entry: a named cluster's only, as its records
    have it, so a single-cluster set-up writes exactly the fields it wrote before."""
    return {} if cluster == DEFAULT_CLUSTER else {"cluster": cluster}


def _s(value: str | float | None) -> str:
    """A scalar as a hash field value; None (unknown, not applicable) as the empty string."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _flat(fields: Mapping[str, str]) -> tuple[str, ...]:
    """Hash fields as the flat field, value, field, value... of HSET and XADD."""
    return tuple(item for pair in fields.items() for item in pair)


def _json(value: object) -> str:
    """Compact JSON with sorted keys, so equal values are equal strings."""
    return msgspec.json.encode(value, order="sorted").decode()
