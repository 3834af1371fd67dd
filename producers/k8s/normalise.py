"""Kubernetes Pods and Nodes to `gpuwatch.k8s.pod/v1` and `gpuwatch.k8s.node/v1` values.

Pure functions of the object (and, for a pod, its resolved owner). The values come out
with `type="ADDED"` and `ts=0`: the event type and time are set where the event is
known (`resync.py`). Each object also yields its *stamps*: the times the API recorded
for the transitions our values show (condition transitions, container starts and
finishes, deletion), from which the event time of a change is taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from producers.k8s.objects import (
    Condition as ConditionObject,
)
from producers.k8s.objects import (
    ContainerStatusObject,
    MalformedObject,
    Node,
    ObjectMeta,
    Pod,
    PodSpec,
    parse_time,
)
from producers.k8s.owners import controller_of
from producers.k8s.selection import GpuResources, effective_request
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import NodeName, PodUid
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import Condition, ContainerStatus, K8sPod, Owner, PodPhase

__all__ = [
    "POD_CONDITIONS",
    "QUEUE_LABEL",
    "NodeRules",
    "PodRules",
    "Stamps",
    "gpu_products",
    "node_key",
    "node_stamps",
    "normalise_node",
    "normalise_pod",
    "pod_key",
    "pod_stamps",
]

POD_CONDITIONS = ("PodScheduled", "Ready", "DisruptionTarget")
"""Conditions copied into messages, in this order: scheduling (Unschedulable with the
scheduler's message, SchedulingGated by a queue), readiness, and why the pod is being
terminated (eviction, preemption: reason TerminationByKubelet, PreemptionByScheduler...).
Initialized and ContainersReady add nothing the container states do not show."""

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue; older Kueue set it as an annotation
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

_PHASES: frozenset[str] = frozenset({"Pending", "Running", "Succeeded", "Failed", "Unknown"})
_STATUSES = frozenset({"True", "False", "Unknown"})

Stamps = frozenset[tuple[str, int]]
"""(what, epoch ms) pairs: a transition the API recorded and when."""


@dataclass(frozen=True)
class PodRules:
    """What a pod value carries: which resources are GPUs, which labels are copied, which
    cluster it names."""

    gpus: GpuResources
    label_allowlist: tuple[str, ...] = ()
    cluster: str = DEFAULT_CLUSTER


@dataclass(frozen=True)
class NodeRules:
    """What a node value carries."""

    gpus: GpuResources
    label_allowlist: tuple[str, ...] = ()
    cluster: str = DEFAULT_CLUSTER


def _meta(obj: Pod | Node) -> ObjectMeta:
    return obj.get("metadata") or {}


def pod_key(pod: Pod) -> str:
    """The message key of a pod: its uid."""
    uid = _meta(pod).get("uid")
    if not uid:
        raise MalformedObject("pod without metadata.uid")
    return uid


def node_key(node: Node) -> str:
    """The message key of a node: its name."""
    name = _meta(node).get("name")
    if not name:
        raise MalformedObject("node without metadata.name")
    return name


def _allowed(labels: Mapping[str, str] | None, allowlist: Iterable[str]) -> dict[str, str]:
    labels = labels or {}
    return {key: labels[key] for key in allowlist if key in labels}


def _created(meta: ObjectMeta, what: str) -> int:
    created = parse_time(meta.get("creationTimestamp"))
    if created is None:
        raise MalformedObject(f"{what} without metadata.creationTimestamp")
    return created


def _condition(obj: ConditionObject) -> Condition:
    status = obj.get("status") or "Unknown"
    return Condition(
        type=obj.get("type") or "",
        status=status if status in _STATUSES else "Unknown",  # type: ignore[arg-type]
        reason=obj.get("reason") or None,
        message=obj.get("message") or None,
    )


def _container(obj: ContainerStatusObject) -> ContainerStatus:
    state = obj.get("state") or {}
    terminated = state.get("terminated")
    kind: Literal["waiting", "running", "terminated"]
    if terminated is not None:
        kind, reason, exit_code = "terminated", terminated.get("reason"), terminated.get("exitCode")
    elif state.get("running") is not None:
        kind, reason, exit_code = "running", None, None
    else:
        # A container waiting after it ran (CrashLoopBackOff) shows the exit code of its
        # last run: the reason says it is backing off, the code says how it died (137: OOM).
        last = (obj.get("lastState") or {}).get("terminated") or {}
        kind, reason = "waiting", (state.get("waiting") or {}).get("reason")
        exit_code = last.get("exitCode")
    return ContainerStatus(
        name=obj.get("name") or "",
        state=kind,
        reason=reason or None,
        exit_code=exit_code,
        restarts=max(0, obj.get("restartCount") or 0),
    )


def _statuses(pod: Pod) -> list[ContainerStatusObject]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _conditions(conditions: Iterable[ConditionObject] | None) -> dict[str, ConditionObject]:
    return {c.get("type") or "": c for c in conditions or ()}


def _finished_at(pod: Pod, phase: str, conditions: Mapping[str, ConditionObject]) -> int | None:
    """The last container termination of a pod in a final phase; a pod that ended without
    a recorded termination (evicted before its containers ran) falls back to the last
    transition of its conditions."""
    if phase not in ("Succeeded", "Failed"):
        return None
    times = [
        parse_time(((s.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for s in _statuses(pod)
    ]
    found = [t for t in times if t is not None]
    if not found:
        found = [
            t
            for name in POD_CONDITIONS
            if (t := parse_time(conditions.get(name, {}).get("lastTransitionTime"))) is not None
        ]
    return max(found) if found else None


def normalise_pod(
    pod: Pod, rules: PodRules, owner: Owner | None, claimed: Mapping[str, int] | None = None
) -> K8sPod:
    """The pod value (type ADDED, ts 0); MalformedObject when it has no uid or creation time.
    `claimed`: the GPU devices its ResourceClaims ask for, by device class."""
    meta = _meta(pod)
    uid = pod_key(pod)
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    conditions = _conditions(status.get("conditions"))
    scheduled = conditions.get("PodScheduled", {})
    labels = meta.get("labels") or {}
    queue = labels.get(QUEUE_LABEL) or (meta.get("annotations") or {}).get(QUEUE_LABEL)
    return K8sPod(
        schema="gpuwatch.k8s.pod/v1",
        type="ADDED",
        ts=0,
        resource_version=meta.get("resourceVersion") or "",
        uid=PodUid(uid),
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        node=NodeName(node) if (node := spec.get("nodeName")) else None,
        phase=_phase(phase),
        created_at=_created(meta, "pod"),
        scheduled_at=(
            parse_time(scheduled.get("lastTransitionTime"))
            if scheduled.get("status") == "True"
            else None
        ),
        started_at=parse_time(status.get("startTime")),
        finished_at=_finished_at(pod, phase, conditions),
        gpu_request={**effective_request(pod, rules.gpus), **(claimed or {})},
        conditions=tuple(
            _condition(conditions[name]) for name in POD_CONDITIONS if name in conditions
        ),
        containers=tuple(_container(s) for s in _statuses(pod)),
        labels=_allowed(labels, rules.label_allowlist),
        owner=owner,
        priority_class=spec.get("priorityClassName") or None,
        queue=queue or None,
        cluster=rules.cluster,
        gpu_products=gpu_products(spec),
        controller_uid=(controller_of(meta.get("ownerReferences")) or {}).get("uid") or None,
        scheduling_gates=_gates(spec),
    )


def gpu_products(spec: PodSpec) -> tuple[str, ...] | None:
    """The GPU models (`nvidia.com/gpu.product` values) a pod may land on, by its node
    selector and its required node affinity; None where neither constrains the label.

    The terms of a required affinity are ORed: it constrains the label only if every term
    does (`In`), and then allows the union of their values. A node selector and an
    affinity must both hold: the intersection. Other operators (NotIn, Exists) and other
    labels, taints and preferred affinities are not read: what a pod could use is told by
    model and GPU resource name alone.
    """
    allowed: set[str] | None = None
    selected = (spec.get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
    if selected:
        allowed = {selected}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    by_terms: set[str] | None = set() if terms else None
    for term in terms:
        values: set[str] | None = None
        for expression in term.get("matchExpressions") or ():
            if expression.get("key") == GPU_PRODUCT_LABEL and expression.get("operator") == "In":
                these = set(expression.get("values") or ())
                values = these if values is None else values & these
        if values is None:
            by_terms = None  # a term that allows any model: the affinity allows any
            break
        assert by_terms is not None
        by_terms |= values
    if by_terms is not None:
        allowed = by_terms if allowed is None else allowed & by_terms
    return None if allowed is None else tuple(sorted(allowed))


def _phase(phase: str) -> PodPhase:
    return phase if phase in _PHASES else "Unknown"  # type: ignore[return-value]


def _gates(spec: PodSpec) -> tuple[str, ...]:
    """The names of the pod's scheduling gates (none: empty)."""
    return tuple(name for gate in spec.get("schedulingGates") or () if (name := gate.get("name")))


def pod_stamps(pod: Pod) -> Stamps:
    """The recorded transition times a pod value depends on."""
    meta = _meta(pod)
    status = pod.get("status") or {}
    found: list[tuple[str, int | None]] = [
        ("created", parse_time(meta.get("creationTimestamp"))),
        ("deleted", parse_time(meta.get("deletionTimestamp"))),
        ("started", parse_time(status.get("startTime"))),
    ]
    for condition in status.get("conditions") or ():
        if condition.get("type") in POD_CONDITIONS:
            found.append(
                (
                    f"condition/{condition.get('type')}",
                    parse_time(condition.get("lastTransitionTime")),
                )
            )
    for container in _statuses(pod):
        name = container.get("name") or ""
        state = container.get("state") or {}
        running = state.get("running") or {}
        terminated = state.get("terminated") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        found += [
            (f"container/{name}/running", parse_time(running.get("startedAt"))),
            (f"container/{name}/finished", parse_time(terminated.get("finishedAt"))),
            (f"container/{name}/last-finished", parse_time(last.get("finishedAt"))),
        ]
    return frozenset((what, ms) for what, ms in found if ms is not None)


def normalise_node(node: Node, rules: NodeRules) -> K8sNode:
    """The node value (type ADDED, ts 0); MalformedObject when it has no name."""
    meta = _meta(node)
    name = node_key(node)
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = _conditions(status.get("conditions")).get("Ready", {})
    labels = meta.get("labels") or {}
    return K8sNode(
        schema="gpuwatch.k8s.node/v1",
        type="ADDED",
        node=NodeName(name),
        ts=0,
        gpu_capacity=rules.gpus.counts(status.get("capacity")),
        gpu_allocatable=rules.gpus.counts(status.get("allocatable")),
        gpu_product=labels.get(GPU_PRODUCT_LABEL) or None,
        labels=_allowed(labels, rules.label_allowlist),
        ready=ready.get("status") == "True",
        unschedulable=bool(spec.get("unschedulable")),
        cluster=rules.cluster,
    )


def node_stamps(node: Node) -> Stamps:
    """The recorded transition times a node value depends on."""
    meta = _meta(node)
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = _conditions(status.get("conditions")).get("Ready", {})
    found: list[tuple[str, int | None]] = [
        ("created", parse_time(meta.get("creationTimestamp"))),
        ("deleted", parse_time(meta.get("deletionTimestamp"))),
        ("condition/Ready", parse_time(ready.get("lastTransitionTime"))),
    ]
    for taint in spec.get("taints") or ():
        if taint.get("key") == UNSCHEDULABLE_TAINT:
            found.append(("cordoned", parse_time(taint.get("timeAdded"))))
    return frozenset((what, ms) for what, ms in found if ms is not None)
