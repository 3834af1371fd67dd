"""The simulated cluster as a pure state machine: pods created, scheduled, run, crash-looped,
finished and deleted at the simulated times the scenario says, on a clock the caller moves.

`Cluster.advance(until)` applies every transition due before `until` (simulated seconds
after the epoch) in time order and returns the changes as plain values
(`gpuwatch.harness.simulate.changes`): what the API server shows of each pod and which
processes start and stop on which GPU. No clock, no threads, no I/O: the runner turns
changes into API objects and SimReader workloads.

Scheduling follows the default scheduler's shape without its detail: pods are tried in
creation order whenever a pod is created or GPUs are freed; a pod that fits no node stays
Pending with the scheduler's Unschedulable message, and pods behind it may still fit (a
big job starves while small ones pass: fragmentation). Where a pod fits and which devices
it gets is `gpuwatch.harness.simulate.placement`'s.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import uuid as uuidlib
from typing import Literal

from gpuwatch.harness.simulate.changes import (
    Change,
    ContainerCrashed,
    ContainerStarted,
    PodBound,
    PodCreated,
    PodDeleted,
    PodFinished,
    PodRun,
    PodSpec,
    PodUnschedulable,
    QueuedJob,
    WorkloadAdmitted,
    WorkloadCreated,
    WorkloadFinished,
    WorkloadPending,
)
from gpuwatch.harness.simulate.gpus import BACKOFF_MAX_S, BACKOFF_START_S
from gpuwatch.harness.simulate.placement import Placement
from gpuwatch.harness.simulate.scenario import Scenario, Span, Workload
from gpuwatch.harness.simulate.topology import (
    GPU_RESOURCE,
    NodeLayout,
    dra_resource,
    layout,
    mig_resource,
)
from schemas.fields import DEFAULT_CLUSTER

__all__ = ["Cluster"]

Action = Literal["create", "start", "crash", "finish", "delete", "submit"]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # a Kueue job's, and so its pods'
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
        self._placement = Placement(self.layouts, scenario.scheduler)
        """Its nodes' devices, free and held, and the processes on them."""
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
        return self._placement.free_devices(resource)

    def allocated_uuids(self) -> set[str]:
        """GPUs and MIG instances some pod holds now."""
        return self._placement.allocated_uuids()

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
        self._placement.start_processes(pod, t, out)
        if spec.kind == "crashloop":
            self._push(t + spec.crash_after_s, "crash", spec.uid)

    def _crash(self, pod: PodRun, t: float, out: list[Change]) -> None:
        self._placement.stop_processes(pod, t, out)
        pod.restarts += 1
        pod.status = "CrashLoopBackOff"
        backoff = min(BACKOFF_START_S * 2 ** (pod.restarts - 1), BACKOFF_MAX_S)
        reason, code = END_REASONS[pod.spec.crash_reason]
        out.append(ContainerCrashed(t, pod.spec.uid, reason, code, pod.restarts, backoff))
        self._push(t + backoff, "start", pod.spec.uid)

    def _finish(self, pod: PodRun, t: float, out: list[Change]) -> None:
        spec = pod.spec
        self._placement.stop_processes(pod, t, out)
        self._placement.release(pod)
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

    # ---- scheduling ------------------------------------------------------------------

    def _schedule(self, t: float, out: list[Change]) -> None:
        for uid in list(self._pending):
            pod = self.pods[uid]
            spec = pod.spec
            fit = self._placement.place(spec)
            if fit is None:
                message = self._placement.why(spec)
                if message != pod.unschedulable:
                    pod.unschedulable = message
                    out.append(PodUnschedulable(t, uid, message))
                continue
            name, devices = fit
            self._pending.remove(uid)
            self._placement.bind(spec, name, devices)
            pod.status, pod.node, pod.devices, pod.unschedulable = (
                "ContainerCreating",
                name,
                devices,
                None,
            )
            out.append(PodBound(t, uid, name, devices))
            self._push(t + spec.pull_s, "start", uid)
