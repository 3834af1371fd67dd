"""Kueue Workloads to `gpuwatch.k8s.workload/v1` values: the object, its decoder, its key.

Kueue (kueue.x-k8s.io) represents each queued job as a Workload: its pod sets (a count
and a pod template each), the LocalQueue it was submitted to, and conditions that tell
where it stands: `QuotaReserved` (False with reason Pending and the scheduler's message
while it waits, True once a ClusterQueue reserved its quota), `Admitted`, `Evicted`,
`Finished`. Fields read are the same in v1beta1 and v1beta2 but for the priority class
(v1beta1 `priorityClassName`, v1beta2 `priorityClassRef.name`). Pure, as `normalise.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import msgspec

from producers.k8s.normalise import PodRules, Stamps
from producers.k8s.objects import (
    Condition as ConditionObject,
)
from producers.k8s.objects import (
    MalformedObject,
    ObjectMeta,
    Page,
    Pod,
    PodSpec,
    decode_list,
    parse_time,
)
from producers.k8s.owners import controller_of
from producers.k8s.selection import effective_request
from schemas.k8s_pod import Owner
from schemas.k8s_workload import K8sWorkload, WorkloadCondition

__all__ = [
    "KUEUE_GROUP",
    "WORKLOAD_DECODER",
    "Workload",
    "decode_workload_list",
    "normalise_workload",
    "pod_set_templates",
    "workload_key",
    "workload_stamps",
]

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
"""The Workload versions read, newest first."""
WORKLOAD_CONDITIONS = (
    "QuotaReserved",
    "Admitted",
    "PodsReady",
    "Evicted",
    "Preempted",
    "Requeued",
    "Finished",
)
"""Conditions copied into messages, in this order."""
_STATUSES = frozenset({"True", "False", "Unknown"})


class PodTemplate(TypedDict, total=False):
    metadata: ObjectMeta | None
    spec: PodSpec | None


class PodSet(TypedDict, total=False):
    name: str | None
    count: int | None
    template: PodTemplate | None


class PriorityClassRef(TypedDict, total=False):
    name: str | None


class WorkloadSpec(TypedDict, total=False):
    queueName: str | None
    priority: int | None
    priorityClassName: str | None
    priorityClassRef: PriorityClassRef | None
    active: bool | None
    podSets: list[PodSet] | None


class Admission(TypedDict, total=False):
    clusterQueue: str | None


class WorkloadStatus(TypedDict, total=False):
    conditions: list[ConditionObject] | None
    admission: Admission | None


class Workload(TypedDict, total=False):
    metadata: ObjectMeta | None
    spec: WorkloadSpec | None
    status: WorkloadStatus | None


WORKLOAD_DECODER = msgspec.json.Decoder(Workload)


def decode_workload_list(raw: bytes) -> Page[Workload]:
    """A WorkloadList body; MalformedObject when it does not have the shape of one."""
    return decode_list(raw, WORKLOAD_DECODER, "WorkloadList")


def workload_key(workload: Workload) -> str:
    """The message key of a workload: its uid."""
    uid = (workload.get("metadata") or {}).get("uid")
    if not uid:
        raise MalformedObject("workload without metadata.uid")
    return uid


def _condition(obj: ConditionObject) -> WorkloadCondition:
    status = obj.get("status") or "Unknown"
    return WorkloadCondition(
        type=obj.get("type") or "",
        status=status if status in _STATUSES else "Unknown",  # type: ignore[arg-type]
        reason=obj.get("reason") or None,
        message=obj.get("message") or None,
        at=parse_time(obj.get("lastTransitionTime")),
    )


def _true_since(conditions: dict[str, ConditionObject], kind: str) -> int | None:
    condition = conditions.get(kind) or {}
    if condition.get("status") != "True":
        return None
    return parse_time(condition.get("lastTransitionTime"))


def _request(pod_sets: list[PodSet], rules: PodRules) -> tuple[int, dict[str, int]]:
    """(pods, GPU request by resource) over every pod set: count x one pod's request."""
    pods = 0
    total: dict[str, int] = {}
    for pod_set in pod_sets:
        count = max(0, pod_set.get("count") or 0)
        pods += count
        template = pod_set.get("template") or {}
        one: Pod = {"spec": template.get("spec") or {}}
        for resource, n in effective_request(one, rules.gpus).items():
            total[resource] = total.get(resource, 0) + n * count
    return pods, {r: n for r, n in sorted(total.items()) if n > 0}


def _labels(workload: Workload, rules: PodRules) -> dict[str, str]:
    """The allowed labels of the workload, else of its first pod set's template (where
    a job's team labels are)."""
    meta = workload.get("metadata") or {}
    found: dict[str, str] = {}
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    templates = [((p.get("template") or {}).get("metadata") or {}) for p in pod_sets[:1]]
    for labels in (*(t.get("labels") or {} for t in templates), meta.get("labels") or {}):
        found.update({k: labels[k] for k in rules.label_allowlist if k in labels})
    return found


def normalise_workload(
    workload: Workload,
    rules: PodRules,
    owner: Owner | None,
    claimed: Mapping[str, int] | None = None,
) -> K8sWorkload:
    """The workload value (type ADDED, ts 0); MalformedObject without uid or creation time.

    `owner` is the workload's controller resolved as a pod's is (a Job's CronJob); the
    controller itself gives `job_uid`. `claimed`: the GPU devices its pod sets' claims ask
    for over all their pods, by device class (added to the extended resources').
    """
    meta = workload.get("metadata") or {}
    uid = workload_key(workload)
    created = parse_time(meta.get("creationTimestamp"))
    if created is None:
        raise MalformedObject("workload without metadata.creationTimestamp")
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    conditions = {c.get("type") or "": c for c in status.get("conditions") or ()}
    pods, request = _request(spec.get("podSets") or [], rules)
    controller = controller_of(meta.get("ownerReferences"))
    priority_class = (spec.get("priorityClassRef") or {}).get("name") or spec.get(
        "priorityClassName"
    )
    return K8sWorkload(
        schema="gpuwatch.k8s.workload/v1",
        type="ADDED",
        ts=0,
        resource_version=meta.get("resourceVersion") or "",
        uid=uid,
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        created_at=created,
        queue=spec.get("queueName") or None,
        cluster_queue=(status.get("admission") or {}).get("clusterQueue") or None,
        priority=spec.get("priority"),
        priority_class=priority_class or None,
        active=spec.get("active") is not False,
        pods=pods,
        gpu_request={**request, **(claimed or {})},
        conditions=tuple(
            _condition(conditions[name]) for name in WORKLOAD_CONDITIONS if name in conditions
        ),
        owner=owner,
        job_uid=(controller or {}).get("uid") or None,
        labels=_labels(workload, rules),
        admitted_at=_true_since(conditions, "Admitted"),
        finished_at=_true_since(conditions, "Finished"),
        cluster=rules.cluster,
    )


def pod_set_templates(workload: Workload) -> list[tuple[int, PodSpec]]:
    """(count, pod template spec) of each pod set: what a pod set's claims are read from."""
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    return [
        (max(0, p.get("count") or 0), ((p.get("template") or {}).get("spec") or {}))
        for p in pod_sets
    ]


def workload_stamps(workload: Workload) -> Stamps:
    """The recorded transition times a workload value depends on."""
    meta = workload.get("metadata") or {}
    found: list[tuple[str, int | None]] = [
        ("created", parse_time(meta.get("creationTimestamp"))),
        ("deleted", parse_time(meta.get("deletionTimestamp"))),
    ]
    for condition in (workload.get("status") or {}).get("conditions") or ():
        if condition.get("type") in WORKLOAD_CONDITIONS:
            found.append(
                (
                    f"condition/{condition.get('type')}",
                    parse_time(condition.get("lastTransitionTime")),
                )
            )
    return frozenset((what, ms) for what, ms in found if ms is not None)
