"""Kueue Workloads as Kueue writes them, step by step: created pending, waiting for quota,
quota reserved and admitted, finished; for the test API server, the real one (with
Kueue's CRDs installed) and the cluster simulator.

Each function returns a new object, with the conditions (metav1.Condition: type, status,
reason, message, lastTransitionTime, all required) and the messages of Kueue v0.17's
scheduler (`pkg/scheduler`, `flavorassigner`), at the time given (epoch seconds).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuwatch.harness.simulate.kube.store import rfc3339

__all__ = [
    "JOB_UID_LABEL",
    "admitted",
    "finished",
    "pending",
    "workload",
]

Obj = dict[str, Any]
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def workload(
    name: str,
    namespace: str,
    *,
    created: float,
    queue: str,
    job: tuple[str, str],
    pods: int,
    gpus_per_pod: Mapping[str, int],
    labels: Mapping[str, str] | None = None,
    priority: int | None = None,
    priority_class: str | None = None,
    claim_template: str | None = None,
) -> Obj:
    """The Workload Kueue makes for a suspended Job (`job`: its name and uid): one pod set
    `main` of `pods` pods, each asking for `gpus_per_pod`, or with `claim_template` for
    a ResourceClaim made from that template (GPUs through DRA: no extended resource)."""
    job_name, job_uid = job
    requests = {resource: str(count) for resource, count in gpus_per_pod.items()}
    resources: Obj = {"requests": dict(requests), "limits": requests}
    if claim_template is not None:
        resources = {"claims": [{"name": "gpus"}]}
    spec: Obj = {
        "active": True,
        "queueName": queue,
        "podSets": [
            {
                "name": "main",
                "count": pods,
                "template": {
                    "metadata": {"labels": dict(labels or {})},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                "resources": resources,
                            }
                        ],
                        **(
                            {
                                "resourceClaims": [
                                    {"name": "gpus", "resourceClaimTemplateName": claim_template}
                                ]
                            }
                            if claim_template is not None
                            else {}
                        ),
                    },
                },
            }
        ],
    }
    if priority is not None:
        spec["priority"] = priority
    if priority_class is not None:
        spec["priorityClassRef"] = {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": rfc3339(created),
            "labels": {JOB_UID_LABEL: job_uid},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
        "status": {},
    }


def _set(obj: Obj, type_: str, status: str, at: float, *, reason: str, message: str) -> None:
    """Set a condition; its lastTransitionTime moves only when its status changes."""
    conditions: list[Obj] = obj.setdefault("status", {}).setdefault("conditions", [])
    found = next((c for c in conditions if c["type"] == type_), None)
    if found is None:
        found = {"type": type_}
        conditions.append(found)
    if found.get("status") != status:
        found["lastTransitionTime"] = rfc3339(at)
    found.update(status=status, reason=reason, message=message)


def pending(obj: Obj, at: float, message: str) -> Obj:
    """The scheduler found no room: QuotaReserved False, reason Pending, its message
    (`couldn't assign flavors to pod set main: insufficient unused quota for ...`)."""
    out = copy.deepcopy(obj)
    _set(out, "QuotaReserved", "False", at, reason="Pending", message=message)
    return out


def admitted(obj: Obj, at: float, cluster_queue: str, flavor: str = "default-flavor") -> Obj:
    """Quota reserved in `cluster_queue` and admitted (no admission checks)."""
    out = copy.deepcopy(obj)
    pod_set = out["spec"]["podSets"][0]
    resources = pod_set["template"]["spec"]["containers"][0]["resources"].get("requests", {})
    out.setdefault("status", {})["admission"] = {
        "clusterQueue": cluster_queue,
        "podSetAssignments": [
            {
                "name": pod_set["name"],
                "count": pod_set["count"],
                "flavors": {resource: flavor for resource in resources},
                "resourceUsage": {
                    resource: str(int(count) * pod_set["count"])
                    for resource, count in resources.items()
                },
            }
        ],
    }
    reserved = f"Quota reserved in ClusterQueue {cluster_queue}"
    _set(out, "QuotaReserved", "True", at, reason="QuotaReserved", message=reserved)
    _set(out, "Admitted", "True", at, reason="Admitted", message="The workload is admitted")
    return out


def finished(obj: Obj, at: float, *, succeeded: bool = True) -> Obj:
    """The job ended: Finished True (Succeeded, or Failed)."""
    out = copy.deepcopy(obj)
    reason = "Succeeded" if succeeded else "Failed"
    message = "Job finished successfully" if succeeded else "Job failed"
    _set(out, "Finished", "True", at, reason=reason, message=message)
    return out
