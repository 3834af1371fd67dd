"""The cluster core: scheduling, pod lifecycles and GPU processes at the simulated times
the scenario implies, deterministic for a seed."""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.harness.simulate.changes import (
    Change,
    ContainerCrashed,
    ContainerStarted,
    PodBound,
    PodCreated,
    PodDeleted,
    PodFinished,
    PodUnschedulable,
    ProcessStarted,
    ProcessStopped,
    WorkloadAdmitted,
    WorkloadFinished,
    WorkloadPending,
)
from gpuwatch.harness.simulate.cluster import Cluster
from gpuwatch.harness.simulate.gpus import CONTEXT_OVERHEAD_BYTES, GPU_MODELS
from gpuwatch.harness.simulate.scenario import load_scenario, parse_scenario, with_overrides
from gpuwatch.harness.simulate.topology import layout

H100_BYTES = GPU_MODELS["h100"].mem_total_bytes


def cluster(text: str) -> Cluster:
    return Cluster(parse_scenario(text))


def by_pod(c: Cluster, changes: Sequence[Change]) -> dict[str, list[Change]]:
    """Pod changes grouped by pod name, in order."""
    names = {ch.spec.uid: ch.spec.name for ch in changes if isinstance(ch, PodCreated)}
    out: dict[str, list[Change]] = {}
    for change in changes:
        uid = change.spec.uid if isinstance(change, PodCreated) else change.uid
        out.setdefault(names[uid], []).append(change)
    return out


def kinds(changes: Sequence[Change]) -> list[tuple[str, float]]:
    return [(type(ch).__name__, ch.at) for ch in changes]


def test_the_same_seed_gives_the_same_changes_and_another_seed_other_uids() -> None:
    def run(seed: int) -> list[Change]:
        c = Cluster(with_overrides(load_scenario("small"), seed=seed))
        return c.advance(0.0) + c.advance(1000.0)

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert len(first) > 40
    uids = {ch.spec.uid for ch in first if isinstance(ch, PodCreated)}
    assert len(uids) == 10
    assert not uids & {ch.spec.uid for ch in other if isinstance(ch, PodCreated)}


def test_small_runs_its_documented_timeline() -> None:
    c = Cluster(load_scenario("small"))
    history = c.advance(0.0)
    timeline = c.advance(1000.0)
    pods = by_pod(c, history + timeline)

    # Already running at the epoch: bound and started before it.
    assert c.pod_named("chat-serving-0").node == "h100-0"
    assert c.pod_named("notebook-ana-0").node == "h100-1"
    assert c.pod_named("llm-finetune-0").node == "h100-0"
    assert all(ch.at < 0 for name in ("chat-serving-0", "llm-finetune-0") for ch in pods[name])
    # Two vision-train pods on h100-1, Completed at 605 s.
    for name in ("vision-train-0", "vision-train-1"):
        assert kinds(
            [ch for ch in pods[name] if not isinstance(ch, ProcessStarted | ProcessStopped)]
        ) == [
            ("PodCreated", 0.0),
            ("PodBound", 0.0),
            ("ContainerStarted", 5.0),
            ("PodFinished", 605.0),
        ]
    # bert-oom: on h100-0's last GPU at 30 s, OOMKilled (137) at 275 s.
    bert = pods["bert-oom-0"]
    assert [(type(ch).__name__, ch.at) for ch in bert if isinstance(ch, PodBound)] == [
        ("PodBound", 30.0)
    ]
    finished = [ch for ch in bert if isinstance(ch, PodFinished)]
    assert finished == [PodFinished(275.0, finished[0].uid, "Failed", "OOMKilled", 137)]
    assert c.pod_named("bert-oom-0").status == "OOMKilled"
    # eval-sweep: Unschedulable at 60 s, bound at 605 s when vision-train frees h100-1.
    sweep = pods["eval-sweep-0"]
    unschedulable = [ch for ch in sweep if isinstance(ch, PodUnschedulable)]
    assert [ch.at for ch in unschedulable] == [60.0]
    assert unschedulable[0].message == (
        "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, "
        "1 node(s) didn't match Pod's node affinity/selector."
    )
    bound = [ch for ch in sweep if isinstance(ch, PodBound)]
    assert [(ch.at, ch.node, len(ch.devices)) for ch in bound] == [(605.0, "h100-1", 2)]
    assert [ch.at for ch in sweep if isinstance(ch, PodFinished)] == [910.0]


def test_fragmentation_leaves_a_pod_pending_while_gpus_are_free() -> None:
    c = Cluster(load_scenario("small"))

    c.advance(300.0)  # bert-oom freed its GPU at 275 s: one free GPU on each H100 node

    sweep = c.pod_named("eval-sweep-0")
    assert sweep.status == "Pending"
    assert sweep.node is None
    assert sweep.unschedulable is not None
    assert {n: f for n, f in c.free_devices().items() if n.startswith("h100")} == {
        "h100-0": 1,
        "h100-1": 1,
    }


def test_a_crash_loop_backs_off_10_s_doubling_to_5_minutes() -> None:
    c = cluster(
        """
name: loop
nodes: [{pool: a, gpus_per_node: 1}]
workloads:
  - {name: crasher, kind: crashloop, pull_s: 5, crash_after_s: 30, crash_reason: oomkilled}
"""
    )

    changes = c.advance(1200.0)

    crashes = [ch for ch in changes if isinstance(ch, ContainerCrashed)]
    starts = [ch for ch in changes if isinstance(ch, ContainerStarted)]
    assert [ch.at for ch in starts] == [5, 45, 95, 165, 275, 465, 795, 1125]
    assert [ch.restarts for ch in starts] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [ch.at for ch in crashes] == [35, 75, 125, 195, 305, 495, 825, 1155]
    assert [ch.backoff_s for ch in crashes] == [10, 20, 40, 80, 160, 300, 300, 300]
    assert {(ch.reason, ch.exit_code) for ch in crashes} == {("OOMKilled", 137)}
    # One process per run, each with a new pid, gone at the crash.
    started = [ch for ch in changes if isinstance(ch, ProcessStarted)]
    stopped = [ch for ch in changes if isinstance(ch, ProcessStopped)]
    assert [ch.at for ch in started] == [ch.at for ch in starts]
    assert [ch.at for ch in stopped] == [ch.at for ch in crashes]
    assert len({ch.pid for ch in started}) == 8
    assert {ch.up_s for ch in started} == {30.0}
    pod = c.pod_named("crasher-0")
    assert (pod.status, pod.restarts, pod.phase) == ("CrashLoopBackOff", 8, "Running")


def test_a_leaking_pod_runs_on_an_unallocated_gpu_of_its_node() -> None:
    c = cluster(
        """
name: leak
nodes: [{pool: a, gpus_per_node: 4}]
workloads:
  - {name: holder, kind: training, gpus: 3}
  - {name: leaky, kind: inference, gpus: 0, unallocated_gpus: 1, start_s: 10, pull_s: 2}
"""
    )

    changes = c.advance(60.0)

    leaky = c.pod_named("leaky-0")
    assert leaky.devices == ()
    (bound,) = [ch for ch in changes if isinstance(ch, PodBound) and ch.uid == leaky.spec.uid]
    assert (bound.at, bound.node, bound.devices) == (10.0, "a-0", ())
    (process,) = [
        ch for ch in changes if isinstance(ch, ProcessStarted) and ch.uid == leaky.spec.uid
    ]
    gpus = layout(c.scenario)[0].compute_uuids
    holder = c.pod_named("holder-0")
    assert [d.uuid for d in holder.devices] == list(gpus[:3])
    assert process.gpu_uuid == gpus[3]  # the one GPU nobody holds
    assert process.at == 12.0
    assert process.gpu_uuid not in {d.uuid for pod in c.pods.values() for d in pod.devices}


def test_time_slicing_replicas_spread_over_the_gpus_and_memory_fits() -> None:
    c = cluster(
        """
name: ts
nodes: [{pool: t, model: l40s, gpus_per_node: 2, sharing: time-slicing, replicas: 4}]
workloads:
  - {name: dev, kind: dev, pods: 5, mem_fraction: 1.0}
"""
    )

    changes = c.advance(30.0)

    gpus = layout(c.scenario)[0].compute_uuids
    ids = [c.pod_named(f"dev-{i}").devices[0].id for i in range(5)]
    assert ids == [
        f"{gpus[0]}::0",
        f"{gpus[1]}::0",
        f"{gpus[0]}::1",
        f"{gpus[1]}::1",
        f"{gpus[0]}::2",
    ]
    total = GPU_MODELS["l40s"].mem_total_bytes
    for gpu in gpus:
        held = [
            ch.mem_bytes for ch in changes if isinstance(ch, ProcessStarted) and ch.gpu_uuid == gpu
        ]
        assert len(held) == (3 if gpu == gpus[0] else 2)
        assert all(mem <= total // 4 for mem in held)
        assert sum(held) + len(held) * CONTEXT_OVERHEAD_BYTES <= total


def test_mig_pods_get_instances_of_their_profile_and_wait_when_none_is_left() -> None:
    c = cluster(
        """
name: mig
nodes: [{pool: m, gpus_per_node: 1, sharing: mig, mig_profiles: [3g.40gb, 1g.10gb, 1g.10gb]}]
workloads:
  - {name: small, kind: inference, pods: 3, mig_profile: 1g.10gb}
  - {name: big, kind: training, mig_profile: 3g.40gb}
"""
    )

    c.advance(30.0)

    node = layout(c.scenario)[0]
    instances = {g.uuid: g.mig_profile for g in node.gpus if g.parent_uuid is not None}
    for name in ("small-0", "small-1"):
        (device,) = c.pod_named(name).devices
        assert device.resource == "nvidia.com/mig-1g.10gb"
        assert instances[device.uuid] == "1g.10gb"
    assert c.pod_named("small-2").status == "Pending"
    assert c.pod_named("small-2").unschedulable == (
        "0/1 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb."
    )
    (big,) = c.pod_named("big-0").devices
    assert instances[big.uuid] == "3g.40gb"


def test_spread_and_binpack_pick_different_nodes() -> None:
    text = """
name: sched
scheduler: {scheduler}
nodes: [{{pool: a, count: 2, gpus_per_node: 4}}]
workloads:
  - {{name: first, kind: training, gpus: 1}}
  - {{name: second, kind: training, gpus: 1, start_s: 1}}
"""
    spread, binpack = (
        cluster(text.format(scheduler="spread")),
        cluster(text.format(scheduler="binpack")),
    )
    spread.advance(10.0)
    binpack.advance(10.0)

    assert [spread.pod_named(n).node for n in ("first-0", "second-0")] == ["a-0", "a-1"]
    assert [binpack.pod_named(n).node for n in ("first-0", "second-0")] == ["a-0", "a-0"]


def test_finished_pods_are_deleted_after_the_ttl_and_recreated() -> None:
    c = cluster(
        """
name: churn
finished_ttl_s: 100
nodes: [{pool: a, gpus_per_node: 1}]
workloads:
  - {name: job, kind: training, pull_s: 0, duration_s: 50, recreate_after_s: 20}
"""
    )

    changes = c.advance(200.0)

    first, second = c.scenario.workloads[0].name + "-0", "job-0-1"
    created = {ch.spec.name: ch for ch in changes if isinstance(ch, PodCreated)}
    assert sorted(created) == [first, "job-0-1", "job-0-2"]
    assert created[second].at == 70.0  # finished at 50 + 20
    assert created["job-0-2"].at == 140.0  # started at 70, finished at 120, + 20
    deleted = [ch for ch in changes if isinstance(ch, PodDeleted)]
    assert [(ch.at, ch.uid) for ch in deleted] == [(150.0, created[first].spec.uid)]
    assert sorted(p.spec.name for p in c.pods.values()) == ["job-0-1", "job-0-2"]


def test_advance_applies_only_what_is_due_before_until() -> None:
    c = cluster(
        """
name: edge
nodes: [{pool: a, gpus_per_node: 1}]
workloads:
  - {name: job, kind: idle, start_s: 10, pull_s: 5}
"""
    )

    assert c.advance(10.0) == []
    assert kinds(c.advance(15.0)) == [("PodCreated", 10.0), ("PodBound", 10.0)]
    assert kinds(c.advance(15.0)) == []
    started = c.advance(16.0)
    assert kinds(started) == [("ContainerStarted", 15.0), ("ProcessStarted", 15.0)]
    process = started[1]
    assert isinstance(process, ProcessStarted)
    assert process.kind == "idle"
    assert process.mem_bytes == int(H100_BYTES * c.pod_named("job-0").spec.mem_fraction)


def test_a_pod_without_a_gpu_request_or_leak_has_no_process() -> None:
    c = cluster(
        """
name: cpu
nodes: [{pool: a, gpus_per_node: 1}]
workloads:
  - {name: web, kind: inference, gpus: 0, pull_s: 1}
"""
    )

    changes = c.advance(10.0)

    assert kinds(changes) == [("PodCreated", 0.0), ("PodBound", 0.0), ("ContainerStarted", 1.0)]
    assert c.pod_named("web-0").status == "Running"


DRA = """
name: dra
nodes:
  - {pool: d, count: 2, gpus_per_node: 2, dra: true}
workloads:
  - {name: job, kind: training, pods: 2, claim: per-pod, pool: d, duration_s: 100, pull_s: 0}
  - {name: chat, kind: inference, pods: 3, claim: shared, pool: d, pull_s: 0}
  - {name: late, kind: training, pods: 2, claim: per-pod, pool: d, start_s: 10, pull_s: 0}
"""


def test_a_shared_claim_gives_its_pods_the_same_gpu_and_frees_it_with_the_last() -> None:
    c = cluster(DRA)
    c.advance(5.0)
    # All of chat's pods on the one GPU of their claim.
    chat = [c.pod_named(f"chat-{i}") for i in range(3)]
    assert len({(p.node, p.devices) for p in chat}) == 1
    (device,) = chat[0].devices
    assert device.resource == "gpu.nvidia.com/gpu"
    assert str(device.dra_name).startswith("gpu-")
    assert {p.spec.claim for p in chat} == {"chat-gpus"}
    assert c.pod_named("job-0").spec.claim == "job-0-gpus"
    # 4 GPUs: job's 2 and chat's 1 taken; one of late's pods waits for job to end.
    c.advance(50.0)
    waiting = [n for n in ("late-0", "late-1") if c.pod_named(n).status == "Pending"]
    assert len(waiting) == 1
    assert c.pod_named(waiting[0]).unschedulable == (
        "0/2 nodes are available: 2 Insufficient gpu.nvidia.com/gpu."
    )
    c.advance(150.0)
    assert c.pod_named(waiting[0]).status == "Running"
    assert c.free_devices("gpu.nvidia.com/gpu") == {"d-0": 0, "d-1": 1}


def test_dra_nodes_advertise_no_extended_resource_and_publish_a_slice() -> None:
    from gpuwatch.harness.simulate.topology import resource_slice
    from producers.base.dra import table_from_slices

    nodes = layout(parse_scenario(DRA))
    assert nodes[0].capacity == {}
    assert nodes[0].dra
    table = table_from_slices([resource_slice(nodes[0])], {"gpu.nvidia.com"})
    assert {(name, d.uuid) for (_, _, name), d in table.items()} == {
        (f"gpu-{g.index}", g.uuid) for g in nodes[0].gpus
    }


KUEUE = """
name: kueue
nodes:
  - {pool: a, count: 1, gpus_per_node: 4}
queues:
  - {name: research, gpus: 4}
workloads:
  - {name: first, kind: training, pods: 2, gpus: 2, queue: research, duration_s: 100, pull_s: 0}
  - {name: second, kind: training, pods: 4, gpus: 1, queue: research, duration_s: 50, pull_s: 0}
  - {name: third, kind: training, pods: 1, gpus: 1, queue: research, start_s: 1, pull_s: 0}
  - {name: huge, kind: training, pods: 2, gpus: 4, queue: big, pull_s: 0}
  - {name: plain, kind: training, gpus: 0, pull_s: 0}
queues_extra: []
"""


def test_kueue_holds_queued_jobs_without_pods_until_their_quota_is_free() -> None:
    text = KUEUE.replace("queues_extra: []\n", "").replace(
        "  - {name: research, gpus: 4}", "  - {name: research, gpus: 4}\n  - {name: big, gpus: 4}"
    )
    c = cluster(text)
    changes = c.advance(10.0)
    jobs = {j.workload: j for j in c.jobs.values()}
    kueue = [
        (type(ch).__name__, ch.at, jobs_by_uid.workload)
        for ch in changes
        if isinstance(ch, WorkloadPending | WorkloadAdmitted | WorkloadFinished)
        for jobs_by_uid in [c.jobs[ch.uid]]
    ]
    # first fits (4 of 4), second waits; third waits behind it untried (StrictFIFO: the
    # head blocks the queue, no message); huge never fits its queue.
    assert kueue == [
        ("WorkloadAdmitted", 0.0, "first"),
        ("WorkloadPending", 0.0, "second"),
        ("WorkloadPending", 0.0, "huge"),
    ]
    pending = {
        c.jobs[ch.uid].workload: ch.message for ch in changes if isinstance(ch, WorkloadPending)
    }
    assert pending["second"].endswith(
        "insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 4 more needed"
    )
    assert "current podset request (8) > maximum capacity (4)" in pending["huge"]
    names = {p.spec.name for p in c.pods.values()}
    assert names == {"first-0", "first-1", "plain-0"}  # no pod of a waiting job
    assert jobs["first"].job_uid == "owner-job-first"
    assert c.pod_named("first-0").spec.labels["kueue.x-k8s.io/queue-name"] == "research"

    later = c.advance(200.0)
    order = [
        (type(ch).__name__, ch.at, c.jobs[ch.uid].workload)
        for ch in later
        if isinstance(ch, WorkloadAdmitted | WorkloadFinished)
    ]
    assert order == [
        ("WorkloadFinished", 100.0, "first"),
        ("WorkloadAdmitted", 100.0, "second"),
        ("WorkloadFinished", 150.0, "second"),
        ("WorkloadAdmitted", 150.0, "third"),
    ]
    assert c.pod_named("second-3").spec.created_s == 100.0


def test_a_dra_mig_pool_publishes_its_instances_and_claims_map_to_them() -> None:
    from gpuwatch.harness.simulate.topology import resource_slice
    from producers.base.dra import table_from_slices

    (node,) = layout(
        parse_scenario(
            "name: m\nnodes:\n  - {pool: m, gpus_per_node: 1, sharing: mig, dra: true, "
            "mig_profiles: [3g.40gb, 1g.10gb]}\n"
        )
    )
    table = table_from_slices([resource_slice(node)], {"gpu.nvidia.com"})
    found = {name: (d.type, d.profile, d.resource) for (_, _, name), d in table.items()}
    assert found == {
        "gpu-0-mig-3g40gb-0": ("mig", "3g.40gb", "gpu.nvidia.com/mig-3g.40gb"),
        "gpu-0-mig-1g10gb-1": ("mig", "1g.10gb", "gpu.nvidia.com/mig-1g.10gb"),
    }
    parents = {d.parent_uuid for d in table.values()}
    assert parents == {node.gpus[0].uuid}
    assert node.capacity == {"nvidia.com/gpu": 0}  # the device plugin's resource: none
