"""`gpuwatch worker` against the real broker: a Kueue workload queued 12 minutes, admitted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from worker_fixtures import (
    WORKER_ENV,
    StartWorker,
    aligned_t0,
    decoded,
    produce,
    scenario,
    wait_for,
)

from gpuwatch.harness.examples import example
from schemas import ALERTS, K8S_WORKLOADS, WORKLOAD_LIFECYCLE
from schemas.settings import Settings

pytestmark = pytest.mark.integration

MIN = 60_000
QUOTA = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu"


def workload(t0: int, ts: int, rv: int, *, admitted: bool) -> dict[str, Any]:
    value = example("gpuwatch.k8s.workload/v1")
    waiting = {"type": "QuotaReserved", "status": "False", "reason": "Pending"}
    conditions = [{**waiting, "message": QUOTA, "at": t0 - 12 * MIN}]
    if admitted:
        done = {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""}
        conditions = [{**done, "at": ts}]
    value.update(
        ts=ts,
        resource_version=str(rv),
        created_at=t0 - 12 * MIN,
        conditions=conditions,
        cluster_queue="gpu-cq" if admitted else None,
        admitted_at=ts if admitted else None,
    )
    return value


def test_a_workload_queued_for_quota_then_admitted_has_its_lifecycle_and_alert(
    scoped: Settings, start_worker: StartWorker
) -> None:
    t0 = aligned_t0()
    case = scenario(scoped, t0)
    topic = K8S_WORKLOADS.full_name(scoped.kafka.topic_prefix)
    values = [workload(t0, t0 - 12 * MIN + 1_000, 1, admitted=False)]
    values.append(workload(t0, t0 + 20_000, 2, admitted=True))
    uid = values[0]["uid"]
    produce(scoped, [(topic, uid.encode(), json.dumps(v).encode(), None) for v in values])
    produce(scoped, case.messages)
    worker = start_worker(scoped)

    def done() -> bool:
        return len(decoded(scoped, WORKLOAD_LIFECYCLE)) >= 2

    wait_for("the workload's admission", done, worker)
    worker.stop()
    assert worker.counters()["deadletter"] == 0
    lifecycle = sorted(
        {
            (r.ts - t0, r.from_state, r.to_state, r.reason, r.queued_ms)
            for r in decoded(scoped, WORKLOAD_LIFECYCLE)
        }
    )
    assert lifecycle == [
        (-12 * MIN, None, "queued", "WaitingForQuota", 0),
        (20_000, "queued", "admitted", None, 12 * MIN + 20_000),
    ]
    alerts = sorted(
        {
            (a.status, a.ts - t0, a.since - t0)
            for a in decoded(scoped, ALERTS)
            if a.name == "WorkloadQueuedTooLong"
        }
    )
    after = int(WORKER_ENV["GPUWATCH_QUEUED_ALERT_AFTER_S"]) * 1000  # the workers' threshold
    assert alerts == [("firing", -12 * MIN + after, -12 * MIN), ("resolved", 20_000, -12 * MIN)]
