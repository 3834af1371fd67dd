"""Base state and reason of single pod events, beyond the recorded fixtures."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from test_pod_fixtures import container, pod

from streams.core.pod.lifecycle_reasons import observe

SCHEDULED = {"type": "PodScheduled", "status": "True", "reason": None, "message": None}


def disruption(reason: str) -> dict[str, Any]:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": None}


@pytest.mark.parametrize(
    ("phase", "type_", "conditions", "expected"),
    [
        ("Running", "DELETED", [SCHEDULED, disruption("EvictionByEvictionAPI")], "Evicted"),
        ("Running", "DELETED", [SCHEDULED, disruption("PreemptionByScheduler")], "Preempted"),
        ("Pending", "DELETED", [SCHEDULED], "Deleted"),
        ("Succeeded", "DELETED", [SCHEDULED], "Completed"),
        ("Failed", "DELETED", [SCHEDULED, disruption("DeletionByTaintManager")], "Evicted"),
        ("Failed", "MODIFIED", [SCHEDULED], "Error"),
        ("Failed", "MODIFIED", [SCHEDULED, disruption("SomethingNew")], "Error"),
    ],
)
def test_finished_reasons(
    phase: str, type_: str, conditions: list[dict[str, Any]], expected: str
) -> None:
    seen = observe(pod(phase, ts=1, rv=1, type_=type_, conditions=conditions))
    assert (seen.base, seen.reason) == ("finished", expected)


def test_a_disruption_target_is_no_reason_while_the_pod_runs() -> None:
    seen = observe(
        pod("Running", ts=1, rv=1, conditions=[SCHEDULED, disruption("TerminationByKubelet")])
    )
    assert (seen.base, seen.reason, seen.crash_loop) == ("running", None, False)


def test_gates_without_a_queue_and_a_queue_before_the_scheduler_speaks() -> None:
    gated = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "SchedulingGated",
        "message": None,
    }
    plain = pod("Pending", ts=1, rv=1, containers=[], conditions=[gated])
    assert observe(msgspec.structs.replace(plain, node=None)).reason == "SchedulingGated"
    fresh = msgspec.structs.replace(
        pod("Pending", ts=1, rv=1, containers=[], conditions=[]), node=None
    )
    assert observe(fresh).reason == "Scheduling"
    assert observe(msgspec.structs.replace(fresh, queue="team-a")).reason == "WaitingForQuota"


def test_kueues_own_gate_is_kueue_admission_with_or_without_a_queue_label() -> None:
    gated = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "SchedulingGated",
        "message": None,
    }
    held = msgspec.structs.replace(
        pod("Pending", ts=1, rv=1, containers=[], conditions=[gated]),
        node=None,
        scheduling_gates=("kueue.x-k8s.io/admission",),
    )
    assert observe(held).reason == "KueueAdmission"
    assert observe(msgspec.structs.replace(held, queue="team-a")).reason == "KueueAdmission"
    assert observe(msgspec.structs.replace(held, conditions=())).reason == "KueueAdmission"
    other = msgspec.structs.replace(held, scheduling_gates=("example.com/provisioning",))
    assert observe(other).reason == "SchedulingGated"
    assert observe(msgspec.structs.replace(other, queue="team-a")).reason == "SchedulingGated"
    # An admitted job's pod keeps its queue label, without a gate: not waiting for quota.
    admitted = msgspec.structs.replace(held, conditions=(), scheduling_gates=(), queue="team-a")
    assert observe(admitted).reason == "Scheduling"
    # Gates not told (an older watcher's messages): the queue label is all there is.
    told_nothing = msgspec.structs.replace(admitted, scheduling_gates=None)
    assert observe(told_nothing).reason == "WaitingForQuota"


def test_queued_reason_comes_from_the_first_waiting_container() -> None:
    init_loop = [
        container("waiting", "CrashLoopBackOff", restarts=3),
        container("waiting", "PodInitializing"),
    ]
    assert observe(pod("Pending", ts=1, rv=1, containers=init_loop)).reason == "CrashLoopBackOff"
    pulls = [container("waiting", "InvalidImageName")]
    assert observe(pod("Pending", ts=1, rv=1, containers=pulls)).reason == "ImagePull"
    assert observe(pod("Pending", ts=1, rv=1, containers=[])).reason == "ContainerCreating"


def test_health_of_a_running_pod() -> None:
    done_init = [container("terminated", "Completed", exit_code=0), container("running")]
    assert observe(pod("Running", ts=1, rv=1, containers=done_init)).healthy
    failed = [container("terminated", "Error", exit_code=1), container("running")]
    assert not observe(pod("Running", ts=1, rv=1, containers=failed)).healthy
    unready = {"type": "Ready", "status": "False", "reason": None, "message": None}
    assert not observe(pod("Running", ts=1, rv=1, conditions=[SCHEDULED, unready])).healthy


@pytest.mark.parametrize(
    ("phase", "conditions", "expected"),
    [
        ("Running", [SCHEDULED], "DeletedFinalStateUnknown"),
        ("Pending", [SCHEDULED], "DeletedFinalStateUnknown"),
        ("Running", [SCHEDULED, disruption("EvictionByEvictionAPI")], "Evicted"),
        ("Succeeded", [SCHEDULED], "Completed"),
        ("Failed", [SCHEDULED], "Error"),
    ],
)
def test_a_deletion_not_seen_says_so_unless_the_last_state_was_final(
    phase: str, conditions: list[dict[str, Any]], expected: str
) -> None:
    last = pod(phase, ts=1, rv=1, type_="DELETED", conditions=conditions)
    seen = observe(msgspec.structs.replace(last, final_state_unknown=True))
    assert (seen.base, seen.reason) == ("finished", expected)
