"""What one pod event says about the lifecycle: the base state, its reason, a crash loop.

The base state is what the pod's phase alone tells: queued (Pending), running (Running)
or finished (Succeeded, Failed, deleted). Whether a running pod is stalled also needs
its GPU usage, which `lifecycle` combines with this. Reasons come from the pod's
conditions and container states, in the words `pod.lifecycle` documents.
"""

from __future__ import annotations

from typing import NamedTuple

from schemas.fields import LifecycleState
from schemas.k8s_pod import Condition, K8sPod

__all__ = [
    "CRASH_LOOP",
    "DELETED",
    "DELETED_UNSEEN",
    "IMAGE_PULL",
    "IMAGE_PULL_REASONS",
    "KUEUE_ADMISSION",
    "QUOTA_WAIT",
    "Observation",
    "observe",
]

CRASH_LOOP = "CrashLoopBackOff"
IMAGE_PULL = "ImagePull"
"""One reason for every image pull failure, so that the kubelet's alternation between
ErrImagePull and ImagePullBackOff is not a change of reason."""
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
QUOTA_WAIT = "WaitingForQuota"
"""A pod of a batch queue (Kueue) held by a scheduling gate until the queue admits it, as
told by its queue label alone (a watcher that does not send the gates' names)."""
KUEUE_ADMISSION = "KueueAdmission"
"""A pod held by Kueue's own scheduling gate until its workload is admitted."""
KUEUE_GATE = "kueue.x-k8s.io/admission"
SCHEDULING = "Scheduling"
"""Pending, not bound, and the scheduler has not said why yet."""
CREATING = "ContainerCreating"
DELETED = "Deleted"
DELETED_UNSEEN = "DeletedFinalStateUnknown"
"""A pod the watcher found gone from a relist (down or cut off when it was deleted): its
last known state was not final and how it ended is unknown (client-go's name for it)."""

# DisruptionTarget reasons (why the pod is being terminated) -> finished reason.
_DISRUPTION: dict[str, str] = {
    "TerminationByKubelet": "Evicted",  # node-pressure eviction, graceful node shutdown
    "EvictionByEvictionAPI": "Evicted",  # kubectl drain, the eviction API
    "DeletionByTaintManager": "Evicted",  # NoExecute taint
    "PreemptionByScheduler": "Preempted",
    "PreemptionByKubeScheduler": "Preempted",  # the name before Kubernetes 1.27
    "DeletionByPodGC": "Deleted",  # orphaned or terminating on a lost node
}


class Observation(NamedTuple):
    """The lifecycle facts of one pod event."""

    base: LifecycleState | None
    """queued, running or finished; None when the phase is Unknown (node unreachable)."""
    reason: str | None
    crash_loop: bool
    """A container of a running pod is in CrashLoopBackOff."""
    healthy: bool
    """Every container runs (or completed) and the pod is not unready."""


def _condition(pod: K8sPod, kind: str) -> Condition | None:
    return next((c for c in pod.conditions if c.type == kind), None)


def _disruption(pod: K8sPod) -> str | None:
    target = _condition(pod, "DisruptionTarget")
    if target is None or target.status != "True" or target.reason is None:
        return None
    return _DISRUPTION.get(target.reason)


def _failed_reason(pod: K8sPod) -> str:
    """Why a Failed pod failed: its disruption, an OOM kill, else Error."""
    disruption = _disruption(pod)
    if disruption is not None:
        return disruption
    if any(c.state == "terminated" and c.reason == "OOMKilled" for c in pod.containers):
        return "OOMKilled"
    return "Error"


def _gated(pod: K8sPod, otherwise: str) -> str:
    """Why a pod not scheduled yet waits: Kueue's gate; with the gates not told (an older
    watcher), a queue's (by its label); else `otherwise`."""
    if pod.scheduling_gates is None:
        return QUOTA_WAIT if pod.queue is not None else otherwise
    return KUEUE_ADMISSION if KUEUE_GATE in pod.scheduling_gates else otherwise


def _queued_reason(pod: K8sPod) -> str:
    """Why a Pending pod is not running yet: gated, unschedulable, pulling, creating."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.status != "True":
        if scheduled.reason == "SchedulingGated":
            return _gated(pod, "SchedulingGated")
        return scheduled.reason or SCHEDULING
    if pod.node is None:
        # No word from the scheduler yet; a queue's pod starts gated.
        return _gated(pod, SCHEDULING)
    for container in pod.containers:
        if container.state == "waiting" and container.reason is not None:
            return IMAGE_PULL if container.reason in IMAGE_PULL_REASONS else container.reason
    return CREATING


def _healthy(pod: K8sPod) -> bool:
    ready = _condition(pod, "Ready")
    if ready is not None and ready.status != "True":
        return False
    return all(
        c.state == "running" or (c.state == "terminated" and c.exit_code == 0)
        for c in pod.containers
    )


def observe(pod: K8sPod) -> Observation:
    """The lifecycle facts of a pod event (DELETED finishes the pod whatever its phase)."""
    if pod.type == "DELETED":
        if pod.phase == "Succeeded":
            reason = "Completed"
        elif pod.phase == "Failed":
            reason = _failed_reason(pod)
        else:
            reason = _disruption(pod) or (DELETED_UNSEEN if pod.final_state_unknown else DELETED)
        return Observation("finished", reason, crash_loop=False, healthy=False)
    if pod.phase == "Succeeded":
        return Observation("finished", "Completed", crash_loop=False, healthy=False)
    if pod.phase == "Failed":
        return Observation("finished", _failed_reason(pod), crash_loop=False, healthy=False)
    if pod.phase == "Pending":
        return Observation("queued", _queued_reason(pod), crash_loop=False, healthy=False)
    if pod.phase == "Running":
        crash_loop = any(c.state == "waiting" and c.reason == CRASH_LOOP for c in pod.containers)
        return Observation("running", None, crash_loop=crash_loop, healthy=_healthy(pod))
    return Observation(None, None, crash_loop=False, healthy=False)
