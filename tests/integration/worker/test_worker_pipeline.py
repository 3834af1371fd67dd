"""`gpuwatch worker` against the real broker: 90 s of a simulated node and its pods, end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from worker_fixtures import (
    FINISH_S,
    QUEUED_UID,
    WINDOW_MS,
    S,
    Scenario,
    StartWorker,
    aligned_t0,
    consume_all,
    decoded,
    produce,
    scenario,
    wait_for,
)

from schemas import (
    ALERTS,
    ATTRIBUTION,
    DEADLETTER,
    GPU_WINDOWS,
    POD_LIFECYCLE,
    POD_USAGE,
)
from schemas.settings import Settings

pytestmark = pytest.mark.integration

OUTPUTS = (ATTRIBUTION, GPU_WINDOWS, POD_LIFECYCLE, ALERTS, POD_USAGE, DEADLETTER)


def window_utils(case: Scenario, uuid: str) -> list[float]:
    """The GPU's readings over the first window, from the samples the agent published."""
    in_window = [s for s in case.samples if case.t0 <= s.ts < case.t0 + WINDOW_MS]
    assert [s.interval_ms for s in in_window] == [S] * 60
    return [next(g.util_pct for g in s.gpus if g.uuid == uuid) or 0.0 for s in in_window]


def gpu_of(case: Scenario, uid: str) -> str:
    (uuid,) = next(p.gpu_uuids for p in (case.training, case.idle) if p.uid == uid)
    return uuid


def test_ninety_seconds_of_a_node_give_valid_records_with_the_right_numbers(
    scoped: Settings,
    start_worker: StartWorker,
    validators: dict[str, Draft202012Validator],
) -> None:
    case = scenario(scoped, aligned_t0())
    t0, training, idle = case.t0, case.training.uid, case.idle.uid
    produce(scoped, case.messages)
    worker = start_worker(scoped)

    def done() -> bool:
        names = {a.name for a in decoded(scoped, ALERTS)}
        return (
            len(decoded(scoped, ATTRIBUTION)) >= 3
            and {
                "PodQueuedTooLong",
                "PodStalled",
                "GpuIdleAllocated",
            }
            <= names
        )

    wait_for("the attributions and alerts of the 90 s", done, worker)
    worker.stop()
    assert worker.process.returncode == 0, worker.log
    counters = worker.counters()
    assert counters["deadletter"] == 0
    assert counters["late"] == 0, worker.log  # the finished pod's last seconds are not late

    records: dict[str, list[Any]] = {}
    for spec in OUTPUTS:
        raw = consume_all(scoped, spec.full_name(scoped.kafka.topic_prefix))
        for record in raw:
            errors = [
                e.message for e in validators[spec.name].iter_errors(json.loads(record.value))
            ]
            assert errors == [], f"{spec.name} offset {record.offset}: {errors}"
            assert record.key == spec.key_of(spec.decode(record.value)).encode()
        records[spec.name] = [spec.decode(record.value) for record in raw]
    assert records["deadletter"] == []

    # Attribution: the exclusive GPU's reading is the pod's share, so over the first window
    # used = sum(util / 100 x 1 s), allocated = 60 s; the idle pod's 60 s are all waste.
    price = scoped.cost.prices.usd_per_gpu_hour(case.samples[0].gpus[0].model, {})
    by_id = {(a.uid, a.window_start): a for a in records["attribution"]}
    assert sorted((uid == training, ws - t0) for uid, ws in by_id) == [
        (False, 0),
        (True, 0),
        (True, WINDOW_MS),
    ]
    for uid in (training, idle):
        first = by_id[(uid, t0)]
        utils = window_utils(case, gpu_of(case, uid))
        assert first.used_gpu_seconds == pytest.approx(sum(utils) / 100, abs=1e-6)
        assert first.allocated_gpu_seconds == pytest.approx(60.0)
        assert first.cost_usd == pytest.approx(price * 60 / 3600)
        assert (first.window_end, first.method, first.node) == (
            t0 + WINDOW_MS,
            "exclusive",
            case.node,
        )
        assert (first.namespace, first.labels) == ("ml", {"team": "vision"})
    assert by_id[(training, t0)].used_gpu_seconds > 30  # training runs at ~85-98 %
    assert by_id[(training, t0)].state == "running"
    idle_first = by_id[(idle, t0)]
    assert idle_first.used_gpu_seconds == 0.0
    assert idle_first.idle_gpu_seconds == pytest.approx(60.0)
    assert idle_first.waste_usd == pytest.approx(idle_first.cost_usd)
    assert idle_first.state == "stalled"  # idle since t0, stalled at t0 + 45 s
    last = by_id[(training, t0 + WINDOW_MS)]
    assert (last.window_end, last.state) == (t0 + FINISH_S * S, "finished")
    assert last.allocated_gpu_seconds == pytest.approx(FINISH_S - 60)

    # pod.usage carries the same integrals, pre-aggregated per flush interval.
    usage = [u for u in records["pod.usage"] if u.uid == training and u.end_ts <= t0 + WINDOW_MS]
    assert sum(u.samples for u in usage) == 60
    used = sum(g.used_gpu_seconds for u in usage for g in u.gpus)
    assert used == pytest.approx(by_id[(training, t0)].used_gpu_seconds)

    # gpu.windows: one per GPU for the closed window, the device's view.
    windows = {w.uuid: w for w in records["gpu.windows"]}
    assert len(records["gpu.windows"]) == len(windows) == 2
    for uid in (training, idle):
        window = windows[gpu_of(case, uid)]
        utils = window_utils(case, window.uuid)
        assert (window.window_start, window.window_end) == (t0, t0 + WINDOW_MS)
        assert window.util_mean_pct == pytest.approx(sum(utils) / 60)
        assert window.allocated_seconds == pytest.approx(60.0)
        assert window.busy_seconds + window.idle_seconds == pytest.approx(60.0)
        assert [p.uid for p in window.pods] == [uid]
    assert windows[gpu_of(case, idle)].allocated_idle_seconds == pytest.approx(60.0)

    changes = [
        (c.uid, c.from_state, c.to_state, c.reason, c.ts - t0) for c in records["pod.lifecycle"]
    ]
    assert sorted(changes, key=lambda c: (c[4], c[0])) == sorted(
        [
            (training, None, "running", None, -5 * S),
            (idle, None, "running", None, -5 * S),
            (QUEUED_UID, None, "queued", "Unschedulable", 0),
            (idle, "running", "stalled", "Idle", 45 * S),
            (training, "running", "finished", "Completed", FINISH_S * S),
        ],
        key=lambda c: (c[4], c[0]),
    )

    alerts = {(a.name, a.status): a for a in records["alerts"]}
    assert sorted(alerts) == [
        ("GpuIdleAllocated", "firing"),
        ("PodQueuedTooLong", "firing"),
        ("PodStalled", "firing"),
    ]
    queued = alerts[("PodQueuedTooLong", "firing")]
    assert (queued.subject.uid, queued.ts - t0, queued.value) == (QUEUED_UID, 30 * S, 30.0)
    stalled = alerts[("PodStalled", "firing")]
    assert (stalled.subject.uid, stalled.since, stalled.ts - t0) == (idle, t0, 45 * S)
    gpu_idle = alerts[("GpuIdleAllocated", "firing")]
    assert (gpu_idle.subject.uuid, gpu_idle.ts - t0) == (gpu_of(case, idle), 60 * S)
