"""Kueue workloads give the same records in every order of arrival and after a crash.

Generated workload histories (created, waiting for quota or for another reason, admitted,
evicted and queued again, finished or deleted; values read again; relists) are mixed into
generated cluster histories (`test_backlog_properties.histories`) and run through the
worker's stream logic (`pipeline_model`) live, every pod event and workload first, every
sample first, and live with a crash while the state is written. The workload lifecycle
and the alerts are the same in all, and equal to the workload values applied in event-time
order with the watermark at the end (`workload_step`, nothing of the worker around it).
"""

from __future__ import annotations

import json
import random
from typing import Any

from histories import History, Input
from hypothesis import event, given
from hypothesis import strategies as st
from pipeline_model import Pipeline, run_backlog, run_live
from test_backlog_properties import BOUNDED, IDLE_AFTER_MS, RULES, WINDOWS, histories

from schemas import ALERTS, K8S_WORKLOADS, WORKLOAD_LIFECYCLE, K8sWorkload
from streams.core.workload import workload_step

S = 1000
QUOTA = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu"
AFFINITY = "couldn't assign flavors to pod set main: flavor h100 doesn't match node affinity"
STEPS = ("quota", "affinity", "admitted", "evicted", "finished", "deleted", "resync")


def _conditions(step: str, at: int) -> list[dict[str, Any]]:
    def cond(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
        return {"type": kind, "status": status, "reason": reason, "message": message, "at": at}

    return {
        "quota": [cond("QuotaReserved", "False", "Pending", QUOTA)],
        "affinity": [cond("QuotaReserved", "False", "Pending", AFFINITY)],
        "admitted": [
            cond("QuotaReserved", "True", "QuotaReserved"),
            cond("Admitted", "True", "Admitted"),
        ],
        "evicted": [cond("Evicted", "True", "Preempted")],
        "finished": [cond("Finished", "True", "Succeeded")],
    }.get(step, [])


@st.composite
def workload_values(draw: Any, t0: int, duration: int) -> list[dict[str, Any]]:
    """A few workloads' values, each workload's in `ts` order, some read twice."""
    out: list[dict[str, Any]] = []
    for n in range(draw(st.integers(0, 3))):
        created = t0 + draw(st.integers(0, duration // S)) * S
        ts, last = created, "quota"
        steps = draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=5))
        for version, step in enumerate(steps, start=1):
            ts += draw(st.integers(0, 40)) * S
            shown = last if step == "resync" else step
            value = {
                "schema": "gpuwatch.k8s.workload/v1",
                "type": {"deleted": "DELETED", "resync": "RESYNC"}.get(step, "MODIFIED"),
                "ts": ts,
                "resource_version": str(version),
                "uid": f"0000000{n}-0000-4000-8000-00000000000{n}",
                "namespace": "research",
                "name": f"job-{n}",
                "created_at": created,
                "queue": "research",
                "cluster_queue": "gpu-cq" if shown == "admitted" else None,
                "priority": None,
                "priority_class": None,
                "active": True,
                "pods": 2,
                "gpu_request": {"nvidia.com/gpu": 2},
                "conditions": _conditions(shown, ts),
                "owner": None,
                "job_uid": f"j000000{n}-0000-4000-8000-00000000000{n}",
                "labels": {"team": "vision"},
                "admitted_at": ts if shown == "admitted" else None,
                "finished_at": ts if shown == "finished" else None,
            }
            out.append(value)
            if draw(st.booleans()) and draw(st.booleans()):
                out.append(value)  # the watcher's producer sent it twice
            if step not in {"deleted", "resync"}:
                last = step
            if step == "deleted":
                break
    return out


@st.composite
def mixed(draw: Any) -> tuple[History, list[Input]]:
    history = draw(histories())
    values = draw(workload_values(history.t0, history.duration_ms))
    extra = [
        Input(K8S_WORKLOADS, v["uid"].encode(), json.dumps(v).encode(), v["ts"]) for v in values
    ]
    return history, sorted([*history.inputs(), *extra], key=lambda m: m.ts)


def _records(pipe: Pipeline) -> dict[str, list[str]]:
    records = pipe.records()
    out = {"workload.lifecycle": records.get("workload.lifecycle", [])}
    out["alerts"] = [a for a in records.get("alerts", []) if a["name"] == workload_step.ALERT]
    return {t: sorted({json.dumps(v, sort_keys=True) for v in vs}) for t, vs in out.items()}


def _by_hand(inputs: list[Input], until: int | None) -> dict[str, list[str]]:
    """The workload values up to the watermark `until` applied in event-time order, each
    workload on its own, then every workload stepped to `until`."""
    states: dict[str, workload_step.Workload] = {}
    lifecycle: list[Any] = []
    alerts: list[Any] = []
    for m in inputs:
        if m.spec is not K8S_WORKLOADS or until is None or m.ts > until:
            continue
        value = K8S_WORKLOADS.decode(m.value)
        assert isinstance(value, K8sWorkload)
        state = states.get(value.uid)
        if workload_step.is_replay(state, value):
            continue
        if state is not None:
            state, fired = workload_step.step_to(state, value.ts, RULES)
            alerts += fired
        state, out = workload_step.apply(state, value, RULES)
        lifecycle += out.lifecycle
        alerts += out.alerts
        states[value.uid] = state
    for state in states.values():
        assert until is not None
        alerts += workload_step.step_to(state, until, RULES)[1]
    return {
        "workload.lifecycle": sorted({_canonical(WORKLOAD_LIFECYCLE.encode(r)) for r in lifecycle}),
        "alerts": sorted({_canonical(ALERTS.encode(a)) for a in alerts}),
    }


def _canonical(raw: bytes) -> str:
    return json.dumps(json.loads(raw), sort_keys=True)


KW: dict[str, Any] = {"rules": RULES, "windows": WINDOWS, "idle_after_ms": IDLE_AFTER_MS}


@BOUNDED
@given(mixed(), st.integers(1, 3), st.integers(0, 2**32))
def test_every_order_and_a_crash_give_the_workload_records_worked_out_alone(
    case: tuple[History, list[Input]], partitions: int, seed: int
) -> None:
    inputs = case[1]
    live = run_live(inputs, partitions=partitions, **KW)
    want = _records(live)
    event(f"{len(want['workload.lifecycle'])} transitions, {len(want['alerts'])} alerts")
    for order in ("pod events first", "samples first"):
        assert _records(run_backlog(inputs, order, partitions=partitions, **KW)) == want, order
    tear, cut = random.Random(seed), random.Random(seed).randrange(len(inputs))
    crashed = run_live(inputs, crash_at=cut, tear=tear, partitions=partitions, state_every=4, **KW)
    assert _records(crashed) == want
    # Every pod partition ends at the same watermark: the ticks' lowest usage frontier.
    ends = {p.applied for p in live.pod.partitions.values()}
    assert len(ends) <= 1
    assert want == _by_hand(inputs, ends.pop() if ends else None)
