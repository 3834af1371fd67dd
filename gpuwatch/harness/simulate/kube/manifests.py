"""Pods and Nodes as the API returns them, built step by step through their lifecycle.

For the test API server and the cluster simulator: a GPU pod is created Pending, then
found unschedulable or bound, pulls its image (or fails to), runs, crash-loops,
succeeds, fails, is evicted or terminated; a node becomes ready, not ready, cordoned.
Each function returns a new object (the input is not changed) with the fields and the
reasons the kubelet, the scheduler and the controllers write, at the time given (epoch
seconds). The unit tests hold them to recorded real objects (tests/unit/k8s/fixtures).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuwatch.harness.simulate.kube.store import rfc3339

__all__ = [
    "bound",
    "cordoned",
    "crash_looping",
    "evicted",
    "failed",
    "gpu_node",
    "gpu_pod",
    "image_pull_backoff",
    "node_ready",
    "pulling",
    "running",
    "succeeded",
    "terminating",
    "unschedulable",
]

Obj = dict[str, Any]

_POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")


def gpu_pod(
    name: str,
    namespace: str = "default",
    *,
    created: float,
    gpus: Mapping[str, int] | None = None,
    labels: Mapping[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    priority_class: str | None = None,
    container: str = "main",
    image: str = "nvcr.io/nvidia/pytorch:24.05-py3",
    restart_policy: str = "Always",
) -> Obj:
    """A new pod asking for `gpus` (default one nvidia.com/gpu), as stored at creation."""
    requests = {resource: str(count) for resource, count in (gpus or {"nvidia.com/gpu": 1}).items()}
    meta: Obj = {
        "creationTimestamp": rfc3339(created),
        "labels": dict(labels or {}),
        "name": name,
        "namespace": namespace,
    }
    if owner is not None:
        api_version = {"ReplicaSet": "apps/v1", "StatefulSet": "apps/v1"}.get(owner[0], "batch/v1")
        meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": owner[0],
                "name": owner[1],
                "uid": f"owner-{owner[0].lower()}-{owner[1]}",
            }
        ]
    spec: Obj = {
        "containers": [
            {
                "image": image,
                "name": container,
                "resources": {"limits": dict(requests), "requests": dict(requests)},
            }
        ],
        "restartPolicy": restart_policy,
        "schedulerName": "default-scheduler",
    }
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending", "qosClass": "Burstable"}}


def _copy(obj: Obj) -> Obj:
    return copy.deepcopy(obj)


def _set_condition(
    obj: Obj,
    type_: str,
    status: str,
    at: float,
    *,
    reason: str | None = None,
    message: str | None = None,
) -> None:
    """Set a condition; its lastTransitionTime moves only when its status changes."""
    conditions: list[Obj] = obj["status"].setdefault("conditions", [])
    found = next((c for c in conditions if c["type"] == type_), None)
    if found is None:
        found = {"lastProbeTime": None, "type": type_}
        conditions.append(found)
    if found.get("status") != status:
        found["lastTransitionTime"] = rfc3339(at)
    found["status"] = status
    for key, value in (("reason", reason), ("message", message)):
        if value is None:
            found.pop(key, None)
        else:
            found[key] = value


def _container_status(pod: Obj, state: Obj, *, ready: bool = False, started: bool = False) -> None:
    containers = pod["spec"]["containers"]
    statuses: list[Obj] = pod["status"].get("containerStatuses") or []
    by_name = {s["name"]: s for s in statuses}
    out = []
    for container in containers:
        previous = by_name.get(container["name"], {})
        out.append(
            {
                "image": container["image"],
                "imageID": previous.get("imageID", ""),
                "lastState": previous.get("lastState", {}),
                "name": container["name"],
                "ready": ready,
                "restartCount": previous.get("restartCount", 0),
                "started": started,
                "state": copy.deepcopy(state),
            }
        )
    pod["status"]["containerStatuses"] = out


def unschedulable(pod: Obj, at: float, message: str) -> Obj:
    """The scheduler found no node: PodScheduled False/Unschedulable with its message."""
    out = _copy(pod)
    _set_condition(out, "PodScheduled", "False", at, reason="Unschedulable", message=message)
    return out


def bound(pod: Obj, node: str, at: float) -> Obj:
    """The scheduler bound the pod to `node`."""
    out = _copy(pod)
    out["spec"]["nodeName"] = node
    _set_condition(out, "PodScheduled", "True", at)
    return out


def pulling(pod: Obj, at: float) -> Obj:
    """The kubelet took the pod: startTime set, containers ContainerCreating."""
    out = _copy(pod)
    status = out["status"]
    status.setdefault("startTime", rfc3339(at))
    status["hostIP"] = "10.0.0.10"
    _set_condition(out, "PodReadyToStartContainers", "False", at)
    _set_condition(out, "Initialized", "True", at)
    unready = f"containers with unready status: [{out['spec']['containers'][0]['name']}]"
    _set_condition(out, "Ready", "False", at, reason="ContainersNotReady", message=unready)
    _set_condition(
        out, "ContainersReady", "False", at, reason="ContainersNotReady", message=unready
    )
    _container_status(out, {"waiting": {"reason": "ContainerCreating"}})
    return out


def image_pull_backoff(pod: Obj, at: float) -> Obj:
    """The image cannot be pulled; the kubelet backs off."""
    out = pulling(pod, at)
    image = out["spec"]["containers"][0]["image"]
    message = f'Back-off pulling image "{image}"'
    _container_status(out, {"waiting": {"message": message, "reason": "ImagePullBackOff"}})
    return out


def running(pod: Obj, at: float) -> Obj:
    """Every container started and ready: phase Running, Ready True."""
    out = pulling(pod, at)
    out["status"]["phase"] = "Running"
    out["status"]["podIP"] = "10.244.0.10"
    for type_ in _POD_CONDITIONS:
        _set_condition(out, type_, "True", at)
    _container_status(out, {"running": {"startedAt": rfc3339(at)}}, ready=True, started=True)
    return out


def crash_looping(pod: Obj, at: float, *, exit_code: int = 137, reason: str = "OOMKilled") -> Obj:
    """The container died (`reason`, `exit_code`) and the kubelet backs off restarting it."""
    out = _copy(pod)
    if out["status"].get("phase") != "Running":
        out = running(out, at)
    name = out["spec"]["containers"][0]["name"]
    unready = f"containers with unready status: [{name}]"
    _set_condition(out, "Ready", "False", at, reason="ContainersNotReady", message=unready)
    _set_condition(
        out, "ContainersReady", "False", at, reason="ContainersNotReady", message=unready
    )
    for status in out["status"]["containerStatuses"]:
        status["lastState"] = _termination(status, at, reason, exit_code)
        status["restartCount"] = status.get("restartCount", 0) + 1
        status["ready"] = False
        status["started"] = False
        message = f"back-off 10s restarting failed container={status['name']} pod={name}"
        status["state"] = {"waiting": {"message": message, "reason": "CrashLoopBackOff"}}
    return out


def _terminated(pod: Obj, at: float, phase: str, reason: str, exit_code: int) -> Obj:
    out = _copy(pod)
    if "containerStatuses" not in out["status"]:
        out = running(out, at)
    out["status"]["phase"] = phase
    ready_reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
    _set_condition(out, "PodReadyToStartContainers", "False", at)
    _set_condition(out, "Ready", "False", at, reason=ready_reason)
    _set_condition(out, "ContainersReady", "False", at, reason=ready_reason)
    for status in out["status"]["containerStatuses"]:
        status["state"] = _termination(status, at, reason, exit_code)
        status["ready"] = False
        status["started"] = False
    return out


def _termination(status: Obj, at: float, reason: str, exit_code: int) -> Obj:
    """The `terminated` state of a container that ran from its running state's start to `at`."""
    started = (status["state"].get("running") or {}).get("startedAt", rfc3339(at))
    return {
        "terminated": {
            "exitCode": exit_code,
            "finishedAt": rfc3339(at),
            "reason": reason,
            "startedAt": started,
        }
    }


def succeeded(pod: Obj, at: float) -> Obj:
    """Every container exited 0: phase Succeeded."""
    return _terminated(pod, at, "Succeeded", "Completed", 0)


def failed(pod: Obj, at: float, *, reason: str = "Error", exit_code: int = 1) -> Obj:
    """A container exited non-zero and will not restart: phase Failed (`OOMKilled`, 137)."""
    return _terminated(pod, at, "Failed", reason, exit_code)


def evicted(pod: Obj, at: float, resource: str = "memory") -> Obj:
    """The kubelet evicted the pod under node pressure."""
    out = _copy(pod)
    message = f"The node was low on resource: {resource}. "
    _set_condition(
        out, "DisruptionTarget", "True", at, reason="TerminationByKubelet", message=message
    )
    out["status"].update(phase="Failed", reason="Evicted", message=message)
    _set_condition(out, "Ready", "False", at, reason="PodFailed")
    _set_condition(out, "ContainersReady", "False", at, reason="PodFailed")
    for status in out["status"].get("containerStatuses") or []:
        status["state"] = {
            "terminated": {
                "exitCode": 137,
                "finishedAt": None,
                "message": "The container could not be located when the pod was terminated",
                "reason": "ContainerStatusUnknown",
                "startedAt": None,
            }
        }
        status["ready"] = False
        status["started"] = False
    return out


def terminating(pod: Obj, at: float, grace_s: int = 30) -> Obj:
    """Deletion asked: deletionTimestamp is when the grace period ends."""
    out = _copy(pod)
    out["metadata"]["deletionTimestamp"] = rfc3339(at + grace_s)
    out["metadata"]["deletionGracePeriodSeconds"] = grace_s
    return out


def gpu_node(
    name: str,
    *,
    created: float,
    gpus: int = 8,
    resource: str = "nvidia.com/gpu",
    product: str = "NVIDIA-H100-80GB-HBM3",
    instance_type: str = "p5.48xlarge",
    labels: Mapping[str, str] | None = None,
    ready: bool = True,
) -> Obj:
    """A GPU node with GPU feature discovery labels, Ready (or not yet)."""
    capacity = {"cpu": "192", "memory": "2097152000Ki", "pods": "110", resource: str(gpus)}
    node: Obj = {
        "metadata": {
            "creationTimestamp": rfc3339(created),
            "labels": {
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": instance_type,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.replicas": "1",
                **(labels or {}),
            },
            "name": name,
        },
        "spec": {"taints": [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "true"}]},
        "status": {"allocatable": dict(capacity), "capacity": dict(capacity), "conditions": []},
    }
    return node_ready(node, ready, created)


def node_ready(node: Obj, ready: bool, at: float) -> Obj:
    """The kubelet posts Ready, or the node controller marks it Unknown (kubelet gone)."""
    out = _copy(node)
    conditions: list[Obj] = out["status"]["conditions"]
    found = next((c for c in conditions if c["type"] == "Ready"), None)
    if found is None:
        found = {"type": "Ready"}
        conditions.append(found)
    status = "True" if ready else "Unknown"
    if found.get("status") != status:
        found["lastTransitionTime"] = rfc3339(at)
    found.update(
        lastHeartbeatTime=rfc3339(at),
        status=status,
        reason="KubeletReady" if ready else "NodeStatusUnknown",
        message="kubelet is posting ready status"
        if ready
        else "Kubelet stopped posting node status.",
    )
    return out


def cordoned(node: Obj, at: float, on: bool = True) -> Obj:
    """`kubectl cordon` (or uncordon): spec.unschedulable and its taint."""
    out = _copy(node)
    taints = [
        t for t in out["spec"].get("taints", []) if t["key"] != "node.kubernetes.io/unschedulable"
    ]
    if on:
        out["spec"]["unschedulable"] = True
        taints.append(
            {
                "effect": "NoSchedule",
                "key": "node.kubernetes.io/unschedulable",
                "timeAdded": rfc3339(at),
            }
        )
    else:
        out["spec"].pop("unschedulable", None)
    out["spec"]["taints"] = taints
    return out
