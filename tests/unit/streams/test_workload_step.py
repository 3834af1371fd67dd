"""A Kueue workload's lifecycle and WorkloadQueuedTooLong, worked out by hand."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuwatch.harness.examples import example
from schemas import K8sWorkload
from schemas.settings import RuleSettings
from streams.core.workload import workload_step
from streams.core.workload.workload_step import Workload, apply, is_replay, next_due, step_to

T0 = 1_764_412_800_000
MIN = 60_000
RULES = RuleSettings(queued_alert_after_s=600)
QUOTA = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu"


def value(ts: int, rv: int, *conditions: dict[str, Any], **fields: Any) -> K8sWorkload:
    data = example("gpuwatch.k8s.workload/v1")
    data.update(
        ts=ts, resource_version=str(rv), created_at=T0, conditions=list(conditions), **fields
    )
    return msgspec.convert(data, K8sWorkload)


def cond(kind: str, status: str, reason: str, at: int, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "at": at}


WAITING = cond("QuotaReserved", "False", "Pending", T0, QUOTA)
ADMITTED = cond("Admitted", "True", "Admitted", T0 + 20 * MIN)
FINISHED = cond("Finished", "True", "Succeeded", T0 + 30 * MIN)


def run(values: list[K8sWorkload], stop: int) -> tuple[list[Any], list[Any], Workload]:
    """Values applied in order, each workload stepped to each value's time and to `stop`."""
    state: Workload | None = None
    lifecycle: list[Any] = []
    alerts: list[Any] = []
    for v in values:
        if is_replay(state, v):
            continue
        if state is not None:
            state, fired = step_to(state, v.ts, RULES)
            alerts += fired
        state, out = apply(state, v, RULES)
        lifecycle += out.lifecycle
        alerts += out.alerts
    assert state is not None
    state, fired = step_to(state, stop, RULES)
    return lifecycle, alerts + fired, state


def brief(records: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (r.from_state, r.to_state, r.ts - T0, r.reason, r.queued_ms, r.admitted_ms) for r in records
    ]


def test_queued_twenty_minutes_for_quota_admitted_and_finished() -> None:
    values = [
        value(T0 + 1_000, 1, WAITING),
        value(
            T0 + 20 * MIN + 1_000,
            2,
            WAITING,
            ADMITTED,
            admitted_at=T0 + 20 * MIN,
            cluster_queue="gpu-cq",
        ),
        value(
            T0 + 30 * MIN + 1_000,
            3,
            ADMITTED,
            FINISHED,
            admitted_at=T0 + 20 * MIN,
            finished_at=T0 + 30 * MIN,
        ),
    ]
    lifecycle, alerts, state = run(values, T0 + 40 * MIN)
    assert brief(lifecycle) == [
        (None, "queued", 0, "WaitingForQuota", 0, 0),
        ("queued", "admitted", 20 * MIN + 1_000, None, 20 * MIN + 1_000, 0),
        ("admitted", "finished", 30 * MIN + 1_000, "Succeeded", 20 * MIN + 1_000, 10 * MIN),
    ]
    assert lifecycle[1].cluster_queue == "gpu-cq"
    assert lifecycle[0].job_uid == values[0].job_uid
    assert [(a.name, a.status, a.ts - T0, a.since - T0, a.value) for a in alerts] == [
        ("WorkloadQueuedTooLong", "firing", 10 * MIN, 0, 600.0),
        ("WorkloadQueuedTooLong", "resolved", 20 * MIN + 1_000, 0, 1201.0),
    ]
    assert alerts[0].subject.kind == "workload"
    assert alerts[0].labels == {
        "namespace": "research",
        "workload": "job-llm-pretrain-3f2a1",
        "queue": "research",
        "team": "vision",
        "job_uid": "7e6d5c4b-3a29-4817-8f6e-5d4c3b2a1908",
    }
    assert alerts[0].fingerprint == alerts[1].fingerprint
    assert state.state == "finished"


def test_a_value_read_again_changes_nothing_and_a_resync_moves_no_state() -> None:
    first = value(T0 + 1_000, 1, WAITING)
    _lifecycle, _, state = run([first], T0 + 2_000)
    assert is_replay(state, first)
    resync = msgspec.structs.replace(first, ts=T0 + 5_000, type="RESYNC")
    assert not is_replay(state, resync)
    after, out = apply(state, resync, RULES)
    assert out.lifecycle == []
    assert after.state == "queued"


def test_an_alert_fires_only_after_an_unbroken_stretch_and_an_eviction_queues_again() -> None:
    evicted = cond("Evicted", "True", "Preempted", T0 + 8 * MIN)
    values = [
        value(T0, 1, WAITING),
        value(T0 + 5 * MIN, 2, ADMITTED, admitted_at=T0 + 5 * MIN),
        value(T0 + 8 * MIN, 3, evicted),
    ]
    lifecycle, alerts, state = run(values, T0 + 17 * MIN)
    assert [(r.to_state, r.reason, r.ts - T0) for r in lifecycle] == [
        ("queued", "WaitingForQuota", 0),
        ("admitted", None, 5 * MIN),
        ("queued", "Preempted", 8 * MIN),
    ]
    assert alerts == []  # queued 5 min, then 9 min so far: neither is 10
    assert next_due(state, RULES) == T0 + 18 * MIN
    _, fired = step_to(state, T0 + 18 * MIN, RULES)
    assert [(a.status, a.since - T0) for a in fired] == [("firing", 8 * MIN)]


def test_a_workload_first_seen_finished_tells_its_whole_story_from_its_conditions() -> None:
    late = value(
        T0 + 50 * MIN, 9, ADMITTED, FINISHED, admitted_at=T0 + 20 * MIN, finished_at=T0 + 30 * MIN
    )
    lifecycle, alerts, state = run([late], T0 + 50 * MIN)
    assert brief(lifecycle) == [
        (None, "queued", 0, None, 0, 0),
        ("queued", "admitted", 20 * MIN, None, 20 * MIN, 0),
        ("admitted", "finished", 30 * MIN, "Succeeded", 20 * MIN, 10 * MIN),
    ]
    assert [a.status for a in alerts] == ["firing", "resolved"]
    assert workload_step.decode(workload_step.encode(state)) == state


def test_a_deletion_the_watcher_did_not_see_finishes_the_workload_at_the_relist() -> None:
    # Queued (its alert firing) when the watcher went down; it found the workload gone from
    # its first list after the restart: the last value it knew, DELETED, at the relist's time.
    last = value(T0 + 1_000, 1, WAITING)
    relisted_at = T0 + 60 * MIN
    gone = msgspec.structs.replace(last, type="DELETED", ts=relisted_at, final_state_unknown=True)
    lifecycle, alerts, state = run([last, gone], T0 + 70 * MIN)
    assert brief(lifecycle) == [
        (None, "queued", 0, "WaitingForQuota", 0, 0),
        ("queued", "finished", 60 * MIN, "Deleted", 60 * MIN, 0),
    ]
    assert [(a.status, a.ts - T0) for a in alerts] == [("firing", 10 * MIN), ("resolved", 60 * MIN)]
    assert (state.state, state.deleted, next_due(state, RULES)) == ("finished", True, None)
    # One Kueue had finished keeps its reason and time; the deletion lets its state go.
    done = value(T0 + 31 * MIN, 2, ADMITTED, FINISHED, finished_at=T0 + 30 * MIN)
    gone = msgspec.structs.replace(done, type="DELETED", ts=relisted_at, final_state_unknown=True)
    lifecycle, _, state = run([done, gone], T0 + 70 * MIN)
    assert [(r.to_state, r.reason, r.ts - T0) for r in lifecycle][-1] == (
        "finished", "Succeeded", 30 * MIN
    )  # fmt: skip
    assert state.deleted
