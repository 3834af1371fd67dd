"""A real Kubernetes API server written to as the in-process test server is: the simulated
cluster (`gpuwatch simulate --kube`) and the tests drive it with the same create, update,
modify, delete and get.

Where the test server stores whatever it is given, a real one has its own rules, and
`LiveApiServer` goes through them as the cluster's own components would: an object is
created without its status, which is then written through the status subresource (as
the kubelet and the node controller do); a pod is bound through the binding subresource
(the scheduler's way); `metadata.deletionTimestamp` comes from a delete with a grace
period (no kubelet ever confirms it); other deletes have a grace period of 0. What a
real server requires that the simulation leaves out (a container image, a ReplicaSet's
selector and template, a Job's template, the namespace, the PriorityClass a pod names)
is filled in or created.

The server sets uids, resource versions and creation times itself: an object's
`creationTimestamp` is the server's wall clock when it was written, whatever the
object says. No kubelet writes a time before a pod existed, so status times (a start, a
condition's transition) that would come before the server's creation time are written as
that time: a pod the scenario started an hour before the simulation began shows as
created and started when the simulation created it. Later times are written as given.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpuwatch.harness.simulate.kube.store import RESOURCES
from producers.base.kubeapi import ApiError
from producers.k8s.client import KubernetesApi, connect

__all__ = ["MANAGED_BY", "SIMULATOR_LABELS", "LiveApiServer", "not_before"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

MANAGED_BY = "app.kubernetes.io/managed-by"
SIMULATOR_LABELS: Mapping[str, str] = {MANAGED_BY: "gpuwatch-simulate"}
"""The labels of every object the simulator writes to a real server: how a later run
tells its own leftovers from anything else there."""
OWNED = (
    "pods", "workloads", "resourceclaims", "resourceclaimtemplates", "replicasets", "jobs",
    "resourceslices", "nodes",
)  # fmt: skip
"""What a writer with labels removes of an earlier run's (pods before their owners)."""

_SYSTEM = {"creationTimestamp", "uid", "resourceVersion", "managedFields", "generation"}
_TIMES = {
    "lastHeartbeatTime",
    "lastProbeTime",
    "lastTransitionTime",
    "lastUpdateTime",
    "startTime",
    "startedAt",
    "finishedAt",
}
"""The time fields of pod and node statuses (conditions, container states)."""


class LiveApiServer:
    """A real API server, written to as its admin: it plays the scheduler's and the
    kubelet's part against a real server (binding pods, writing their status).

    Every object it creates carries `labels` (none by default), and `remove_leftovers`
    deletes what carries them. `written` is the resourceVersion of its last write of each
    resource, which a watch of that resource has seen once its own version reaches it.
    """

    def __init__(
        self, url: str, kubeconfig: Path, *, labels: Mapping[str, str] | None = None
    ) -> None:
        """`kubeconfig`'s credentials, at `url`; K8sConfigError if it is unusable."""
        self.url = url
        self.kubeconfig = kubeconfig
        self.labels: dict[str, str] = dict(labels or {})
        self._kube = connect(kubeconfig, None, host=url)
        self._namespaces: set[str] = set()
        self._priority_classes: set[str] = set()
        self.written: dict[str, int] = {}
        """resource -> resourceVersion of the last create, update or delete of one."""

    def close(self) -> None:
        """Release the connection pool."""
        self._kube.close()

    def client(self) -> KubernetesApi:
        """The watcher's client of this server, as the admin (a pool of its own)."""
        return self._kube.another()

    # ---- requests --------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> Any:
        """One request as the admin; the decoded answer. ApiError for an HTTP error."""
        data = self._kube.call(method, path, body, content_type=content_type)
        return json.loads(data) if data else None

    def _path(self, resource: str, namespace: str | None, name: str | None = None) -> str:
        kind = RESOURCES[resource]
        where = f"/namespaces/{namespace or 'default'}" if kind.namespaced else ""
        return f"{kind.prefix}{where}/{resource}" + (f"/{name}" if name else "")

    # ---- the test server's methods -----------------------------------------------------

    def create(self, resource: str, obj: Obj) -> Obj:
        """Create the object, bind it (a pod with a node), then write its status."""
        kind = RESOURCES[resource]
        body = json.loads(json.dumps(obj))
        meta = body.setdefault("metadata", {})
        namespace = (meta.get("namespace") or "default") if kind.namespaced else None
        if namespace is not None:
            meta["namespace"] = namespace
            self._namespace(namespace)
        for field in _SYSTEM:
            meta.pop(field, None)
        meta["labels"] = {**(meta.get("labels") or {}), **self.labels}
        body["kind"], body["apiVersion"] = kind.kind, kind.api_version
        status = body.pop("status", None)
        _complete(resource, body)
        node = body["spec"].pop("nodeName", None) if resource == "pods" else None
        if resource == "pods" and body["spec"].get("priorityClassName"):
            self._priority_class(body["spec"]["priorityClassName"])
        created: Obj = self._wrote(
            resource, self.request("POST", self._path(resource, namespace), body)
        )
        if node:
            created = self._bind(created, node)
        if status and _written(created.get("status") or {}) != _written(status):
            created = self._write_status(resource, created, status)
        return created

    def update(self, resource: str, obj: Obj) -> Obj:
        """Bring the stored object to `obj`: labels, spec, binding, status, deletion."""
        meta = obj["metadata"]
        namespace = meta.get("namespace")
        current = self._found(resource, namespace, meta["name"])
        if resource == "pods":
            node = obj.get("spec", {}).get("nodeName")
            if node and not current["spec"].get("nodeName"):
                current = self._bind(current, node)
        elif obj.get("spec") != current.get("spec"):
            current["spec"] = obj.get("spec")
            current = self._put(resource, current)
        labels = {**(meta.get("labels") or {}), **self.labels}
        if labels != (current["metadata"].get("labels") or {}):
            current["metadata"]["labels"] = labels
            current = self._put(resource, current)
        if obj.get("status") and obj["status"] != current.get("status"):
            current = self._write_status(resource, current, obj["status"])
        grace = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and not current["metadata"].get("deletionTimestamp"):
            self._wrote(
                resource,
                self.request(
                    "DELETE",
                    self._path(resource, namespace, meta["name"]),
                    {"gracePeriodSeconds": int(grace or 30)},
                ),
            )
            current = self.get(resource, namespace, meta["name"]) or current
        return current

    def modify(
        self, resource: str, namespace: str | None, name: str, change: Callable[[Obj], None]
    ) -> Obj:
        """Update an object by applying `change` to a copy of it."""
        current = self._found(resource, namespace, name)
        change(current)
        return self.update(resource, current)

    def delete(self, resource: str, namespace: str | None, name: str) -> Obj:
        """Delete at once (grace period 0): gone, with a DELETED event."""
        # Background: the default of a Job would add the orphan finalizer, which only the
        # garbage collector (no controller manager runs here) would remove.
        options = {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
        found: Obj = self.request("DELETE", self._path(resource, namespace, name), options)
        return self._wrote(resource, found)

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """The stored object; None if there is none."""
        try:
            found: Obj = self.request("GET", self._path(resource, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion: a consistent list's."""
        listed = self.request("GET", "/api/v1/namespaces/default/pods?limit=1")
        return str(listed["metadata"]["resourceVersion"])

    def remove_leftovers(self) -> dict[str, int]:
        """Delete the pods, ReplicaSets, Jobs and nodes that carry this writer's labels (an
        earlier run's), and nothing else; how many of each. ValueError without labels."""
        if not self.labels:
            raise ValueError("a writer without labels cannot tell its leftovers from others")
        selector = quote(",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        removed: dict[str, int] = {}
        for resource in OWNED:
            kind = RESOURCES[resource]
            try:
                listed = self.request("GET", f"{kind.prefix}/{resource}?labelSelector={selector}")
            except ApiError as exc:
                if exc.status == 404 and resource == "workloads":
                    continue  # Kueue's CRD not installed: none to remove
                raise
            for item in listed["items"]:
                meta = item["metadata"]
                try:
                    self.delete(resource, meta.get("namespace"), meta["name"])
                except ApiError as exc:
                    if exc.status != 404:  # gone meanwhile
                        raise
                removed[resource] = removed.get(resource, 0) + 1
        return removed

    # ---- the cluster's components' ways ---------------------------------------------

    def _found(self, resource: str, namespace: str | None, name: str) -> Obj:
        current = self.get(resource, namespace, name)
        if current is None:
            raise ApiError(f"{resource} {namespace or ''}/{name} not found", 404)
        return current

    def _put(self, resource: str, current: Obj) -> Obj:
        meta = current["metadata"]
        path = self._path(resource, meta.get("namespace"), meta["name"])
        return self._wrote(resource, self.request("PUT", path, current))

    def _wrote(self, resource: str, obj: Obj) -> Obj:
        version = int(obj.get("metadata", {}).get("resourceVersion") or 0)
        self.written[resource] = max(self.written.get(resource, 0), version)
        return obj

    def _bind(self, pod: Obj, node: str) -> Obj:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = self._path("pods", meta["namespace"], meta["name"])
        self.request("POST", path + "/binding", binding)
        return self._wrote("pods", self._found("pods", meta["namespace"], meta["name"]))

    def _write_status(self, resource: str, current: Obj, status: Obj) -> Obj:
        meta = current["metadata"]
        # The server works out a pod's QoS class at creation; it cannot change.
        status = {k: v for k, v in status.items() if k != "qosClass"}
        if "qosClass" in current.get("status", {}):
            status["qosClass"] = current["status"]["qosClass"]
        created = meta.get("creationTimestamp")
        if created:
            status = not_before(status, _parse(created), created)
        body = dict(current, status=status)
        path = self._path(resource, meta.get("namespace"), meta["name"]) + "/status"
        return self._wrote(resource, self.request("PUT", path, body))

    def _namespace(self, name: str) -> None:
        """The namespace, created once (never deleted: without a controller manager its
        deletion would never finish)."""
        if name in self._namespaces:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self._create_once("/api/v1/namespaces", body)
        self._namespaces.add(name)

    def _priority_class(self, name: str) -> None:
        """The PriorityClass a pod names, which the server's admission requires to exist
        (value 0; left in place, as namespaces are)."""
        if name in self._priority_classes:
            return
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": dict(self.labels)},
            "value": 0,
        }
        self._create_once("/apis/scheduling.k8s.io/v1/priorityclasses", body)
        self._priority_classes.add(name)

    def _create_once(self, path: str, body: Obj) -> None:
        try:
            self.request("POST", path, body)
        except ApiError as exc:
            if exc.status != 409:  # already there
                raise


def not_before(status: Obj, earliest: datetime, stamp: str) -> Obj:
    """`status` with every time field before `earliest` written as `stamp` (its RFC 3339
    text), at any depth (conditions, container states)."""

    def early(key: str, value: Any) -> bool:
        return key in _TIMES and isinstance(value, str) and _parse(value) < earliest

    def fix(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: stamp if early(k, v) else fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    fixed: Obj = fix(status)
    return fixed


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _complete(resource: str, body: Obj) -> None:
    """What a real server requires that the test server's objects may leave out: a
    container's image, a ReplicaSet's selector and template, a Job's template."""
    spec = body.setdefault("spec", {})
    if resource == "pods":
        for container in spec.get("containers", []):
            container.setdefault("image", "busybox")
        return
    if resource not in ("replicasets", "jobs"):
        return
    labels = {"gpuwatch-simulate/controller": body["metadata"]["name"]}
    restart = "Always" if resource == "replicasets" else "Never"
    spec.setdefault(
        "template",
        {
            "metadata": {"labels": labels},
            "spec": {
                "restartPolicy": restart,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        },
    )
    if resource == "replicasets":
        spec.setdefault("selector", {"matchLabels": labels})
        spec.setdefault("replicas", 0)


def _written(status: Obj) -> Obj:
    """A status without what the server works out itself (a new pod's QoS class)."""
    return {k: v for k, v in status.items() if k != "qosClass"}
