"""Pod fixtures and builders of the pod processor tests; the fixtures' own lifecycle checks.

The other `test_lifecycle*` / `test_pod_*` modules import the builders from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.k8s_pod import TOPIC as PODS
from schemas.k8s_pod import K8sPod
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import TOPIC as USAGE
from schemas.pod_usage import GpuUsage, PodUsage
from schemas.settings import RuleSettings, WindowSettings
from streams.core.pod import lifecycle
from streams.core.pod.pod_state import PodState

FIXTURES = Path(__file__).parent / "fixtures" / "pods"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))
RULES = RuleSettings()  # stall 300 s, queued alert 600 s, idle 5 %
WINDOWS = WindowSettings()  # 60 s windows, 10 s lateness
UID = PodUid("11111111-2222-4333-8444-555555555555")
GPU_A = GpuUuid("GPU-aaaaaaaa-0000-4000-8000-000000000001")
GPU_B = GpuUuid("GPU-bbbbbbbb-0000-4000-8000-000000000002")


def events(name: str) -> list[K8sPod]:
    """A fixture's messages, each decoded through the `k8s.pods` codec."""
    raw: list[dict[str, Any]] = json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))
    return [PODS.decode(json.dumps(message)) for message in raw]


def replay(
    messages: list[K8sPod], rules: RuleSettings = RULES
) -> tuple[PodState | None, list[PodLifecycle]]:
    """Feed pod events through the state machine; the last state and every transition."""
    state: PodState | None = None
    out: list[PodLifecycle] = []
    for message in messages:
        state, transitions = lifecycle.on_pod_event(state, message, rules)
        out += transitions
    return state, out


def pod(
    phase: str = "Running",
    *,
    ts: int,
    rv: int,
    uid: PodUid = UID,
    type_: str = "MODIFIED",
    created_at: int = 0,
    containers: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> K8sPod:
    """A pod event of the test pod `ml/train-0` (team vision), through the codec."""
    if containers is None:
        state = "running" if phase == "Running" else "waiting"
        reason = None if phase == "Running" else "ContainerCreating"
        if phase in ("Succeeded", "Failed"):
            state, reason = "terminated", "Completed" if phase == "Succeeded" else "Error"
        containers = [container(state, reason, exit_code=0 if phase == "Succeeded" else None)]
    scheduled = {"type": "PodScheduled", "status": "True", "reason": None, "message": None}
    message = {
        "schema": "gpuwatch.k8s.pod/v1",
        "type": type_,
        "ts": ts,
        "resource_version": str(rv),
        "uid": uid,
        "namespace": "ml",
        "name": "train-0",
        "node": "gpu-node-17",
        "phase": phase,
        "created_at": created_at,
        "scheduled_at": created_at,
        "started_at": created_at,
        "finished_at": None,
        "gpu_request": {"nvidia.com/gpu": 2},
        "conditions": conditions if conditions is not None else [scheduled],
        "containers": containers,
        "labels": {"team": "vision", "project": "llm"},
        "owner": {"kind": "Job", "name": "train"},
        "priority_class": None,
        "queue": None,
    }
    return PODS.decode(json.dumps(message))


def container(
    state: str, reason: str | None = None, *, exit_code: int | None = None, restarts: int = 0
) -> dict[str, Any]:
    """One container status of a pod event."""
    return {
        "name": "trainer",
        "state": state,
        "reason": reason,
        "exit_code": exit_code,
        "restarts": restarts,
    }


def gpu(uuid: GpuUuid = GPU_A, *, seconds: float, method: str = "exclusive", **kw: Any) -> GpuUsage:
    """One GPU's usage over `seconds`: allocated all of it, used half, idle a tenth."""
    values: dict[str, Any] = {
        "uuid": uuid,
        "model": "NVIDIA H100 80GB HBM3",
        "sharing": "exclusive" if method == "exclusive" else "time-slicing",
        "allocated_seconds": seconds,
        "used_gpu_seconds": seconds / 2,
        "idle_seconds": seconds / 10,
        "vram_byte_seconds": seconds * 1e9,
        "vram_peak_bytes": 40 * 2**30,
        "energy_joules": seconds * 400.0,
        "share_mean": 0.5,
        "cost_usd": seconds * 0.001,
        "waste_usd": seconds * 0.0001,
        "method": method,
    }
    values.update(kw)
    return msgspec.convert(values, GpuUsage)


def usage(
    ts: int,
    end_ts: int,
    *,
    idle_since: int | None = None,
    gpus: tuple[GpuUsage, ...] | None = None,
    uid: PodUid = UID,
) -> PodUsage:
    """A usage message of the test pod over `[ts, end_ts)`, one exclusive GPU by default."""
    value = PodUsage(
        schema="gpuwatch.pod.usage/v1",
        uid=uid,
        node=NodeName("gpu-node-17"),
        ts=ts,
        end_ts=end_ts,
        gpus=gpus if gpus is not None else (gpu(seconds=(end_ts - ts) / 1000),),
        idle_since=idle_since,
        samples=max((end_ts - ts) // 1000, 0),
    )
    return USAGE.decode(USAGE.encode(value))


def moves(records: list[PodLifecycle]) -> list[tuple[str | None, str, str | None, int]]:
    """(from, to, reason, ts) of each transition."""
    return [(r.from_state, r.to_state, r.reason, r.ts) for r in records]


# --- the fixtures' own checks ---------------------------------------------------------------


def test_every_fixture_is_one_pods_life_in_publishing_order() -> None:
    assert len(NAMES) == 8
    for name in NAMES:
        messages = events(name)
        assert len({m.uid for m in messages}) == 1, name
        assert [m.ts for m in messages] == sorted(m.ts for m in messages), name
        assert messages[0].type == "ADDED", name


EXPECTED: dict[str, list[tuple[str | None, str, str | None, int]]] = {
    "pending-unschedulable": [
        (None, "queued", "Scheduling", 1741079551000),
        ("queued", "queued", "Unschedulable", 1741079551012),
    ],
    "image-pull-backoff": [  # ImagePullBackOff after ErrImagePull is no new reason
        (None, "queued", "ContainerCreating", 1741082531000),
        ("queued", "queued", "ImagePull", 1741082540000),
    ],
    "crashloop-after-start": [  # the OOM kill alone is no crash loop; running again + ready
        (None, "queued", "ContainerCreating", 1741075205000),
        ("queued", "running", None, 1741075209000),
        ("running", "stalled", "CrashLoopBackOff", 1741075806000),
        ("stalled", "running", None, 1741075825000),
    ],
    "oomkilled": [  # first seen 2 s after creation: queued from creation
        (None, "queued", "ContainerCreating", 1741088400000),
        ("queued", "running", None, 1741088420000),
        ("running", "finished", "OOMKilled", 1741091476000),
    ],
    "job-completed": [  # the DELETED after Succeeded changes nothing
        (None, "queued", "Scheduling", 1741053600000),
        ("queued", "queued", "PodInitializing", 1741053601000),
        ("queued", "running", None, 1741053675000),
        ("running", "finished", "Completed", 1741056450000),
    ],
    "evicted": [  # first seen running; the DisruptionTarget while running changes nothing
        (None, "running", None, 1741039874000),
        ("running", "finished", "Evicted", 1741068903000),
    ],
    "deleted-while-running": [
        (None, "running", None, 1741075272000),
        ("running", "finished", "Deleted", 1741078720000),
    ],
    "kueue-gated": [  # the RESYNC of the unchanged gated pod changes nothing
        (None, "queued", "WaitingForQuota", 1741090000000),
        ("queued", "queued", "ContainerCreating", 1741090900000),
        ("queued", "running", None, 1741090930000),
    ],
}


@pytest.mark.parametrize("name", NAMES)
def test_fixture_transitions(name: str) -> None:
    _, records = replay(events(name))
    assert moves(records) == EXPECTED[name]


@pytest.mark.parametrize("name", NAMES)
def test_fixture_replayed_twice_over_adds_nothing(name: str) -> None:
    """A relist after a watcher restart re-sends old states: no transition comes of it."""
    messages = events(name)
    state, first = replay(messages)
    for message in messages:
        state, again = lifecycle.on_pod_event(state, message, RULES)
        assert again == [], (name, message.resource_version)
    assert len(first) == len(EXPECTED[name])


def test_crash_loop_totals() -> None:
    _, records = replay(events("crashloop-after-start"))
    back = records[-1]
    assert (back.queued_ms, back.running_ms, back.stalled_ms) == (4000, 597000, 19000)
    assert back.labels == {"team": "nlp", "project": "search", "app.kubernetes.io/name": "embedder"}


def test_unschedulable_keeps_the_pod_unbound() -> None:
    state, records = replay(events("pending-unschedulable"))
    assert state is not None
    assert state.node is None
    assert records[-1].node is None
    assert (state.state, state.reason, state.since) == ("queued", "Unschedulable", 1741079551000)
