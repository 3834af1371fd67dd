"""The simulated cluster as a pure state machine: pods created, scheduled, run, crash-looped,
finished and deleted at the simulated times the scenario says, on a clock the caller moves.

`Cluster.advance(until)` applies every transition due before `until` (simulated seconds
after the epoch) in time order and returns the changes as plain values: what the API
server shows of each pod and which processes start and stop on which GPU. No clock, no
threads, no I/O: the runner turns changes into API objects and SimReader workloads.

Scheduling follows the default scheduler's shape without its detail: pods are tried in
creation order whenever a pod is created or GPUs are freed; a pod that fits no node stays
Pending with the scheduler's Unschedulable message, and pods behind it may still fit (a
big job starves while small ones pass: fragmentation). `spread` picks the node with the
most free devices of the resource (LeastAllocated), `binpack` the fewest that fit. Time-
slicing replicas go to the GPU with the fewest replicas taken (the device plugin's
distributed policy).
"""

from __future__ import annotations

import hashlib
import heapq
import random
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuwatch.harness.simulate.gpus import (
    BACKOFF_MAX_S,
    BACKOFF_START_S,
    CONTEXT_OVERHEAD_BYTES,
    WorkloadKind,
)
from gpuwatch.harness.simulate.scenario import Scenario, Span, Workload
from gpuwatch.harness.simulate.topology import (
    GPU_RESOURCE,
    Device,
    NodeLayout,
    dra_resource,
    layout,
    mig_resource,
)
from schemas.fields import DEFAULT_CLUSTER

__all__ = [
    "Change",
    "Cluster",
    "ContainerCrashed",
    "ContainerStarted",
    "PodBound",
    "PodCreated",
    "PodDeleted",
    "PodFinished",
    "PodRun",
    "PodSpec",
    "PodUnschedulable",
    "ProcessStarted",
    "ProcessStopped",
    "QueuedJob",
    "WorkloadAdmitted",
    "WorkloadCreated",
    "WorkloadFinished",
    "WorkloadPending",
]

PodStatus = Literal[
    "Pending", "ContainerCreating", "Running", "CrashLoopBackOff", "Completed", "OOMKilled", "Error"
]
"""What `kubectl get pods` shows in its STATUS column."""
Action = Literal["create", "start", "crash", "finish", "delete", "submit"]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # a Kueue job's, and so its pods'
FIRST_PID = 4000  # host PIDs of simulated GPU processes, per node
CONTAINERS = {
    "training": "trainer",
    "inference": "server",
    "notebook": "notebook",
    "idle": "main",
    "crashloop": "main",
    "dev": "dev",
}
DEFAULT_OWNERS = {
    "training": "job",
    "idle": "job",
    "inference": "deployment",
    "crashloop": "deployment",
    "dev": "deployment",
    "notebook": "statefulset",
}
END_REASONS = {
    "completed": ("Completed", 0),
    "oomkilled": ("OOMKilled", 137),
    "error": ("Error", 1),
}


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod as created, with every parameter drawn for it from the seed."""

    uid: str
    name: str
    namespace: str
    workload: str
    kind: WorkloadKind
    container: str
    labels: Mapping[str, str]
    owner: tuple[str, str] | None
    """(kind, name) of the controller: Job, ReplicaSet (of a Deployment) or StatefulSet."""
    priority_class: str | None
    pool: str | None
    resource: str
    count: int
    created_s: float
    pull_s: float
    duration_s: float | None
    end: str
    crash_after_s: float
    crash_reason: str
    mem_fraction: float
    peak_util_pct: float | None
    unallocated_gpus: int
    recreate_after_s: float | None
    index: int
    generation: int
    claim: str | None = None
    """The ResourceClaim its GPUs come through (`<pod>-gpus`, or the workload's shared
    `<workload>-gpus`); None: the device plugin's devices."""
    shared_claim: bool = False
    work: Mapping[str, float] = field(default_factory=dict)
    """Units of work it reports done a second while its container runs, by unit name."""

    @property
    def restart_policy(self) -> str:
        """Never for Job pods (a failure fails the pod), Always for the others."""
        return "Never" if self.owner is not None and self.owner[0] == "Job" else "Always"


@dataclass(slots=True)
class PodRun:
    """A pod's state now."""

    spec: PodSpec
    status: PodStatus = "Pending"
    node: str | None = None
    devices: tuple[Device, ...] = ()
    unschedulable: str | None = None
    """The scheduler's message while the pod fits no node."""
    restarts: int = 0
    started_s: float | None = None
    """When its container first started."""
    finished_s: float | None = None
    processes: tuple[tuple[int, str, int], ...] = ()
    """(pid, GPU or MIG uuid, memory) of its GPU processes running now."""

    @property
    def phase(self) -> str:
        """The pod phase the API shows."""
        if self.status in ("Pending", "ContainerCreating"):
            return "Pending"
        if self.status in ("Running", "CrashLoopBackOff"):
            return "Running"
        return "Succeeded" if self.status == "Completed" else "Failed"


@dataclass(frozen=True, slots=True)
class PodCreated:
    """A pod is created (Pending, not scheduled yet)."""

    at: float
    spec: PodSpec


@dataclass(frozen=True, slots=True)
class PodUnschedulable:
    """The scheduler found no node (or a new reason why not)."""

    at: float
    uid: str
    message: str


@dataclass(frozen=True, slots=True)
class PodBound:
    """Bound to a node, devices allocated; the kubelet creates its container."""

    at: float
    uid: str
    node: str
    devices: tuple[Device, ...]


@dataclass(frozen=True, slots=True)
class ContainerStarted:
    """Its container runs (again, after a crash, when `restarts` > 0)."""

    at: float
    uid: str
    restarts: int


@dataclass(frozen=True, slots=True)
class ContainerCrashed:
    """Its container died and the kubelet backs off for `backoff_s` (CrashLoopBackOff)."""

    at: float
    uid: str
    reason: str
    exit_code: int
    restarts: int
    backoff_s: float


@dataclass(frozen=True, slots=True)
class PodFinished:
    """The pod ended for good: Succeeded (Completed) or Failed (OOMKilled, Error)."""

    at: float
    uid: str
    phase: Literal["Succeeded", "Failed"]
    reason: str
    exit_code: int


@dataclass(frozen=True, slots=True)
class PodDeleted:
    """A finished pod is deleted (the scenario's finished_ttl_s)."""

    at: float
    uid: str


@dataclass(frozen=True, slots=True)
class ProcessStarted:
    """A GPU process of a pod starts on a GPU or MIG instance of its node."""

    at: float
    node: str
    pid: int
    uid: str
    gpu_uuid: str
    kind: WorkloadKind
    mem_bytes: int
    peak_util_pct: float | None
    up_s: float | None
    """crashloop: seconds until it crashes."""


@dataclass(frozen=True, slots=True)
class ProcessStopped:
    """A GPU process exits."""

    at: float
    node: str
    pid: int
    uid: str


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A Job of a Kueue queue and the Workload Kueue made for it."""

    uid: str
    """The Workload's uid."""
    name: str
    """The Workload's name (`job-<job>-<hash>`, as Kueue names them)."""
    namespace: str
    workload: str
    """The scenario's workload (the Job's name)."""
    queue: str
    pods: int
    gpus_per_pod: Mapping[str, int]
    labels: Mapping[str, str]
    priority_class: str | None
    created_s: float
    claims: bool = False
    """Its pods' GPUs come through ResourceClaims (DRA), not an extended resource."""

    @property
    def job_uid(self) -> str:
        """The Job's uid, as its pods' owner reference names it."""
        return f"owner-job-{self.workload}"

    @property
    def gpus(self) -> int:
        """GPU devices of the quota it takes: every pod's."""
        return self.pods * sum(self.gpus_per_pod.values())


@dataclass(frozen=True, slots=True)
class WorkloadCreated:
    """Kueue made a Workload for a suspended Job."""

    at: float
    job: QueuedJob


@dataclass(frozen=True, slots=True)
class WorkloadPending:
    """Kueue's scheduler found no room in the queue's quota: QuotaReserved False."""

    at: float
    uid: str
    message: str


@dataclass(frozen=True, slots=True)
class WorkloadAdmitted:
    """Quota reserved and admitted: the Job is unsuspended and its pods are created."""

    at: float
    uid: str
    cluster_queue: str


@dataclass(frozen=True, slots=True)
class WorkloadFinished:
    """Every pod of the Job ended; the quota is free again."""

    at: float
    uid: str
    succeeded: bool


Change = (
    PodCreated
    | PodUnschedulable
    | PodBound
    | ContainerStarted
    | ContainerCrashed
    | PodFinished
    | PodDeleted
    | ProcessStarted
    | ProcessStopped
    | WorkloadCreated
    | WorkloadPending
    | WorkloadAdmitted
    | WorkloadFinished
)


def _draw(span: Span | None, rng: random.Random, whole: bool = False) -> float | None:
    """A value of `span`; one draw from `rng` whatever the span, so fields stay independent."""
    u = rng.random()
    if span is None:
        return None
    value = span[0] + (span[1] - span[0]) * u if isinstance(span, tuple) else float(span)
    return float(round(value)) if whole else value


def _kueue_message(job: QueuedJob, quota: int, used: int) -> str:
    """Kueue's scheduler's words for a workload that does not fit (flavorassigner): more
    than the queue will ever have, or more than it has free now."""
    resource = next(iter(job.gpus_per_pod), GPU_RESOURCE)
    prefix = "couldn't assign flavors to pod set main: "
    if job.gpus > quota:
        return (
            f"{prefix}insufficient quota for {resource} in flavor default-flavor, previously "
            f"considered podsets requests (0) + current podset request ({job.gpus}) > "
            f"maximum capacity ({quota})"
        )
    more = job.gpus - (quota - used)
    return (
        f"{prefix}insufficient unused quota for {resource} in flavor default-flavor, "
        f"{more} more needed"
    )


def _claim_name(w: Workload, index: int, generation: int) -> str | None:
    """The claim of a pod: the workload's shared one, or one made from its template for
    this pod (as the ResourceClaim controller names them, `<pod>-<template>-<suffix>`)."""
    if w.claim is None:
        return None
    if w.claim == "shared":
        return f"{w.name}-gpus"
    pod = f"{w.name}-{index}" if generation == 0 else f"{w.name}-{index}-{generation}"
    return f"{pod}-gpus"


def _owner(w: Workload) -> tuple[str, str] | None:
    kind = w.owner or DEFAULT_OWNERS[w.kind]
    if kind == "job":
        return ("Job", w.name)
    if kind == "deployment":
        digest = hashlib.sha256(f"{w.namespace}/{w.name}".encode()).hexdigest()[:10]
        return ("ReplicaSet", f"{w.name}-{digest}")
    if kind == "statefulset":
        return ("StatefulSet", w.name)
    return None


@dataclass
class _NodeState:
    layout: NodeLayout
    free: list[Device]
    next_pid: int = FIRST_PID
    mem_total: dict[str, int] = field(default_factory=dict)


class Cluster:
    """The scenario's cluster; `advance` moves it forward in simulated time."""

    def __init__(
        self,
        scenario: Scenario,
        nodes: tuple[NodeLayout, ...] | None = None,
        *,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        self.scenario = scenario
        self.layouts = nodes if nodes is not None else layout(scenario, cluster)
        self._uid_seed = (
            str(scenario.seed) if cluster == DEFAULT_CLUSTER else f"{cluster}/{scenario.seed}"
        )
        """What pod uids are drawn from: a named cluster's pods have uids of their own, as
        real ones do, while their names and everything else follow the scenario."""
        self.now = float("-inf")
        """Everything before this simulated time has been applied."""
        self.pods: dict[str, PodRun] = {}
        """Live pods (deleted ones leave) by uid."""
        self._nodes = {n.name: _NodeState(n, list(n.devices)) for n in self.layouts}
        for state in self._nodes.values():
            state.mem_total = {gpu.uuid: gpu.mem_total_bytes for gpu in state.layout.gpus}
        self._mem_used: dict[str, int] = {}
        self._holders: dict[str, int] = {}
        self._replicas_taken: dict[str, int] = {}
        self._shared: dict[tuple[str, str], tuple[str, tuple[Device, ...], set[str]]] = {}
        """(namespace, claim) -> node, devices and the pods using a shared claim now."""
        self._queue: list[tuple[float, int, Action, str]] = []
        self._seq = 0
        self._pending: list[str] = []
        self._dirty = False
        self._later: dict[str, PodSpec] = {}
        self.jobs: dict[str, QueuedJob] = {}
        """Kueue's Workloads by uid: submitted, waiting or admitted (finished ones stay)."""
        self._quota = {q.name: q.gpus for q in scenario.queues}
        self._used = dict.fromkeys(self._quota, 0)
        self._waiting: list[str] = []
        """Workloads waiting for quota, in submission order (StrictFIFO)."""
        self._said: dict[str, str] = {}
        """The last message of each waiting workload."""
        self._running_pods: dict[str, set[str]] = {}
        """Admitted workload -> its pods not finished yet."""
        self._failed: set[str] = set()
        initial = [
            self._spec(workload, index, 0, None)
            for workload in scenario.workloads
            for index in range(self._pod_count(workload))
        ]
        self.initial: tuple[PodSpec, ...] = tuple(initial)
        """The first pod of every workload slot, as planned (creation times may be ahead);
        a queued job's pods are created only when Kueue admits it."""
        queued = {w.name: w for w in scenario.workloads if w.queue is not None}
        for spec in initial:
            if spec.workload not in queued:
                self._plan(spec)
        for w in queued.values():
            job = self._job(w, next(p for p in initial if p.workload == w.name).created_s)
            self.jobs[job.uid] = job
            self._push(job.created_s, "submit", job.uid)

    # ---- reading ---------------------------------------------------------------------

    def pod_named(self, name: str, namespace: str | None = None) -> PodRun:
        """The live pod of that name; KeyError when there is none."""
        for pod in self.pods.values():
            if pod.spec.name == name and namespace in (None, pod.spec.namespace):
                return pod
        raise KeyError(name)

    def free_devices(self, resource: str = GPU_RESOURCE) -> dict[str, int]:
        """Free devices of `resource` per node."""
        return {
            name: sum(1 for d in state.free if d.resource == resource)
            for name, state in self._nodes.items()
        }

    def allocated_uuids(self) -> set[str]:
        """GPUs and MIG instances some pod holds now."""
        return {uuid for uuid, count in self._holders.items() if count > 0}

    # ---- the clock -------------------------------------------------------------------

    def advance(self, until: float) -> list[Change]:
        """Apply every transition due before `until`, in time order; the changes made."""
        out: list[Change] = []
        while self._queue and self._queue[0][0] < until:
            t = self._queue[0][0]
            while self._queue and self._queue[0][0] == t:
                _, _, action, uid = heapq.heappop(self._queue)
                self._apply(action, uid, t, out)
            if self._dirty:
                self._dirty = False
                self._schedule(t, out)
        self.now = max(self.now, until)
        return out

    def _push(self, at: float, action: Action, uid: str) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, action, uid))

    # ---- pods ------------------------------------------------------------------------

    def _pod_count(self, w: Workload) -> int:
        if w.pods_per_node is None:
            return 1 if w.pods is None else w.pods
        nodes = sum(1 for n in self.layouts if w.pool in (None, n.pool))
        return round(w.pods_per_node * nodes)

    def _spec(self, w: Workload, index: int, generation: int, created: float | None) -> PodSpec:
        rng = random.Random(f"{self.scenario.seed}/{w.name}/{index}/{generation}")
        uid_rng = random.Random(f"{self._uid_seed}/{w.name}/{index}/{generation}")
        uid = str(uuidlib.UUID(int=uid_rng.getrandbits(128), version=4))
        rng.getrandbits(128)  # the draws after the uid stay those of the default cluster
        start = _draw(w.start_s, rng, whole=True)
        labels = {"team": w.team, "project": w.project, "app.kubernetes.io/name": w.name}
        if w.queue is not None:
            labels[QUEUE_LABEL] = w.queue
        return PodSpec(
            uid=uid,
            name=f"{w.name}-{index}" if generation == 0 else f"{w.name}-{index}-{generation}",
            namespace=w.namespace,
            workload=w.name,
            kind=w.kind,
            container=CONTAINERS[w.kind],
            labels={**{k: v for k, v in labels.items() if v is not None}, **w.labels},
            owner=_owner(w),
            priority_class=w.priority_class,
            pool=w.pool,
            resource=(
                dra_resource(w.mig_profile)
                if w.claim is not None
                else GPU_RESOURCE
                if w.mig_profile is None
                else mig_resource(w.mig_profile)
            ),
            count=w.gpus,
            created_s=(start or 0.0) if created is None else created,
            pull_s=_draw(w.pull_s, rng, whole=True) or 0.0,
            duration_s=_draw(w.duration_s, rng, whole=True),
            end=w.end,
            crash_after_s=max(1.0, _draw(w.crash_after_s, rng, whole=True) or 1.0),
            crash_reason=w.crash_reason,
            mem_fraction=_draw(w.mem_fraction, rng) or 0.0,
            peak_util_pct=_draw(w.peak_util_pct, rng),
            unallocated_gpus=w.unallocated_gpus,
            recreate_after_s=_draw(w.recreate_after_s, rng, whole=True),
            index=index,
            generation=generation,
            claim=_claim_name(w, index, generation),
            shared_claim=w.claim == "shared",
            work=dict(w.work),
        )

    def _plan(self, spec: PodSpec) -> None:
        self._later[spec.uid] = spec
        self._push(spec.created_s, "create", spec.uid)

    # ---- Kueue ------------------------------------------------------------------------

    def _job(self, w: Workload, created_s: float) -> QueuedJob:
        digest = hashlib.sha256(f"{self._uid_seed}/{w.name}/workload".encode()).digest()
        uid = str(uuidlib.UUID(bytes=digest[:16], version=4))
        spec = self._spec(w, 0, 0, created_s)
        assert w.queue is not None
        return QueuedJob(
            uid=uid,
            name=f"job-{w.name}-{digest.hex()[:5]}",
            namespace=w.namespace,
            workload=w.name,
            queue=w.queue,
            pods=self._pod_count(w),
            gpus_per_pod={spec.resource: spec.count} if spec.count else {},
            labels=spec.labels,
            priority_class=spec.priority_class,
            created_s=created_s,
            claims=spec.claim is not None,
        )

    def _admit(self, t: float, out: list[Change]) -> None:
        """Admit waiting workloads in submission order while their queue's quota has room;
        each one first in its queue that does not fit waits with Kueue's message."""
        blocked: set[str] = set()
        for uid in list(self._waiting):
            job = self.jobs[uid]
            if job.queue in blocked:
                continue
            quota, used = self._quota[job.queue], self._used[job.queue]
            if used + job.gpus <= quota:
                self._waiting.remove(uid)
                self._used[job.queue] = used + job.gpus
                self._said.pop(uid, None)
                out.append(WorkloadAdmitted(t, uid, job.queue))
                w = next(w for w in self.scenario.workloads if w.name == job.workload)
                specs = [self._spec(w, i, 0, t) for i in range(job.pods)]
                self._running_pods[uid] = {spec.uid for spec in specs}
                for spec in specs:
                    self._plan(spec)
                continue
            blocked.add(job.queue)  # StrictFIFO: the head of the queue blocks the rest
            message = _kueue_message(job, quota, used)
            if self._said.get(uid) != message:
                self._said[uid] = message
                out.append(WorkloadPending(t, uid, message))

    def _job_pod_finished(self, pod: PodRun, t: float, out: list[Change]) -> None:
        """A pod of an admitted workload ended: the workload finishes with its last pod."""
        for uid, pods in self._running_pods.items():
            if pod.spec.uid not in pods:
                continue
            pods.discard(pod.spec.uid)
            if pod.phase != "Succeeded":
                self._failed.add(uid)
            if not pods:
                job = self.jobs[uid]
                del self._running_pods[uid]
                self._used[job.queue] -= job.gpus
                out.append(WorkloadFinished(t, uid, uid not in self._failed))
                self._admit(t, out)
            return

    def _apply(self, action: Action, uid: str, t: float, out: list[Change]) -> None:
        if action == "submit":
            self._waiting.append(uid)
            out.append(WorkloadCreated(t, self.jobs[uid]))
            self._admit(t, out)
            return
        if action == "create":
            spec = self._later.pop(uid)
            self.pods[uid] = PodRun(spec)
            self._pending.append(uid)
            self._dirty = True
            out.append(PodCreated(t, spec))
            return
        pod = self.pods.get(uid)
        if pod is None:
            return
        if action == "start":
            self._start(pod, t, out)
        elif action == "crash":
            self._crash(pod, t, out)
        elif action == "finish":
            self._finish(pod, t, out)
        else:
            del self.pods[uid]
            out.append(PodDeleted(t, uid))

    def _start(self, pod: PodRun, t: float, out: list[Change]) -> None:
        spec = pod.spec
        pod.status = "Running"
        out.append(ContainerStarted(t, spec.uid, pod.restarts))
        if pod.started_s is None:
            pod.started_s = t
            if spec.duration_s is not None:
                self._push(t + spec.duration_s, "finish", spec.uid)
        self._start_processes(pod, t, out)
        if spec.kind == "crashloop":
            self._push(t + spec.crash_after_s, "crash", spec.uid)

    def _crash(self, pod: PodRun, t: float, out: list[Change]) -> None:
        self._stop_processes(pod, t, out)
        pod.restarts += 1
        pod.status = "CrashLoopBackOff"
        backoff = min(BACKOFF_START_S * 2 ** (pod.restarts - 1), BACKOFF_MAX_S)
        reason, code = END_REASONS[pod.spec.crash_reason]
        out.append(ContainerCrashed(t, pod.spec.uid, reason, code, pod.restarts, backoff))
        self._push(t + backoff, "start", pod.spec.uid)

    def _finish(self, pod: PodRun, t: float, out: list[Change]) -> None:
        spec = pod.spec
        self._stop_processes(pod, t, out)
        self._release(pod)
        reason, code = END_REASONS[spec.end]
        pod.status = reason  # type: ignore[assignment]  # Completed, OOMKilled, Error
        pod.finished_s = t
        out.append(PodFinished(t, spec.uid, "Succeeded" if code == 0 else "Failed", reason, code))
        self._job_pod_finished(pod, t, out)
        self._dirty = True
        ttl = self.scenario.finished_ttl_s
        if ttl is not None:
            self._push(t + ttl, "delete", spec.uid)
        if spec.recreate_after_s is not None:
            workload = next(w for w in self.scenario.workloads if w.name == spec.workload)
            again = t + spec.recreate_after_s
            self._plan(self._spec(workload, spec.index, spec.generation + 1, again))

    # ---- processes -------------------------------------------------------------------

    def _start_processes(self, pod: PodRun, t: float, out: list[Change]) -> None:
        spec = pod.spec
        assert pod.node is not None
        node = self._nodes[pod.node]
        uuids = list(dict.fromkeys(d.uuid for d in pod.devices))
        if spec.unallocated_gpus:
            others = [u for u in node.layout.compute_uuids if u not in uuids]
            held = self.allocated_uuids()
            others.sort(key=lambda u: u in held)  # unallocated ones first, index order kept
            uuids += others[: spec.unallocated_gpus]
        replicas = node.layout.replicas if node.layout.sharing == "time-slicing" else 1
        processes = []
        for uuid in uuids:
            total = node.mem_total[uuid]
            used = self._mem_used.get(uuid, 0)
            room = total - used - CONTEXT_OVERHEAD_BYTES
            if room < 0:
                continue  # not even a CUDA context fits: the process would not start
            mem = min(int(total / replicas * spec.mem_fraction), room)
            self._mem_used[uuid] = used + mem + CONTEXT_OVERHEAD_BYTES
            pid = node.next_pid
            node.next_pid += 1
            processes.append((pid, uuid, mem))
            up = spec.crash_after_s if spec.kind == "crashloop" else None
            out.append(
                ProcessStarted(
                    t, node.layout.name, pid, spec.uid, uuid, spec.kind, mem, spec.peak_util_pct, up
                )
            )
        pod.processes = tuple(processes)

    def _stop_processes(self, pod: PodRun, t: float, out: list[Change]) -> None:
        assert pod.node is not None
        for pid, uuid, mem in pod.processes:
            self._mem_used[uuid] -= mem + CONTEXT_OVERHEAD_BYTES
            out.append(ProcessStopped(t, pod.node, pid, pod.spec.uid))
        pod.processes = ()

    # ---- scheduling ------------------------------------------------------------------

    def _release(self, pod: PodRun) -> None:
        if pod.node is None:
            return
        node = self._nodes[pod.node]
        for device in pod.devices:
            self._holders[device.uuid] -= 1
        if pod.spec.shared_claim and pod.spec.claim is not None:
            # The claim's devices stay reserved while another pod still uses the claim.
            key = (pod.spec.namespace, pod.spec.claim)
            users = self._shared[key][2]
            users.discard(pod.spec.uid)
            if users:
                return
            del self._shared[key]
        for device in pod.devices:
            if device.id != device.uuid:
                self._replicas_taken[device.uuid] -= 1
        order = {device.id: i for i, device in enumerate(node.layout.devices)}
        node.free = sorted([*node.free, *pod.devices], key=lambda d: order[d.id])

    def _schedule(self, t: float, out: list[Change]) -> None:
        for uid in list(self._pending):
            pod = self.pods[uid]
            spec = pod.spec
            fit = self._place(spec)
            if fit is None:
                message = self._why(spec)
                if message != pod.unschedulable:
                    pod.unschedulable = message
                    out.append(PodUnschedulable(t, uid, message))
                continue
            name, devices = fit
            self._pending.remove(uid)
            node = self._nodes[name]
            for device in devices:
                self._holders[device.uuid] = self._holders.get(device.uuid, 0) + 1
            claim = (spec.namespace, spec.claim or "")
            if spec.shared_claim and claim in self._shared:
                self._shared[claim][2].add(uid)  # allocated already: the same devices
            else:
                if spec.shared_claim:
                    self._shared[claim] = (name, devices, {uid})
                taken = {d.id for d in devices}
                node.free = [d for d in node.free if d.id not in taken]
                for device in devices:
                    if device.id != device.uuid:
                        self._replicas_taken[device.uuid] = (
                            self._replicas_taken.get(device.uuid, 0) + 1
                        )
            pod.status, pod.node, pod.devices, pod.unschedulable = (
                "ContainerCreating",
                name,
                devices,
                None,
            )
            out.append(PodBound(t, uid, name, devices))
            self._push(t + spec.pull_s, "start", uid)

    def _place(self, spec: PodSpec) -> tuple[str, tuple[Device, ...]] | None:
        if spec.shared_claim and spec.claim is not None:
            allocated = self._shared.get((spec.namespace, spec.claim))
            if allocated is not None:  # the claim's node and devices, whoever else uses them
                return allocated[0], allocated[1]
        best: tuple[int, str, list[Device]] | None = None
        for name, node in self._nodes.items():
            if spec.pool not in (None, node.layout.pool):
                continue
            free = [d for d in node.free if d.resource == spec.resource]
            if len(free) < spec.count:
                continue
            score = len(free) if self.scenario.scheduler == "spread" else -len(free)
            if best is None or score > best[0]:
                best = (score, name, free)
        if best is None:
            return None
        _, name, free = best
        return name, self._pick(free, spec.count)

    def _pick(self, free: list[Device], count: int) -> tuple[Device, ...]:
        """Whole GPUs and MIG instances in index order; replicas from the least shared GPU."""
        if not free or free[0].id == free[0].uuid:
            return tuple(free[:count])
        taken = dict(self._replicas_taken)
        chosen: list[Device] = []
        left = list(free)
        for _ in range(count):
            device = min(left, key=lambda d: taken.get(d.uuid, 0))  # first of the least used
            chosen.append(device)
            left.remove(device)
            taken[device.uuid] = taken.get(device.uuid, 0) + 1
        return tuple(chosen)

    def _why(self, spec: PodSpec) -> str:
        """The scheduler's message: `0/4 nodes are available: 4 Insufficient nvidia.com/gpu.`"""
        reasons: dict[str, int] = {}
        for node in self._nodes.values():
            if spec.pool not in (None, node.layout.pool):
                reason = "node(s) didn't match Pod's node affinity/selector"
            else:
                reason = f"Insufficient {spec.resource}"
            reasons[reason] = reasons.get(reason, 0) + 1
        parts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        return f"0/{len(self._nodes)} nodes are available: {parts}."
