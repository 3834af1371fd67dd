"""Six cluster scenarios in one input stream, with answers worked out by hand, on the pure core.

One stream of `nvml.samples` and `k8s.pods` messages holds six scenarios, each on nodes and
pods of its own, over 300 s of event time (5 s samples from `t0`, a window start):

1. time-sharing: two pods time-slice one GPU with per-process SM % (`method=process`);
2. idle stall: a pod idles on its exclusive GPU past `stall_after_s`, then computes again;
3. crash loop: a running pod's container goes into CrashLoopBackOff;
4. queued too long: an unschedulable pod, with no event after its first;
5. leak: a pod's process runs on a GPU allocated to another pod;
6. completed: a pod queues, runs and succeeds.

At 295 s the watcher relists the pods still running (RESYNC). The answers (`check_*`) are
derived by hand in their docstrings and comments, never by calling the code under test.
Here the stream runs through the partition processors (no Kafka) in two orders: as it
happens (a tick after every message) and as a backlog (every pod event first, ticks only
at the end). `tests/integration/worker/test_scenarios.py` runs the same stream through
Kafka and `gpuwatch worker`, checks the same answers, and that a copy of the stream one day
older gives the same records one day earlier.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
import pytest

from schemas import (
    ALERTS,
    ATTRIBUTION,
    DEADLETTER,
    GPU_WINDOWS,
    K8S_PODS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    POD_USAGE,
    Alert,
    Allocation,
    Attribution,
    GpuProcess,
    GpuReading,
    GpuWindow,
    K8sPod,
    NvmlSample,
    PodLifecycle,
    PodUsage,
    TopicSpec,
)
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.prices import BUILTIN_PRICES
from schemas.settings import RuleSettings, WindowSettings
from streams.core.integrals import PriceBook
from streams.core.ticks import Tick
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Source
from streams.processors.pod import PodConfig, PodPartition

S = 1000  # ms per second: the scenarios are written in seconds after t0
DAY_MS = 86_400_000
STEP_S = 5  # every node samples [t, t + 5 s) for t = 0, 5, ..., 295
END_S = 300
STALL_AFTER_S = 120
QUEUED_ALERT_AFTER_S = 180
RULES = RuleSettings(stall_after_s=STALL_AFTER_S, queued_alert_after_s=QUEUED_ALERT_AFTER_S)
WINDOWS = WindowSettings()  # 60 s windows, 10 s allowed lateness
SETTINGS_ENV = {
    "GPUWATCH_STALL_AFTER_S": str(STALL_AFTER_S),
    "GPUWATCH_QUEUED_ALERT_AFTER_S": str(QUEUED_ALERT_AFTER_S),
    "GPUWATCH_WINDOW_S": "60",
    "GPUWATCH_ALLOWED_LATENESS_S": "10",
    "GPUWATCH_IDLE_UTIL_PCT": "5",
    "GPUWATCH_IDLE_ALERT_AFTER_S": "60",
    "GPUWATCH_TELEMETRY_MISSING_AFTER_S": "30",
}
"""The worker's settings for the stream, as `gpuwatch worker` reads them."""

MODEL = "NVIDIA H100 80GB HBM3"
USD_PER_HOUR = 4.0  # the built-in price table's H100 line
POWER_W = 300.0  # every GPU draws 300 W: energy = 300 W x seconds x the pod's share
GIB = 2**30
MEM_TOTAL = 85_520_809_984  # an H100 80GB as NVML reports it
DRIVER_MEM = 512 * 2**20  # memory in use on a GPU besides its processes'

P_SHARE_A = PodUid("5ce0a001-0000-4000-8000-000000000001")  # 1: SM 60 %
P_SHARE_B = PodUid("5ce0a001-0000-4000-8000-000000000002")  # 1: SM 20 %, idle [60, 120)
P_IDLE = PodUid("5ce0a002-0000-4000-8000-000000000003")  # 2
P_CRASH = PodUid("5ce0a003-0000-4000-8000-000000000004")  # 3
P_QUEUED = PodUid("5ce0a004-0000-4000-8000-000000000005")  # 4
P_HOLDER = PodUid("5ce0a005-0000-4000-8000-000000000006")  # 5: holds G_LEAK_1
P_LEAKER = PodUid("5ce0a005-0000-4000-8000-000000000007")  # 5: holds G_LEAK_2, runs on both
P_DONE = PodUid("5ce0a006-0000-4000-8000-000000000008")  # 6
NAMES = {
    P_SHARE_A: "share-a",
    P_SHARE_B: "share-b",
    P_IDLE: "idler",
    P_CRASH: "crasher",
    P_QUEUED: "waiter",
    P_HOLDER: "holder",
    P_LEAKER: "leaker",
    P_DONE: "finisher",
}
N_SHARE, N_IDLE, N_CRASH, N_LEAK, N_DONE = (
    NodeName(f"gwtest-sc-{n}") for n in ("share", "idle", "crash", "leak", "done")
)
G_SHARE = GpuUuid("GPU-5ce0a001-0000-4000-8000-00000000000a")
G_IDLE = GpuUuid("GPU-5ce0a002-0000-4000-8000-00000000000b")
G_CRASH = GpuUuid("GPU-5ce0a003-0000-4000-8000-00000000000c")
G_LEAK_1 = GpuUuid("GPU-5ce0a005-0000-4000-8000-00000000000d")
G_LEAK_2 = GpuUuid("GPU-5ce0a005-0000-4000-8000-00000000000e")
G_DONE = GpuUuid("GPU-5ce0a006-0000-4000-8000-00000000000f")
GPUS = (G_SHARE, G_IDLE, G_CRASH, G_LEAK_1, G_LEAK_2, G_DONE)
RUNNING_FROM_START = (P_SHARE_A, P_SHARE_B, P_IDLE, P_CRASH, P_HOLDER, P_LEAKER)


# --- The inputs -------------------------------------------------------------------------


def proc(pid: int, mem_gib: float, sm_pct: float | None, uid: PodUid | None) -> GpuProcess:
    """A process on a GPU; `uid` None is a host process."""
    return GpuProcess(
        pid=pid,
        mem_bytes=int(mem_gib * GIB),
        sm_pct=sm_pct,
        pod_uid=uid,
        container=None if uid is None else "main",
    )


def reading(
    uuid: GpuUuid,
    index: int,
    util: float,
    procs: Iterable[GpuProcess] = (),
    sharing: str = "exclusive",
) -> GpuReading:
    """One H100 over one sample at `util` % with `procs` on it."""
    procs = tuple(procs)
    used = DRIVER_MEM + sum(p.mem_bytes or 0 for p in procs)
    return msgspec.convert(
        {
            "uuid": uuid,
            "index": index,
            "model": MODEL,
            "parent_uuid": None,
            "mig_profile": None,
            "sharing": sharing,
            "util_pct": util,
            "mem_util_pct": util / 2,
            "mem_used_bytes": used,
            "mem_total_bytes": MEM_TOTAL,
            "power_w": POWER_W,
            "temp_c": 50,
            "xid_errors": [],
            "ecc_dbe": 0,
            "processes": [msgspec.to_builtins(p) for p in procs],
        },
        GpuReading,
    )


def holds(uid: PodUid, *uuids: GpuUuid) -> Allocation:
    """The kubelet's allocation of `uuids` to the pod's container."""
    return Allocation(
        pod_uid=uid,
        namespace="ml",
        pod=NAMES[uid],
        container="main",
        resource="nvidia.com/gpu",
        device_ids=uuids,
    )


NodeAt = Callable[[int], tuple[list[GpuReading], list[Allocation]]]
"""A node's GPUs and allocations in the sample starting `s` seconds after t0."""


def share_node(s: int) -> tuple[list[GpuReading], list[Allocation]]:
    """1: both pods hold the time-sliced GPU; in [60, 120) B is idle and a host process runs."""
    a = proc(1101, 30, 60.0, P_SHARE_A)
    if 60 <= s < 120:
        procs = [a, proc(1102, 10, 0.0, P_SHARE_B), proc(1199, 2, 10.0, None)]
        gpu = reading(G_SHARE, 0, 70.0, procs, "time-slicing")
    else:
        gpu = reading(G_SHARE, 0, 80.0, [a, proc(1102, 10, 20.0, P_SHARE_B)], "time-slicing")
    return [gpu], [holds(P_SHARE_A, G_SHARE), holds(P_SHARE_B, G_SHARE)]


def idle_node(s: int) -> tuple[list[GpuReading], list[Allocation]]:
    """2: 50 % until 30 s, 0 % (the process keeps its memory) until 200 s, then 40 %."""
    util = 50.0 if s < 30 else 0.0 if s < 200 else 40.0
    return [reading(G_IDLE, 0, util, [proc(2101, 20, None, P_IDLE)])], [holds(P_IDLE, G_IDLE)]


def crash_node(s: int) -> tuple[list[GpuReading], list[Allocation]]:
    """3: 90 % until the crash at 100 s; then no process and 0 %, the GPU still allocated."""
    procs = [proc(3101, 40, None, P_CRASH)] if s < 100 else []
    gpu = reading(G_CRASH, 0, 90.0 if s < 100 else 0.0, procs)
    return [gpu], [holds(P_CRASH, G_CRASH)]


def leak_node(s: int) -> tuple[list[GpuReading], list[Allocation]]:
    """5: in [120, 180) the leaker's pid 4202 (SM 30 %) runs on the holder's GPU too."""
    first = [proc(4101, 20, 50.0, P_HOLDER)]
    if 120 <= s < 180:
        first.append(proc(4202, 8, 30.0, P_LEAKER))
    gpus = [
        reading(G_LEAK_1, 0, 80.0 if 120 <= s < 180 else 50.0, first),
        reading(G_LEAK_2, 1, 70.0, [proc(4201, 30, 70.0, P_LEAKER)]),
    ]
    return gpus, [holds(P_HOLDER, G_LEAK_1), holds(P_LEAKER, G_LEAK_2)]


def done_node(s: int) -> tuple[list[GpuReading], list[Allocation]]:
    """6: the pod holds the GPU at 90 % in [170, 250); before and after it is free and idle."""
    if 170 <= s < 250:
        return [reading(G_DONE, 0, 90.0, [proc(5101, 60, None, P_DONE)])], [holds(P_DONE, G_DONE)]
    return [reading(G_DONE, 0, 0.0)], []


NODES: dict[NodeName, NodeAt] = {
    N_SHARE: share_node,
    N_IDLE: idle_node,
    N_CRASH: crash_node,
    N_LEAK: leak_node,
    N_DONE: done_node,
}


def pod_event(
    uid: PodUid,
    *,
    s: int,
    rv: int,
    phase: str,
    node: NodeName | None,
    created_s: int,
    type_: str = "MODIFIED",
    container: tuple[str, str | None, int | None, int] = ("running", None, None, 0),
    at: Callable[[int], int],
) -> K8sPod:
    """A `k8s.pods` value of a scenario pod; `container` is (state, reason, exit code, restarts)."""
    state, reason, exit_code, restarts = container
    scheduled = {"type": "PodScheduled", "status": "True", "reason": None, "message": None}
    if node is None:
        scheduled = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/5 nodes are available: 5 Insufficient nvidia.com/gpu.",
        }
    done = phase in ("Succeeded", "Failed")
    message = {
        "schema": "gpuwatch.k8s.pod/v1",
        "type": type_,
        "ts": at(s),
        "resource_version": str(rv),
        "uid": uid,
        "namespace": "ml",
        "name": NAMES[uid],
        "node": node,
        "phase": phase,
        "created_at": at(created_s),
        "scheduled_at": None if node is None else at(created_s),
        "started_at": None if phase == "Pending" else at(created_s + 2),
        "finished_at": at(s) if done else None,
        "gpu_request": {"nvidia.com/gpu": 1},
        "conditions": [scheduled],
        "containers": []
        if node is None
        else [
            {
                "name": "main",
                "state": state,
                "reason": reason,
                "exit_code": exit_code,
                "restarts": restarts,
            }
        ],
        "labels": {"team": "vision"},
        "owner": {"kind": "Job", "name": NAMES[uid]},
        "priority_class": None,
        "queue": None,
    }
    return K8S_PODS.decode(json.dumps(message))


class Input(NamedTuple):
    """One input message: its topic (unprefixed spec), key, value and event time."""

    spec: TopicSpec[Any]
    key: bytes
    value: bytes
    ts: int


def pod_events(t0: int) -> list[K8sPod]:
    """Every pod event of the stream, in event-time order."""

    def at(s: int) -> int:
        return t0 + s * S

    running = [
        pod_event(
            uid, s=-5, rv=10 + i, phase="Running", node=node, created_s=-60, type_="ADDED", at=at
        )
        for i, (uid, node) in enumerate(
            [
                (P_SHARE_A, N_SHARE),
                (P_SHARE_B, N_SHARE),
                (P_IDLE, N_IDLE),
                (P_CRASH, N_CRASH),
                (P_HOLDER, N_LEAK),
                (P_LEAKER, N_LEAK),
            ]
        )
    ]
    events = [
        *running,
        # 4: created at 0 and never scheduled; no event after this one.
        pod_event(
            P_QUEUED, s=0, rv=20, phase="Pending", node=None, created_s=0, type_="ADDED", at=at
        ),
        # 3: the container exits and the kubelet backs off restarting it.
        pod_event(
            P_CRASH,
            s=100,
            rv=30,
            phase="Running",
            node=N_CRASH,
            created_s=-60,
            container=("waiting", "CrashLoopBackOff", None, 1),
            at=at,
        ),
        # 6: created at 150 on its node, the container being created; running at 170;
        # its container completes at 250.
        pod_event(
            P_DONE,
            s=150,
            rv=40,
            phase="Pending",
            node=N_DONE,
            created_s=150,
            type_="ADDED",
            container=("waiting", "ContainerCreating", None, 0),
            at=at,
        ),
        pod_event(P_DONE, s=170, rv=41, phase="Running", node=N_DONE, created_s=150, at=at),
        pod_event(
            P_DONE,
            s=250,
            rv=42,
            phase="Succeeded",
            node=N_DONE,
            created_s=150,
            container=("terminated", "Completed", 0, 0),
            at=at,
        ),
    ]
    # At 295 s the watcher relists: every pod still running is sent again as it is (same
    # resource version). Read before the usage of the minutes before it, as in a replayed
    # backlog, it must not make a pod that idled less than stall_after_s stall.
    latest = {e.uid: e for e in events}
    relist = [
        msgspec.structs.replace(latest[uid], type="RESYNC", ts=at(295))
        for uid in RUNNING_FROM_START
    ]
    return events + relist


def samples(t0: int) -> list[NvmlSample]:
    """Every node's samples, 5 s each over [t0, t0 + 300 s), in event-time order."""
    out = []
    for seq, s in enumerate(range(0, END_S, STEP_S)):
        for node, at_s in NODES.items():
            gpus, allocations = at_s(s)
            out.append(
                NvmlSample(
                    schema="gpuwatch.nvml.sample/v1",
                    node=node,
                    ts=t0 + s * S,
                    interval_ms=STEP_S * S,
                    seq=seq,
                    gpus=tuple(gpus),
                    allocations=tuple(allocations),
                )
            )
    return out


def build_stream(t0: int) -> list[Input]:
    """The whole input in event-time order; at equal times pod events come first."""
    events = [Input(K8S_PODS, e.uid.encode(), K8S_PODS.encode(e), e.ts) for e in pod_events(t0)]
    data = [Input(NVML_SAMPLES, x.node.encode(), NVML_SAMPLES.encode(x), x.ts) for x in samples(t0)]
    order = {K8S_PODS.name: 0, NVML_SAMPLES.name: 1}
    return sorted([*events, *data], key=lambda m: (m.ts, order[m.spec.name]))


# --- The outputs and the answers ------------------------------------------------------


@dataclass
class Records:
    """The derived records of one run, decoded."""

    lifecycle: list[PodLifecycle] = field(default_factory=list)
    attribution: list[Attribution] = field(default_factory=list)
    windows: list[GpuWindow] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    usage: list[PodUsage] = field(default_factory=list)
    deadletters: int = 0


def identities(records: Records) -> dict[str, dict[tuple[Any, ...], Any]]:
    """Every derived record by topic and identity (copies of an identity must be equal).

    `pod.usage` is left out: it is internal and its message boundaries depend on timing (a
    tick that moves stream time past a flush boundary before a node's next sample emits
    the pending message early: the same integrals in more messages).
    """
    keyed: dict[str, tuple[list[Any], Callable[[Any], tuple[Any, ...]]]] = {
        "pod.lifecycle": (records.lifecycle, lambda c: (c.uid, c.ts, c.to_state)),
        "attribution": (records.attribution, lambda a: (a.uid, a.window_start)),
        "gpu.windows": (records.windows, lambda w: (w.uuid, w.window_start)),
        "alerts": (records.alerts, lambda a: (a.fingerprint, a.status, a.ts)),
    }
    out: dict[str, dict[tuple[Any, ...], Any]] = {}
    for topic, (values, key) in keyed.items():
        by_id: dict[tuple[Any, ...], Any] = {}
        for value in values:
            seen = by_id.setdefault(key(value), value)
            assert seen == value, f"{topic}: two different records of {key(value)}"
        out[topic] = by_id
    return out


def differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where two decoded JSON values differ, floats compared to 1e-9 relative."""
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(got) != sorted(want):
            return [f"{path}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items != {len(want)}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in differences(g, w, f"{path}[{i}]")
        ]
    return [] if close(got, want) else [f"{path}: {got!r} != {want!r}"]


def assert_same_records(got: Records, want: Records) -> None:
    """The same identities on every derived topic, each with an equal record."""
    mine, theirs = identities(got), identities(want)
    for topic, records in theirs.items():
        assert sorted(mine[topic]) == sorted(records), topic
        for key, record in records.items():
            diff = differences(msgspec.to_builtins(mine[topic][key]), msgspec.to_builtins(record))
            assert diff == [], (topic, key, diff)


def moved(records: Records, ms: int) -> Records:
    """The records with every event time moved by `ms`."""
    return Records(
        lifecycle=[shifted(c, ms) for c in records.lifecycle],
        attribution=[shifted(a, ms) for a in records.attribution],
        windows=[shifted(w, ms) for w in records.windows],
        alerts=[shifted(a, ms) for a in records.alerts],
        usage=[shifted(u, ms) for u in records.usage],
        deadletters=records.deadletters,
    )


def shifted(value: Any, ms: int) -> Any:
    """A record with its event times (`ts`, windows, `since`, `idle_since`) moved by `ms`."""
    names = ("ts", "end_ts", "window_start", "window_end", "since", "idle_since")
    changes = {n: getattr(value, n) + ms for n in names if getattr(value, n, None) is not None}
    return msgspec.structs.replace(value, **changes)


def close(actual: Any, expected: Any) -> bool:
    """Equal, floats to 1e-9 relative (sums of fractions of seconds and dollars)."""
    if isinstance(expected, float) and isinstance(actual, float | int):
        return bool(actual == pytest.approx(expected, rel=1e-9, abs=1e-12))
    return bool(actual == expected)


def values(record: Any, names: str) -> tuple[Any, ...]:
    """Some fields of a record, by space-separated names."""
    return tuple(getattr(record, name) for name in names.split())


approx = pytest.approx
ATT = "allocated_gpu_seconds used_gpu_seconds idle_gpu_seconds cost_usd waste_usd"
GPU = "util_mean_pct busy_seconds idle_seconds allocated_seconds allocated_idle_seconds"
LINE = "uid allocated_seconds used_gpu_seconds idle_seconds share_mean"


def windows_of(records: Records, uid: PodUid, t0: int) -> dict[int, Attribution]:
    """A pod's attribution records by window start in seconds after t0."""
    out = {(a.window_start - t0) // S: a for a in records.attribution if a.uid == uid}
    assert len(out) == sum(a.uid == uid for a in records.attribution), "a window twice"
    return out


def gpu_windows_of(records: Records, uuid: GpuUuid, t0: int) -> dict[int, GpuWindow]:
    """A GPU's windows by window start in seconds after t0."""
    return {(w.window_start - t0) // S: w for w in records.windows if w.uuid == uuid}


def moves(records: Records, uid: PodUid, t0: int) -> list[tuple[Any, ...]]:
    """A pod's transitions: (from, to, reason, ts s, queued s, running s, stalled s)."""
    return [
        (c.from_state, c.to_state, c.reason, *(x / S for x in (c.ts - t0, *spent(c))))
        for c in sorted(records.lifecycle, key=lambda c: c.ts)
        if c.uid == uid
    ]


def spent(c: PodLifecycle) -> tuple[int, int, int]:
    """Milliseconds queued, running and stalled by a transition."""
    return c.queued_ms, c.running_ms, c.stalled_ms


def alerts_of(records: Records, name: str, t0: int) -> list[tuple[Any, ...]]:
    """Alerts of one name: (status, ts s, since s, value, subject uid or uuid), by time."""
    return [
        (a.status, (a.ts - t0) / S, (a.since - t0) / S, a.value, a.subject.uid or a.subject.uuid)
        for a in sorted(records.alerts, key=lambda a: (a.ts, a.status))
        if a.name == name
    ]


def check_time_sharing(r: Records, t0: int) -> None:
    """1. Two pods time-slice one GPU; SM 60 % and 20 % of a device reading of 80 %.

    Shares (method process: per-process SM %; all processes' 80 % does not exceed the
    device's 80 %, so no scaling): A 0.60, B 0.20, unattributed 0. In [60, 120) the device
    reads 70 %: A 60 %, B 0 % (idle: under 5 %), a host process 10 % (no pod).
    Per 60 s window each pod holds the GPU half the time (k = 2): 30 allocated GPU-s and
    half the GPU's cost: 60 s x 4 USD/h / 3600 / 2 = 1/30 USD.
    A: used 0.60 x 60 = 36 GPU-s, energy 300 W x 60 s x 0.60 = 10,800 J, VRAM 30 GiB.
    B: used 0.20 x 60 = 12 GPU-s (3,600 J); in [60, 120) used 0, idle 30 allocated GPU-s,
    so its waste is its whole cost, 1/30 USD. Idle 60 s < 120 s: no stall.
    """
    for uid in (P_SHARE_A, P_SHARE_B):
        assert moves(r, uid, t0) == [(None, "running", None, -5.0, 0.0, 0.0, 0.0)]
    a_windows, b_windows = windows_of(r, P_SHARE_A, t0), windows_of(r, P_SHARE_B, t0)
    assert sorted(a_windows) == sorted(b_windows) == [0, 60, 120, 180]
    for start, a in a_windows.items():
        assert values(a, ATT + " energy_joules vram_peak_bytes vram_byte_seconds") == approx(
            (30.0, 36.0, 0.0, 1 / 30, 0.0, 10_800.0, 30 * GIB, 30.0 * GIB * 60)
        )
        end = t0 + (start + 60) * S
        assert values(a, "method state node pod window_end ts") == (
            ("process", "running", N_SHARE, "share-a", end, end)
        )
        assert [values(g, "uuid sharing method") for g in a.gpus] == [
            (G_SHARE, "time-slicing", "process")
        ]
    for start, b in b_windows.items():
        idle = start == 60
        want = (0.0, 30.0, 1 / 30, 0.0) if idle else (12.0, 0.0, 0.0, 3_600.0)
        assert values(b, "used_gpu_seconds idle_gpu_seconds waste_usd energy_joules") == approx(
            want
        )
        assert values(b, "allocated_gpu_seconds cost_usd") == approx((30.0, 1 / 30))
        assert values(b, "vram_peak_bytes method state") == (10 * GIB, "process", "running")
    # The GPU's view. [0, 60): busy all 60 s at 80 %, allocated all of it, never idle;
    # the pods explain 0.80 of 0.80: attributed 1, unattributed 0.
    # [60, 120): 70 %, the pods explain 0.60 x 60 = 36 GPU-s of 0.70 x 60 = 42:
    # attributed 36 / 42 = 6/7, unattributed 1/7 (the host process). The device is busy,
    # so no allocated idle second, though pod B idles.
    by_start = gpu_windows_of(r, G_SHARE, t0)
    assert sorted(by_start) == [0, 60, 120, 180]
    for start, w in by_start.items():
        host = start == 60
        assert values(w, GPU) == approx((70.0 if host else 80.0, 60.0, 0.0, 60.0, 0.0))
        ratios = (6 / 7, 1 / 7) if host else (1.0, 0.0)
        assert values(w, "attributed_ratio unattributed_ratio") == approx(ratios)
        assert (w.unallocated_seconds, w.node, [p.pod for p in w.pods]) == (
            0.0,
            N_SHARE,
            ["share-a", "share-b"],
        )
        assert values(w.pods[0], LINE) == approx((P_SHARE_A, 30.0, 36.0, 0.0, 0.6))
        b_line = (P_SHARE_B, 30.0, 0.0, 30.0, 0.0) if host else (P_SHARE_B, 30.0, 12.0, 0.0, 0.2)
        assert values(w.pods[1], LINE) == approx(b_line)
    shared = {G_SHARE, P_SHARE_A, P_SHARE_B}
    assert [a for a in r.alerts if {a.subject.uid, a.subject.uuid} & shared] == []


def check_idle_stall(r: Records, t0: int) -> None:
    """2. A pod idles on its exclusive GPU from 30 s to 200 s; stall_after_s is 120.

    Running since its first event (-5 s). 0 % from the sample at 30 s: idle since 30 s;
    stalled at 30 + 120 = 150 s (running 155 s by then); computing again at 200 s (the
    start of the first busy sample): running, after 50 s stalled. PodStalled fires at 150 s
    with since 30 s (value 120 s) and resolves at 200 s (value 170 s).
    GpuIdleAllocated (idle_alert_after_s 60): the idle run starts at 30 s and fires at
    30 + 60 = 90 s; the first busy sample (200 s) resolves it, 170 s after it began.
    Windows (exclusive: the device reading is the pod's share; 60 s allocated, 1/15 USD):
    [0, 60): 30 s at 50 % = 15 GPU-s used, 30 s idle (waste 30/900 = 1/30 USD);
    [60, 120) and [120, 180): all idle, waste = cost = 1/15 USD;
    [180, 240): 20 s idle (waste 20/900 = 1/45 USD), 40 s at 40 % = 16 GPU-s used.
    State at each window's end: running at 60 s and 120 s, stalled at 180 s, running at 240 s.
    Energy: 300 W x seconds x share = 300 x used GPU-s.
    """
    assert moves(r, P_IDLE, t0) == [
        (None, "running", None, -5.0, 0.0, 0.0, 0.0),
        ("running", "stalled", "Idle", 150.0, 0.0, 155.0, 0.0),
        ("stalled", "running", None, 200.0, 0.0, 155.0, 50.0),
    ]
    assert [a for a in alerts_of(r, "PodStalled", t0) if a[4] == P_IDLE] == [
        ("firing", 150.0, 30.0, 120.0, P_IDLE),
        ("resolved", 200.0, 30.0, 170.0, P_IDLE),
    ]
    assert [a for a in alerts_of(r, "GpuIdleAllocated", t0) if a[4] == G_IDLE] == [
        ("firing", 90.0, 30.0, 60.0, G_IDLE),
        ("resolved", 200.0, 30.0, 170.0, G_IDLE),
    ]
    firing = next(a for a in r.alerts if a.name == "PodStalled" and a.subject.uid == P_IDLE)
    assert values(firing, "severity") + values(firing.subject, "kind node") == (
        ("warning", "pod", N_IDLE)
    )
    assert firing.labels == {"namespace": "ml", "pod": "idler", "team": "vision", "node": N_IDLE}
    expected = {  # window start s: (used, idle, waste), state at its end
        0: ((15.0, 30.0, 1 / 30), "running"),
        60: ((0.0, 60.0, 1 / 15), "running"),
        120: ((0.0, 60.0, 1 / 15), "stalled"),
        180: ((16.0, 20.0, 1 / 45), "running"),
    }
    by_start = windows_of(r, P_IDLE, t0)
    assert sorted(by_start) == sorted(expected)
    for start, ((used, idle, waste), state) in expected.items():
        a = by_start[start]
        assert values(a, ATT + " energy_joules") == approx(
            (60.0, used, idle, 1 / 15, waste, POWER_W * used)
        )
        assert values(a, "state method") == (state, "exclusive")
    # The device: [0, 60) 30 s busy at 50 % (mean 25 %), 30 s idle while allocated;
    # [60, 180) idle throughout: nothing to attribute (ratio null); [180, 240) 40 s at 40 %
    # (mean 1600 / 60 %), 20 s idle. On an exclusive GPU the pod explains all its use.
    gpu = {0: (25.0, 30.0, 1.0), 60: (0.0, 60.0, None), 120: (0.0, 60.0, None)}
    gpu[180] = (1600 / 60, 20.0, 1.0)
    by_start_gpu = gpu_windows_of(r, G_IDLE, t0)
    assert sorted(by_start_gpu) == sorted(gpu)
    for start, (mean, idle, ratio) in gpu.items():
        assert values(by_start_gpu[start], GPU + " attributed_ratio") == approx(
            (mean, 60.0 - idle, idle, 60.0, idle, ratio)
        )


def check_crash_loop(r: Records, t0: int) -> None:
    """3. The container goes into CrashLoopBackOff at 100 s, after the pod ran.

    running -> stalled at the event's time, reason CrashLoopBackOff (lifecycle_reasons),
    after 105 s running. PodStalled fires at 100 s with since = the stall (value 0). The
    crash loop outranks idleness: idle since 100 s, the idle stall due at 220 s changes
    nothing. The GPU stays allocated with nothing on it: GpuIdleAllocated at 100 + 60 s.
    Windows: [0, 60) 54 GPU-s used (90 %); [60, 120) 40 s at 90 % = 36 GPU-s, 20 s idle
    (waste 1/45 USD), stalled at 120 s; [120, 240) all idle, all waste (1/15 USD a window),
    VRAM 0 (no process).
    """
    assert moves(r, P_CRASH, t0) == [
        (None, "running", None, -5.0, 0.0, 0.0, 0.0),
        ("running", "stalled", "CrashLoopBackOff", 100.0, 0.0, 105.0, 0.0),
    ]
    assert [a for a in alerts_of(r, "PodStalled", t0) if a[4] == P_CRASH] == [
        ("firing", 100.0, 100.0, 0.0, P_CRASH)
    ]
    assert [a for a in alerts_of(r, "GpuIdleAllocated", t0) if a[4] == G_CRASH] == [
        ("firing", 160.0, 100.0, 60.0, G_CRASH)
    ]
    expected = {  # window start s: (used, idle, waste, VRAM peak), state at its end
        0: ((54.0, 0.0, 0.0, 40 * GIB), "running"),
        60: ((36.0, 20.0, 1 / 45, 40 * GIB), "stalled"),
        120: ((0.0, 60.0, 1 / 15, 0), "stalled"),
        180: ((0.0, 60.0, 1 / 15, 0), "stalled"),
    }
    by_start = windows_of(r, P_CRASH, t0)
    assert sorted(by_start) == sorted(expected)
    for start, (numbers, state) in expected.items():
        names = "used_gpu_seconds idle_gpu_seconds waste_usd vram_peak_bytes"
        assert values(by_start[start], names) == approx(numbers)
        assert by_start[start].state == state


def check_queued_too_long(r: Records, t0: int) -> None:
    """4. Created at 0 s, unschedulable, and not a message about it since.

    Queued since its creation, reason Unschedulable. PodQueuedTooLong fires at 0 + 180 s
    (queued_alert_after_s) when the stream time other pods' and nodes' data carries reaches
    it; since 0 s, value 180 s; no node label (never bound). No GPU time: no attribution.
    """
    assert moves(r, P_QUEUED, t0) == [(None, "queued", "Unschedulable", 0.0, 0.0, 0.0, 0.0)]
    assert alerts_of(r, "PodQueuedTooLong", t0) == [("firing", 180.0, 0.0, 180.0, P_QUEUED)]
    (alert,) = [a for a in r.alerts if a.name == "PodQueuedTooLong"]
    assert alert.labels == {"namespace": "ml", "pod": "waiter", "team": "vision"}
    assert values(alert, "severity") + values(alert.subject, "kind node") == (
        ("warning", "pod", None)
    )
    assert windows_of(r, P_QUEUED, t0) == {}


def check_leak(r: Records, t0: int) -> None:
    """5. In [120, 180) the leaker's pid 4202 runs on G_LEAK_1, which only the holder holds.

    GpuUnallocatedAccess fires at 120 s (the first sample showing it, value = 1 pid) on the
    GPU, naming the pod (it holds G_LEAK_2 on the node, so the sample names it), and is
    resolved by the first sample without it, at 180 s (value 0).
    While it runs the GPU is no longer one pod's: method process, SM 50 % for the holder
    and 30 % for the leaker of a device reading of 80 % (no scaling). The holder: used
    0.5 x 60 = 30 GPU-s in [120, 180) as in every window (50 % exclusive elsewhere), but
    by method process. The leaker gets 0.3 x 60 = 18 GPU-s on G_LEAK_1 with 0 allocated
    seconds and no cost, plus its own GPU: 0.7 x 60 = 42 GPU-s, 60 s allocated, 1/15 USD.
    """
    assert alerts_of(r, "GpuUnallocatedAccess", t0) == [
        ("firing", 120.0, 120.0, 1.0, G_LEAK_1),
        ("resolved", 180.0, 120.0, 0.0, G_LEAK_1),
    ]
    firing = next(a for a in r.alerts if a.name == "GpuUnallocatedAccess")
    assert values(firing, "severity") + values(firing.subject, "kind node") == (
        ("critical", "gpu", N_LEAK)
    )
    assert firing.labels == {
        "node": N_LEAK,
        "gpu": G_LEAK_1,
        "model": MODEL,
        "pod_uid": P_LEAKER,
        "pids": "4202",
        "namespace": "ml",
        "pod": "leaker",
    }
    holder = windows_of(r, P_HOLDER, t0)
    assert sorted(holder) == [0, 60, 120, 180]
    for start, a in holder.items():
        assert values(a, ATT) == approx((60.0, 30.0, 0.0, 1 / 15, 0.0))
        assert a.method == ("process" if start == 120 else "exclusive")
    leaker = windows_of(r, P_LEAKER, t0)[120]
    assert values(leaker, ATT + " vram_peak_bytes method") == approx(
        (60.0, 60.0, 0.0, 1 / 15, 0.0, 38 * GIB, "process")  # VRAM 8 GiB + 30 GiB
    )
    names = "uuid allocated_gpu_seconds used_gpu_seconds cost_usd method"
    assert values(leaker.gpus[0], names) == approx((G_LEAK_1, 0.0, 18.0, 0.0, "process"))
    assert values(leaker.gpus[1], names) == approx((G_LEAK_2, 60.0, 42.0, 1 / 15, "exclusive"))
    # The leaked GPU's window: 80 % all explained (0.5 + 0.3), the leaker's line named
    # from its allocation of the other GPU, 0 allocated seconds.
    window = gpu_windows_of(r, G_LEAK_1, t0)[120]
    assert values(window, "util_mean_pct allocated_seconds attributed_ratio") == approx(
        (80.0, 60.0, 1.0)
    )
    assert values(window.pods[0], LINE) == approx((P_HOLDER, 60.0, 30.0, 0.0, 0.5))
    assert values(window.pods[1], LINE + " pod") == approx(
        (P_LEAKER, 0.0, 18.0, 0.0, 0.3, "leaker")
    )


def check_completed(r: Records, t0: int) -> None:
    """6. Created at 150 s (container being created), running at 170 s, Succeeded at 250 s.

    queued 150 -> 170 s (20 s, reason ContainerCreating), running 170 -> 250 s (80 s),
    finished at 250 s, reason Completed. It holds the GPU at 90 % over [170, 250):
    [120, 180): 10 s allocated, 9 GPU-s used, 10/900 = 1/90 USD, running at 180 s;
    [180, 240): 60 s, 54 GPU-s, 1/15 USD;
    [240, 300) ends at the finish, 250 s: 10 s, 9 GPU-s, 1/90 USD, state finished. That
    record comes when stream time passes the finish + 10 s lateness (260 s): the stream
    ends at 300 s, before [240, 300) closes by time (310 s), so no other record of that
    window exists.
    """
    assert moves(r, P_DONE, t0) == [
        (None, "queued", "ContainerCreating", 150.0, 0.0, 0.0, 0.0),
        ("queued", "running", None, 170.0, 20.0, 0.0, 0.0),
        ("running", "finished", "Completed", 250.0, 20.0, 80.0, 0.0),
    ]
    expected = {  # window start s: (window end s, allocated, used, idle, cost, waste), state
        120: ((180, 10.0, 9.0, 0.0, 1 / 90, 0.0), "running"),
        180: ((240, 60.0, 54.0, 0.0, 1 / 15, 0.0), "running"),
        240: ((250, 10.0, 9.0, 0.0, 1 / 90, 0.0), "finished"),
    }
    by_start = windows_of(r, P_DONE, t0)
    assert sorted(by_start) == sorted(expected)
    for start, ((end, *numbers), state) in expected.items():
        a = by_start[start]
        assert values(a, ATT) == approx(tuple(numbers))
        assert values(a, "window_end ts state method") == (
            (t0 + end * S, t0 + end * S, state, "exclusive")
        )
    last_window = t0 + 240 * S
    assert [a.uid for a in r.attribution if a.window_start == last_window] == [P_DONE]
    assert [w for w in r.windows if w.window_start == last_window] == []
    # The free GPU before the pod: unallocated and idle, nothing to attribute; [120, 180)
    # holds 10 s of the pod at 90 % (mean 90 x 10 / 60 = 15 %).
    windows = gpu_windows_of(r, G_DONE, t0)
    names = GPU + " unallocated_seconds attributed_ratio"
    assert values(windows[0], names) == approx((0.0, 0.0, 60.0, 0.0, 0.0, 60.0, None))
    assert values(windows[120], names) == approx((15.0, 10.0, 50.0, 10.0, 0.0, 50.0, 1.0))
    assert [a for a in r.alerts if {a.subject.uid, a.subject.uuid} & {P_DONE, G_DONE}] == []


CHECKS = (
    check_time_sharing,
    check_idle_stall,
    check_crash_loop,
    check_queued_too_long,
    check_leak,
    check_completed,
)


def check_totals(r: Records, t0: int) -> None:
    """Nothing but the records above: 13 transitions, 9 alerts, 27 attributions, 24 windows.

    Transitions: 6 pods first seen running, the queued pod, 2 of the idle pod, 1 of the
    crash loop, 3 of the completed pod (the relist at 295 s changes nothing). Alerts:
    PodStalled x 3 (idle firing and resolved, crash loop), GpuIdleAllocated x 3 (idle GPU
    firing and resolved, the crashed pod's GPU), PodQueuedTooLong, GpuUnallocatedAccess x 2
    (no NodeTelemetryMissing: every node samples to the end). Attribution: 6 pods running
    throughout x 4 windows closed by 300 s ([0, 240)), the completed pod's 3. GPU windows:
    6 GPUs x the same 4.
    """
    found = identities(r)
    assert [len(found[t]) for t in ("pod.lifecycle", "alerts", "attribution", "gpu.windows")] == [
        13,
        9,
        6 * 4 + 3,
        6 * 4,
    ]
    assert len(r.lifecycle) == 13
    assert len(r.attribution) == 27
    assert sorted({w.uuid for w in r.windows}) == sorted(GPUS)
    assert {(w.window_start - t0) // S for w in r.windows} == {0, 60, 120, 180}
    assert r.deadletters == 0


# --- The pure core, driven as the worker drives it -----------------------------------


PREFIX = "sc."


class CoreRun:
    """One node partition and one pod partition, fed as the agent loop feeds them."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.out = Outputs(PREFIX, self.counters, now_ms=lambda: 0)
        node_config = NodeConfig(
            prefix=PREFIX,
            window_ms=WINDOWS.window_s * S,
            lateness_ms=WINDOWS.allowed_lateness_s * S,
            rules=RULES,
            prices=PriceBook(BUILTIN_PRICES),
        )
        self.node = NodePartition(0, node_config, self.counters)
        self.pods = PodPartition(0, PodConfig(PREFIX, 1, RULES, WINDOWS), self.counters)
        self.records = Records()
        self.offset = 0

    def feed(self, message: Input) -> None:
        """One input message, and the pod usage it makes."""
        source = Source(message.spec.full_name(PREFIX), 0, self.offset, message.key)
        self.offset += 1
        side = self.pods if message.spec is K8S_PODS else self.node
        side.handle(source, message.value, self.out)
        self._route()

    def tick(self) -> None:
        """A tick: the node side, then the pod side to the node side's stream time."""
        claims = {} if self.node.stream_time is None else {0: self.node.stream_time}
        self.node.on_tick(Tick(sender="core", claims=claims), self.out)
        self._route()
        claims = {} if self.node.stream_time is None else {0: self.node.stream_time}
        self.pods.on_tick(Tick(sender="core", claims=claims), self.out)
        self._route()

    def _route(self) -> None:
        """Decode what was made; pod usage goes on to the pod side, as through Kafka."""
        while records := self.out.take():
            for record in records:
                name = record.topic.removeprefix(PREFIX)
                if name == POD_USAGE.name:
                    usage = POD_USAGE.decode(record.value)
                    self.records.usage.append(usage)
                    source = Source(record.topic, 0, self.offset, record.key)
                    self.offset += 1
                    self.pods.handle(source, record.value, self.out)
                elif name == POD_LIFECYCLE.name:
                    self.records.lifecycle.append(POD_LIFECYCLE.decode(record.value))
                elif name == ATTRIBUTION.name:
                    self.records.attribution.append(ATTRIBUTION.decode(record.value))
                elif name == GPU_WINDOWS.name:
                    self.records.windows.append(GPU_WINDOWS.decode(record.value))
                elif name == ALERTS.name:
                    self.records.alerts.append(ALERTS.decode(record.value))
                else:
                    assert name == DEADLETTER.name, name
                    self.records.deadletters += 1


def run_live(stream: list[Input]) -> Records:
    """Messages in event-time order, a tick after each (a worker keeping up)."""
    run = CoreRun()
    for message in stream:
        run.feed(message)
        run.tick()
    run.tick()
    return run.records


def run_backlog(stream: list[Input]) -> Records:
    """Every pod event first, then the samples, ticks only at the end (a replayed backlog)."""
    run = CoreRun()
    for message in sorted(stream, key=lambda m: m.spec is not K8S_PODS):  # stable: in time
        run.feed(message)
    run.tick()
    run.tick()
    return run.records


T0 = 1_764_399_960_000  # a window start (2025-11-29)


@pytest.fixture(scope="module")
def live() -> Records:
    return run_live(build_stream(T0))


@pytest.fixture(scope="module")
def backlog() -> Records:
    return run_backlog(build_stream(T0))


def test_the_stream_holds_what_the_scenarios_say() -> None:
    stream = build_stream(T0)
    assert sum(m.spec is NVML_SAMPLES for m in stream) == len(NODES) * END_S // STEP_S
    assert sum(m.spec is K8S_PODS for m in stream) == 11 + 6  # 6 pods relisted
    assert BUILTIN_PRICES.usd_per_gpu_hour(MODEL, {}) == USD_PER_HOUR
    assert T0 % (WINDOWS.window_s * S) == 0


@pytest.mark.parametrize("check", [*CHECKS, check_totals], ids=lambda c: c.__name__)
def test_live_order_gives_the_hand_worked_records(
    live: Records, check: Callable[[Records, int], None]
) -> None:
    check(live, T0)


@pytest.mark.parametrize("check", [*CHECKS, check_totals], ids=lambda c: c.__name__)
def test_backlog_order_gives_the_hand_worked_records(
    backlog: Records, check: Callable[[Records, int], None]
) -> None:
    check(backlog, T0)


def test_both_orders_and_a_day_older_copy_give_equal_records(
    live: Records, backlog: Records
) -> None:
    assert_same_records(backlog, live)
    assert_same_records(moved(run_backlog(build_stream(T0 - DAY_MS)), DAY_MS), live)


def test_a_pod_event_ahead_of_the_usage_stalls_no_pod_that_did_not_idle_long_enough() -> None:
    """A relist read before the usage (a replayed backlog) once stalled a pod idle too briefly.

    `share-b` idles [60, 120) s, half of stall_after_s; the relist at 295 s moved its event
    time past 60 + 120 s before the usage of those seconds came, and the idle run of the
    first usage message counted as reaching it: stalled at 180 s, running again at 180 s.
    """
    stream = build_stream(T0)
    events = [m for m in stream if m.spec is K8S_PODS and m.key == P_SHARE_B.encode()]
    assert [K8S_PODS.decode(m.value).type for m in events] == ["ADDED", "RESYNC"]
    usage = [m for m in stream if m.spec is NVML_SAMPLES and m.key == N_SHARE.encode()]
    records = run_backlog(events + usage)
    assert moves(records, P_SHARE_B, T0) == [(None, "running", None, -5.0, 0.0, 0.0, 0.0)]
    assert records.alerts == []
    # Idle long enough, the same order stalls it at idle since + 120 s.
    longer = [m for m in stream if m.spec is NVML_SAMPLES and m.key == N_IDLE.encode()]
    idle_events = [m for m in stream if m.spec is K8S_PODS and m.key == P_IDLE.encode()]
    records = run_backlog(idle_events + longer)
    assert moves(records, P_IDLE, T0)[1][:4] == ("running", "stalled", "Idle", 150.0)
