"""The simulated cluster as the Kubernetes API shows it: nodes, pods and their controllers
written to the API server (the in-process one, or a real one through `LiveApiServer`), one
update per pod change, as the scheduler, the kubelet and the controllers would write them
(`gpuwatch.harness.simulate.kube.manifests`)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gpuwatch.harness.simulate.changes import (
    Change,
    ContainerCrashed,
    ContainerStarted,
    PodBound,
    PodCreated,
    PodDeleted,
    PodFinished,
    PodSpec,
    PodUnschedulable,
    WorkloadAdmitted,
    WorkloadCreated,
    WorkloadFinished,
    WorkloadPending,
)
from gpuwatch.harness.simulate.kube import kueue
from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.harness.simulate.kube.store import rfc3339
from gpuwatch.harness.simulate.topology import GPU_RESOURCE, NodeLayout, resource_slice
from producers.base.kubeapi import ApiError

__all__ = ["POOL_LABEL", "ApiWriter", "KubeMirror", "node_object", "pod_object"]

Obj = dict[str, Any]

log = logging.getLogger(__name__)

POOL_LABEL = "karpenter.sh/nodepool"  # allow-listed by the watcher, so pools show downstream
NODE_AGE_S = 3 * 3600  # nodes came up three hours before the start: a day would be far behind
# the samples, and a node's first message carries its Ready time
IMAGES = {
    "training": "nvcr.io/nvidia/pytorch:24.05-py3",
    "inference": "nvcr.io/nvidia/tritonserver:24.05-py3",
    "notebook": "quay.io/jupyter/pytorch-notebook:cuda12-2024-05-27",
    "idle": "nvcr.io/nvidia/pytorch:24.05-py3",
    "crashloop": "registry.example.com/ml/trainer:broken",
    "dev": "nvcr.io/nvidia/pytorch:24.05-py3",
}


def node_object(node: NodeLayout, created: float) -> Obj:
    """A Ready GPU node with the labels GPU feature discovery and the node pool write."""
    labels = {POOL_LABEL: node.pool}
    if node.sharing == "time-slicing":
        labels["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    if node.sharing == "mig":
        labels["nvidia.com/mig.strategy"] = "mixed"
    obj = m.gpu_node(
        node.name,
        created=created,
        gpus=node.physical_gpus,
        product=node.product,
        instance_type=node.instance_type,
        labels=labels,
    )
    meta_labels = obj["metadata"]["labels"]
    meta_labels["nvidia.com/gpu.replicas"] = str(node.replicas)
    for section in ("capacity", "allocatable"):
        if node.dra:  # the DRA driver's GPUs are in ResourceSlices: no device plugin resource
            obj["status"][section].pop(GPU_RESOURCE, None)
        for resource, count in node.capacity.items():
            obj["status"][section][resource] = str(count)
    return obj


def pod_object(spec: PodSpec, epoch: float) -> Obj:
    """A pod as created: its request, labels, owner, node selector, Pending."""
    pod = m.gpu_pod(
        spec.name,
        spec.namespace,
        created=epoch + spec.created_s,
        gpus={spec.resource: max(spec.count, 1)},
        labels=spec.labels,
        owner=spec.owner,
        priority_class=spec.priority_class,
        container=spec.container,
        image=IMAGES[spec.kind],
        restart_policy=spec.restart_policy,
    )
    pod["metadata"]["uid"] = spec.uid
    container = pod["spec"]["containers"][0]
    if spec.count == 0:  # a pod without a GPU request: CPU and memory only
        resources = {"cpu": "4", "memory": "16Gi"}
        container["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    if spec.claim is not None:  # GPUs through a ResourceClaim: no extended resource at all
        del container["resources"]
        container["resources"] = {"claims": [{"name": "gpus"}]}
        source = (
            {"resourceClaimName": spec.claim}
            if spec.shared_claim
            else {"resourceClaimTemplateName": f"{spec.workload}-gpus"}
        )
        pod["spec"]["resourceClaims"] = [{"name": "gpus", **source}]
    if spec.unallocated_gpus:  # how it reaches GPUs it was never given
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    if spec.pool is not None:
        pod["spec"]["nodeSelector"] = {POOL_LABEL: spec.pool}
    pod["spec"]["tolerations"] = [
        {"effect": "NoSchedule", "key": GPU_RESOURCE, "operator": "Exists"}
    ]
    return pod


def _controller(spec: PodSpec) -> tuple[str, Obj] | None:
    """The Job or ReplicaSet (of its Deployment) the pod's owner reference names."""
    if spec.owner is None or spec.owner[0] not in ("Job", "ReplicaSet"):
        return None
    kind, name = spec.owner
    meta: Obj = {"name": name, "namespace": spec.namespace, "labels": dict(spec.labels)}
    if kind == "ReplicaSet":
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": "Deployment",
                "name": spec.workload,
                "uid": f"owner-deployment-{spec.workload}",
            }
        ]
        return "replicasets", {"metadata": meta, "spec": {"replicas": 1}}
    return "jobs", {"metadata": meta, "spec": {"backoffLimit": 0}}


def _claim_source(spec: PodSpec) -> tuple[str, Obj] | None:
    """The ResourceClaimTemplate a pod's claim is made from, or the ResourceClaim its
    workload's pods share; None for a pod of the device plugin."""
    if spec.claim is None:
        return None
    return claim_source(
        spec.namespace,
        spec.workload,
        spec.labels,
        resource=spec.resource,
        count=spec.count,
        shared=spec.shared_claim,
    )


def claim_source(
    namespace: str,
    workload: str,
    labels: Mapping[str, str],
    *,
    resource: str,
    count: int,
    shared: bool,
) -> tuple[str, Obj]:
    """The claim object of a workload's pods, `<workload>-gpus`: `count` devices of the
    NVIDIA DRA driver's class (gpu.nvidia.com, or mig.nvidia.com for a MIG resource)."""
    mig = "/mig-" in resource
    request = {
        "name": "gpus",
        "exactly": {
            "deviceClassName": "mig.nvidia.com" if mig else "gpu.nvidia.com",
            "count": max(count, 1),
        },
    }
    devices = {"devices": {"requests": [request]}}
    meta = {"name": f"{workload}-gpus", "namespace": namespace, "labels": dict(labels)}
    if shared:
        return "resourceclaims", {"metadata": meta, "spec": devices}
    return "resourceclaimtemplates", {"metadata": meta, "spec": {"spec": devices}}


class ApiWriter(Protocol):
    """What the mirror writes to: `FakeApiServer` or `LiveApiServer`. Each returns the
    object as stored."""

    def create(self, resource: str, obj: Obj) -> Obj: ...

    def update(self, resource: str, obj: Obj) -> Obj: ...

    def delete(self, resource: str, namespace: str | None, name: str) -> Obj: ...


class KubeMirror:
    """Writes the cluster's changes to the API server; `epoch` turns simulated seconds into
    epoch seconds."""

    def __init__(self, api: ApiWriter, epoch: float) -> None:
        self.api = api
        self.epoch = epoch
        self._pods: dict[str, Obj] = {}
        self._uids: dict[str, str] = {}
        self._controllers: set[tuple[str, str, str]] = set()
        self._workloads: dict[str, Obj] = {}
        self._no_kueue = False

    def uid_of(self, uid: str) -> str:
        """The uid the API server gave the pod the simulation calls `uid`: the same on the
        in-process server, the server's own on a real one (which picks every uid)."""
        return self._uids.get(uid, uid)

    def create_nodes(self, nodes: Iterable[NodeLayout]) -> None:
        """Every node, Ready since `NODE_AGE_S` before the epoch, and the ResourceSlice
        the DRA driver publishes for each DRA node (its GPUs: the watcher counts them into
        the node's capacity)."""
        for node in nodes:
            self.api.create("nodes", node_object(node, self.epoch - NODE_AGE_S))
            if node.dra:
                self.api.create("resourceslices", resource_slice(node))

    def apply(self, change: Change) -> None:
        """One pod or Kueue workload change as the API update that shows it; process
        changes are not the API's."""
        if isinstance(change, PodCreated):
            self._create(change.spec)
            return
        if isinstance(
            change, WorkloadCreated | WorkloadPending | WorkloadAdmitted | WorkloadFinished
        ):
            self._workload(change)
            return
        pod = self._pods.get(change.uid)
        if pod is None:
            return  # a process change, or a pod this mirror never saw
        at = self.epoch + change.at
        if isinstance(change, PodUnschedulable):
            new = m.unschedulable(pod, at, change.message)
        elif isinstance(change, PodBound):
            new = m.pulling(m.bound(pod, change.node, at), at)
        elif isinstance(change, ContainerStarted):
            new = m.running(pod, at)
        elif isinstance(change, ContainerCrashed):
            new = m.crash_looping(pod, at, exit_code=change.exit_code, reason=change.reason)
            _backoff_message(new, pod, change.backoff_s)
        elif isinstance(change, PodFinished):
            if change.phase == "Succeeded":
                new = m.succeeded(pod, at)
            else:
                new = m.failed(pod, at, reason=change.reason, exit_code=change.exit_code)
        elif isinstance(change, PodDeleted):
            meta = pod["metadata"]
            self.api.delete("pods", meta["namespace"], meta["name"])
            del self._pods[change.uid]
            self._uids.pop(change.uid, None)
            return
        else:
            return
        self._pods[change.uid] = self.api.update("pods", new)

    def _workload(
        self, change: WorkloadCreated | WorkloadPending | WorkloadAdmitted | WorkloadFinished
    ) -> None:
        """Kueue's side: the suspended Job and its Workload, then the Workload's status.
        Where the server does not serve Workloads (Kueue's CRD not installed), said once."""
        at = self.epoch + change.at
        if isinstance(change, WorkloadCreated):
            job = change.job
            if job.claims:  # the template its pods' claims are made from, as the user wrote it
                resource, count = next(iter(job.gpus_per_pod.items()))
                kind, template = claim_source(
                    job.namespace,
                    job.workload,
                    job.labels,
                    resource=resource,
                    count=count,
                    shared=False,
                )
                self._controllers.add((kind, job.namespace, template["metadata"]["name"]))
                self.api.create(kind, template)
            key = ("jobs", job.namespace, job.workload)
            if key not in self._controllers:
                self._controllers.add(key)
                meta = {"name": job.workload, "namespace": job.namespace,
                        "labels": dict(job.labels), "creationTimestamp": rfc3339(at)}  # fmt: skip
                self.api.create("jobs", {"metadata": meta, "spec": {"backoffLimit": 0,
                                                                    "suspend": True}})  # fmt: skip
            obj = kueue.workload(
                job.name,
                job.namespace,
                created=at,
                queue=job.queue,
                job=(job.workload, job.job_uid),
                pods=job.pods,
                gpus_per_pod=job.gpus_per_pod,
                labels=job.labels,
                priority_class=job.priority_class,
                claim_template=f"{job.workload}-gpus" if job.claims else None,
            )
            self._write_workload(job.uid, obj, create=True)
            return
        current = self._workloads.get(change.uid)
        if current is None:
            return
        if isinstance(change, WorkloadPending):
            new = kueue.pending(current, at, change.message)
        elif isinstance(change, WorkloadAdmitted):
            new = kueue.admitted(current, at, change.cluster_queue)
        else:
            new = kueue.finished(current, at, succeeded=change.succeeded)
        self._write_workload(change.uid, new, create=False)

    def _write_workload(self, uid: str, obj: Obj, *, create: bool) -> None:
        if self._no_kueue:
            return
        try:
            stored = (
                self.api.create("workloads", obj) if create else self.api.update("workloads", obj)
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
            log.warning("the API server serves no Kueue Workloads (its CRD not installed): "
                        "the simulated Kueue's workloads are not written")  # fmt: skip
            self._no_kueue = True
            return
        self._workloads[uid] = stored

    def _create(self, spec: PodSpec) -> None:
        claim = _claim_source(spec)
        if claim is not None:
            resource, obj = claim
            key = (resource, spec.namespace, obj["metadata"]["name"])
            if key not in self._controllers:
                self._controllers.add(key)
                self.api.create(resource, obj)
        controller = _controller(spec)
        if controller is not None:
            resource, obj = controller
            key = (resource, spec.namespace, obj["metadata"]["name"])
            if key not in self._controllers:
                self._controllers.add(key)
                obj["metadata"]["creationTimestamp"] = rfc3339(self.epoch + spec.created_s)
                self.api.create(resource, obj)
        created = self.api.create("pods", pod_object(spec, self.epoch))
        self._pods[spec.uid] = created
        self._uids[spec.uid] = str(created["metadata"].get("uid") or spec.uid)


def _backoff_message(pod: Obj, before: Obj, backoff_s: float) -> None:
    """The kubelet's message names the back-off in force, 10 s doubling to 5 minutes."""
    name = before["metadata"]["name"]
    namespace = before["metadata"]["namespace"]
    uid = before["metadata"]["uid"]
    for status in pod["status"]["containerStatuses"]:
        waiting = copy.deepcopy(status["state"].get("waiting") or {})
        if waiting.get("reason") == "CrashLoopBackOff":
            waiting["message"] = (
                f"back-off {_duration(backoff_s)} restarting failed "
                f"container={status['name']} pod={name}_{namespace}({uid})"
            )
            status["state"] = {"waiting": waiting}


def _duration(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60}s" if whole >= 60 else f"{whole}s"
