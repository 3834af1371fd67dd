"""The replay story from hand-made records: who the subject is, which events, in what order."""

from __future__ import annotations

import msgspec
import pytest
from replay_records import (
    GIB,
    MIN,
    NODE,
    OTHER,
    SPAN,
    T0,
    TRAIN,
    S,
    alert,
    attribution,
    gpu_window,
    incident,
    sample,
)

from gpuwatch.harness.examples import GPU_0, GPU_1
from gpuwatch.replay.match import assemble, resolve, state_bands
from gpuwatch.replay.story import Collected, SampleDigest, Scope, StateBand, Subject
from gpuwatch.timerange import TimeRange
from schemas import Alert, AlertSubject, Attribution, GpuWindow, K8sNode, PodLifecycle, PodUid


def test_a_subject_is_exactly_one_of_pod_gpu_node() -> None:
    assert Subject.parse("ml/train-0", None, None) == Subject("pod", "ml/train-0")
    assert Subject.parse(None, GPU_0, None).kind == "gpu"
    assert Subject.parse("ml/train-0", None, None).pod == ("ml", "train-0")
    for bad in [(None, None, None), ("ml/a", GPU_0, None)]:
        with pytest.raises(ValueError, match="give one of"):
            Subject.parse(*bad)
    for name in ["train-0", "ml/", "/train-0", "ml/a/b"]:
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            Subject.parse(name, None, None)


def test_a_pod_resolves_to_its_uid_node_and_gpus_and_no_other() -> None:
    scope = resolve(Subject("pod", "ml/train-0"), incident())
    assert scope.uids == {TRAIN: "ml/train-0"}
    assert scope.nodes == {NODE}
    assert scope.gpus == {GPU_0}
    assert resolve(Subject("pod", "ml/nope-0"), incident()).empty


def test_the_pod_story_keeps_its_records_once_each_in_event_time_order() -> None:
    subject = Subject("pod", "ml/train-0")
    found = incident()
    events = assemble(subject, SPAN, found, resolve(subject, found))

    def line(e: object) -> tuple[str, int, str]:
        r = e.record  # type: ignore[attr-defined]
        if isinstance(r, PodLifecycle):
            what = f"{r.from_state}->{r.to_state}"
        elif isinstance(r, Attribution):
            what = f"window@{(r.window_start - T0) // MIN}m used {r.used_gpu_seconds}"
        elif isinstance(r, Alert):
            what = f"{r.name} {r.status}"
        else:
            what = type(r).__name__
        return e.kind, (e.ts - T0) // S, what  # type: ignore[attr-defined]

    assert [line(e) for e in events] == [
        ("lifecycle", 30, "queued->running"),
        ("attribution", 60, "window@0m used 30.0"),
        ("attribution", 120, "window@1m used 51.6"),  # delivered twice, kept once
        ("alert", 240, "GpuIdleAllocated firing"),  # names the pod in its labels
        ("lifecycle", 300, "running->stalled"),  # once, and before the alert it explains
        ("alert", 300, "PodStalled firing"),
        ("lifecycle", 900, "stalled->finished"),
        ("alert", 900, "PodStalled resolved"),
    ]


def revised_windows() -> Collected:
    """train-0's window at 2 min and GPU_0's at 1 min, each revised once (usage came after
    they closed), their copies read in any order and twice."""
    found = Collected()
    late = T0 + 2 * MIN
    for record in [
        attribution(TRAIN, late, used=10.0, idle=50.0, cost=0.0658, waste=0.0548),
        attribution(TRAIN, late, used=40.0, idle=5.0, cost=0.0658, waste=0.0055, revision=1),
        attribution(TRAIN, late, used=10.0, idle=50.0, cost=0.0658, waste=0.0548),
        gpu_window(GPU_0, T0 + MIN, [TRAIN], 90.0, revision=1),
        gpu_window(GPU_0, T0 + MIN, [TRAIN], 86.0),
        gpu_window(GPU_0, T0 + MIN, [TRAIN], 90.0, revision=1),
    ]:
        found.add(record)
    return found


@pytest.mark.parametrize("subject", [Subject("pod", "ml/train-0"), Subject("node", NODE)])
def test_a_revised_window_is_in_the_story_once_at_its_newest_revision(subject: Subject) -> None:
    found = revised_windows()
    events = assemble(subject, SPAN, found, resolve(subject, found))
    windows = [e.record for e in events if isinstance(e.record, Attribution)]
    assert [(w.revision, w.used_gpu_seconds) for w in windows] == [(1, 40.0)]
    gpus = [e.record for e in events if isinstance(e.record, GpuWindow)]
    assert [(g.revision, g.util_mean_pct) for g in gpus] == (
        [(1, 90.0)] if subject.kind == "node" else []
    )


def test_the_gpu_story_has_its_window_its_holders_transitions_and_its_part_of_them() -> None:
    subject = Subject("gpu", GPU_1)
    found = incident()
    scope = resolve(subject, found)
    assert scope.uids == {OTHER: "ml/other-0"}
    assert scope.nodes == {NODE}
    events = assemble(subject, SPAN, found, scope)
    kinds = [(e.kind, (e.ts - T0) // S) for e in events]
    assert kinds == [
        ("lifecycle", 120),  # at one instant: the transition, then the windows
        ("attribution", 120),
        ("gpu_window", 120),
        ("alert", 360),  # the holder's PodStalled
        ("alert", 420),  # the GPU's own
    ]
    assert {r.uuid for e in events if isinstance(r := e.record, GpuWindow)} == {GPU_1}


def test_the_node_story_has_every_pod_window_and_gpu_of_the_node_and_its_own_events() -> None:
    subject = Subject("node", NODE)
    found = incident()
    scope = resolve(subject, found)
    assert set(scope.uids) == {TRAIN, OTHER}
    assert scope.gpus == {GPU_0, GPU_1}
    events = assemble(subject, SPAN, found, scope)
    counts: dict[str, int] = {}
    for event in events:
        counts[event.kind] = counts.get(event.kind, 0) + 1
    # 4 transitions in range (train x3, other x1), 3 windows in range, 5 alerts, 2 GPU windows.
    assert counts == {"lifecycle": 4, "attribution": 3, "alert": 5, "gpu_window": 2, "node": 1}
    (node_event,) = [e.record for e in events if isinstance(e.record, K8sNode)]
    assert node_event.ready is False


def test_windows_count_when_they_overlap_the_range_and_instants_when_inside() -> None:
    span = TimeRange(T0 + 90 * S, T0 + 100 * S)
    assert span.overlaps(T0 + MIN, T0 + 2 * MIN)
    assert not span.overlaps(T0, T0 + MIN)
    assert not span.overlaps(T0 + 100 * S, T0 + 2 * MIN)  # starts at the end
    assert span.holds(T0 + 100 * S)
    assert not span.holds(T0 + 101 * S)


def test_samples_of_the_pod_count_only_while_its_gpu_is_allocated_to_it() -> None:
    subject = Subject("pod", "ml/train-0")
    scope = Scope(uids={TRAIN: "ml/train-0"}, nodes={NODE})
    digest = SampleDigest(subject, SPAN, scope, keep_series=True)
    samples = [
        sample(1, T0, util0=10.0, mem0_gib=1),
        sample(2, T0 + S, util0=50.0, mem0_gib=3),
        sample(3, T0 + 2 * S, util0=None, mem0_gib=2),  # unknown: counted, not averaged
        sample(5, T0 + 4 * S, util0=90.0, mem0_gib=2),  # seq 4 lost
        sample(6, T0 + 5 * S, util0=99.0, mem0_gib=70, holder=OTHER),  # not the pod's
        sample(2, T0 + 6 * S, util0=20.0, mem0_gib=1),  # the agent restarted
        sample(7, T0 - S, util0=100.0, mem0_gib=80),  # before the range
    ]
    for s in samples:
        digest.add(s)
    (gpu,) = digest.summaries()
    assert (gpu.uuid, gpu.node, gpu.count, gpu.util_known) == (GPU_0, NODE, 5, 4)
    assert gpu.util_mean_pct == pytest.approx((10 + 50 + 90 + 20) / 4)
    assert gpu.util_max_pct == 90.0
    assert gpu.vram_peak_bytes == 3 * GIB
    assert (gpu.first_ts, gpu.last_end_ts) == (T0, T0 + 7 * S)
    assert (gpu.seq_gaps, gpu.seq_resets) == (1, 1)
    assert [p.util_pct for p in digest.series[GPU_0]] == [10.0, 50.0, None, 90.0, 20.0]


def test_a_pod_only_the_allocations_name_is_found_by_its_samples() -> None:
    subject = Subject("pod", "ml/other-0")
    scope = Scope()
    digest = SampleDigest(subject, SPAN, scope)
    digest.add(sample(1, T0, util0=10.0, mem0_gib=1))
    assert scope.uids == {OTHER: "ml/other-0"}
    assert (scope.nodes, scope.gpus) == ({NODE}, {GPU_1})
    assert [s.uuid for s in digest.summaries()] == [GPU_1]


def test_a_node_digest_summarises_each_gpu_of_the_node() -> None:
    digest = SampleDigest(Subject("node", NODE), SPAN, Scope(nodes={NODE}))
    digest.add(sample(1, T0, util0=10.0, mem0_gib=1, util1=None))
    digest.add(sample(2, T0 + S, util0=30.0, mem0_gib=1, util1=None))
    by_uuid = {s.uuid: s for s in digest.summaries()}
    assert by_uuid[GPU_0].util_mean_pct == pytest.approx(20.0)
    assert (by_uuid[GPU_1].util_known, by_uuid[GPU_1].util_mean_pct) == (0, None)


def test_state_bands_run_from_each_transition_to_the_next_within_the_range() -> None:
    subject = Subject("pod", "ml/train-0")
    found = incident()
    events = assemble(subject, SPAN, found, resolve(subject, found))
    assert state_bands(events, SPAN) == [
        StateBand(TRAIN, "queued", T0, T0 + 30 * S),  # the first transition's from_state
        StateBand(TRAIN, "running", T0 + 30 * S, T0 + 5 * MIN),
        StateBand(TRAIN, "stalled", T0 + 5 * MIN, T0 + 15 * MIN),
        StateBand(TRAIN, "finished", T0 + 15 * MIN, T0 + 20 * MIN),
    ]


def test_without_transitions_the_bands_come_from_the_windows_states() -> None:
    subject = Subject("pod", "ml/train-0")
    found = incident()
    found.lifecycle.clear()
    events = assemble(subject, SPAN, found, resolve(subject, found))
    assert state_bands(events, SPAN) == [
        StateBand(TRAIN, "running", T0, T0 + MIN),
        StateBand(TRAIN, "running", T0 + MIN, T0 + 2 * MIN),
    ]


def test_a_subject_of_a_cluster_keeps_only_that_clusters_records() -> None:
    subject = Subject.parse(None, None, "gpu-node-1", "eu")
    assert str(subject) == "node gpu-node-1 of cluster eu"
    node = K8sNode(
        schema="gpuwatch.k8s.node/v1",
        type="ADDED",
        node="gpu-node-1",
        ts=1,
        gpu_capacity={},
        gpu_allocatable={},
        gpu_product=None,
        labels={},
        ready=True,
        unschedulable=False,
    )
    assert not subject.of(node)  # the default cluster's node of the same name
    assert subject.of(msgspec.structs.replace(node, cluster="eu"))
    anywhere = Subject.parse(None, None, "gpu-node-1")
    assert anywhere.cluster is None
    assert anywhere.of(node)
    assert str(anywhere) == "node gpu-node-1"


def test_a_fault_of_a_gpu_shared_by_the_pod_is_in_its_story() -> None:
    subject = Subject("pod", "ml/train-0")
    found = incident()
    labels = {"node": NODE, "gpu": GPU_0, "xid": "79", "pods": "ml/other-0,ml/train-0"}
    found.add(alert("GpuXidError", "firing", T0 + 8 * MIN, gpu=GPU_0,
                    labels=labels | {"pod_uids": f"{OTHER},{TRAIN}"}))  # fmt: skip
    found.add(alert("GpuThrottled", "firing", T0 + 9 * MIN, gpu=GPU_1,
                    labels={"node": NODE, "gpu": GPU_1, "pod_uid": OTHER}))  # fmt: skip
    events = assemble(subject, SPAN, found, resolve(subject, found))
    named = [(e.record.name, (e.ts - T0) // S) for e in events if isinstance(e.record, Alert)]
    assert ("GpuXidError", 480) in named
    assert all(name != "GpuThrottled" for name, _ in named)  # another pod's GPU


def test_a_pods_story_starts_with_its_jobs_kueue_workload() -> None:
    """The workload of the pod's Job (linked by the pod's controller uid): created, waiting
    for quota, admitted; a RESYNC or a status write that moves nothing is left out; another
    job's workload is not the pod's."""
    from gpuwatch.harness.examples import example
    from schemas import K8sWorkload

    job = "7e6d5c4b-3a29-4817-8f6e-5d4c3b2a1908"

    def workload(ts: int, version: str, *conditions: tuple[str, str, str], **more: object):  # type: ignore[no-untyped-def]
        data = example("gpuwatch.k8s.workload/v1")
        data.update(
            ts=ts, resource_version=version, created_at=T0 - 20 * MIN,
            job_uid=more.pop("job_uid", job),
            conditions=[{"type": t, "status": s, "reason": r, "message": "insufficient unused "
                         "quota for nvidia.com/gpu in flavor h100, 4 more needed", "at": ts}
                        for t, s, r in conditions], **more,
        )  # fmt: skip
        return msgspec.convert(data, K8sWorkload)

    waiting = ("QuotaReserved", "False", "Pending")
    found = incident()
    found.pods = [msgspec.structs.replace(p, controller_uid=job) for p in found.pods]
    for record in [
        workload(T0 - 20 * MIN, "1"),  # before the range: left out
        workload(T0 - 20 * MIN + S, "2", waiting),  # before the range: left out
        workload(T0 + 10 * S, "3", waiting, type="RESYNC"),  # nothing new
        workload(T0 + 20 * S, "4", ("QuotaReserved", "True", "QuotaReserved"),
                 ("Admitted", "True", "Admitted"), cluster_queue="research"),
        workload(T0 + 20 * S, "4", ("QuotaReserved", "True", "QuotaReserved"),
                 ("Admitted", "True", "Admitted"), cluster_queue="research"),  # again
        workload(T0 + 15 * MIN, "9", ("Finished", "True", "Succeeded")),
        workload(T0 + 16 * MIN, "10", ("Finished", "True", "Succeeded"), job_uid="another"),
    ]:  # fmt: skip
        found.add(record)
    subject = Subject("pod", "ml/train-0")
    scope = resolve(subject, found)
    assert scope.jobs == {job}
    events = assemble(subject, SPAN, found, scope)
    kueue = [(e.ts - T0, e.record.resource_version) for e in events if e.kind == "workload"]
    assert kueue == [(20 * S, "4"), (15 * MIN, "9")]
    # At one instant the workload comes before the pod's own transition.
    at_end = [e.kind for e in events if e.ts == T0 + 15 * MIN]
    assert at_end[:2] == ["workload", "lifecycle"]


def test_the_kueue_alert_of_the_pods_job_is_in_its_story() -> None:
    job = "7e6d5c4b-3a29-4817-8f6e-5d4c3b2a1908"
    found = incident()
    found.pods = [msgspec.structs.replace(p, controller_uid=job) for p in found.pods]
    for uid, job_uid in (("w-1", job), ("w-2", "another")):
        waited = alert("WorkloadQueuedTooLong", "firing", T0 + 2 * MIN,
                       labels={"namespace": "ml", "workload": uid, "job_uid": job_uid})  # fmt: skip
        subject = AlertSubject(kind="workload", uid=PodUid(uid), uuid=None, node=None)
        found.add(msgspec.structs.replace(waited, subject=subject, fingerprint=f"q-{uid}"))
    subject = Subject("pod", "ml/train-0")
    events = assemble(subject, SPAN, found, resolve(subject, found))
    kueue = [e.record for e in events if isinstance(e.record, Alert)]
    named = [a.labels["workload"] for a in kueue if a.name == "WorkloadQueuedTooLong"]
    assert named == ["w-1"]
