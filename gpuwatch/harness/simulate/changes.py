"""What the simulated cluster holds and reports as plain values: each pod as created and as it
is now, each Kueue job, and the changes `Cluster.advance` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuwatch.harness.simulate.gpus import WorkloadKind
from gpuwatch.harness.simulate.topology import Device

__all__ = [
    "Change",
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
