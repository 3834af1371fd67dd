"""The real Kubernetes API server of the local stack (`gpuwatch stack up --kube`), driven
as the in-process test API server is: create, update, delete, compact, count watches.

Where the test server stores whatever it is given, the real one has its own rules, and
`LiveApiServer` goes through them as the cluster's own components would: an object is
created without its status, which is then written through the status subresource (as
the kubelet and the node controller do); a pod is bound through the binding subresource
(the scheduler's way); `metadata.deletionTimestamp` comes from a delete with a grace
period (no kubelet ever confirms it); other deletes have a grace period of 0. The server
sets uids, creation times and resource versions itself.

Compaction is etcd's own, through its JSON gateway. A server with the watch cache (the
stack's, as every cluster runs) serves watches from memory and never shows a client a
compacted version; `UncachedApiServer` runs a second kube-apiserver over the same etcd
with the cache off, where a watch from a compacted version is a real 410 Gone.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.dynamic import DynamicClient
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.stack import kube, manager
from gpuwatch.stack.service import StackPaths
from producers.k8s.client import KubernetesApi
from producers.simulate.kube.apiserver import RESOURCES
from schemas.settings import Settings

Obj = dict[str, Any]

# Every namespace a test may use; they are created once (nothing deletes a namespace:
# without a controller manager its deletion never finishes).
NAMESPACES = ("default", "ml", "web", "research", "serving", "gpuwatch")
_SYSTEM = {"creationTimestamp", "uid", "resourceVersion", "managedFields", "generation"}
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def stack_up(settings: Settings) -> kube.KubeCredentials:
    """The stack with its API server up (started, and built once, when it is not)."""
    manager.up(settings, kube=True)
    return kube.KubeCredentials.of(
        StackPaths.of(settings.stack.state_dir).service_dir("kube-apiserver")
    )


class LiveApiServer:
    """A real API server, written to as the admin, with the test server's methods."""

    def __init__(self, url: str, kubeconfig: Path, etcd_url: str) -> None:
        self.url = url
        self.kubeconfig = kubeconfig
        self.etcd_url = etcd_url
        configuration = kube_client.Configuration()
        kube_config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        configuration.host = url
        self._api = kube_client.ApiClient(configuration)
        self._namespaces: set[str] = set()
        self._metrics = ""
        self._metrics_at = -1.0
        self._baseline: dict[str | None, int] = {}

    def close(self) -> None:
        self._api.close()

    def client(self) -> KubernetesApi:
        """The watcher's client of this server, as the admin."""
        return KubernetesApi(kube_client.ApiClient(self._api.configuration))

    def client_as(self, token: str) -> KubernetesApi:
        """The watcher's client of this server, as whoever `token` names."""
        configuration = copy.deepcopy(self._api.configuration)
        configuration.api_key = {"BearerToken": f"Bearer {token}"}
        configuration.api_key_prefix = {}
        return KubernetesApi(kube_client.ApiClient(configuration))

    def apply(self, document: Obj, *, dry_run: bool = False) -> Obj:
        """Server-side apply of any object (its kind found by discovery), as
        `kubectl apply --server-side [--dry-run=server]` does; the answer."""
        dynamic = DynamicClient(self._api)
        resource = dynamic.resources.get(api_version=document["apiVersion"], kind=document["kind"])
        meta = document["metadata"]
        namespace = meta.get("namespace") or ("default" if resource.namespaced else None)
        if namespace is not None:
            self._namespace(namespace)
        applied = dynamic.server_side_apply(
            resource,
            body=document,
            name=meta["name"],
            namespace=namespace,
            field_manager="gpuwatch-tests",
            force_conflicts=True,
            dry_run="All" if dry_run else None,
        )
        found: Obj = applied.to_dict()
        return found

    def service_account_token(self, namespace: str, name: str) -> str:
        """A token of the service account from the TokenRequest API (10 minutes)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        answer: Obj = self.request("POST", path, body)
        return str(answer["status"]["token"])

    # ---- requests --------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        token: str | None = None,
    ) -> Any:
        """One request (as the admin, or as whoever `token` names); the decoded answer. An
        ApiException for an HTTP error."""
        auth = {"Authorization": f"Bearer {token}"} if token else self._auth()
        headers = {"Content-Type": content_type, "Accept": "application/json", **auth}
        data = self._call(method, path, headers, body)
        return json.loads(data) if data else None

    def _call(self, method: str, path: str, headers: dict[str, str], body: Any = None) -> bytes:
        response = self._api.rest_client.request(method, self.url + path, headers, body)
        data: bytes = response.read()
        if response.status >= 400:
            error = kube_client.ApiException(status=response.status, reason=response.reason)
            error.body = data.decode(errors="replace")
            raise error
        return data

    def _auth(self) -> dict[str, str]:
        settings = self._api.configuration.auth_settings().values()
        return {a["key"]: a["value"] for a in settings if a["in"] == "header" and a["value"]}

    def _path(self, resource: str, namespace: str | None, name: str | None = None) -> str:
        kind = RESOURCES[resource]
        where = f"/namespaces/{namespace or 'default'}" if kind.namespaced else ""
        return f"{kind.prefix}{where}/{resource}" + (f"/{name}" if name else "")

    # ---- the test server's methods -----------------------------------------------------

    def create(self, resource: str, obj: Obj) -> Obj:
        """Create the object, then write its status (a kubelet's or a controller's)."""
        kind = RESOURCES[resource]
        body = json.loads(json.dumps(obj))
        meta = body.setdefault("metadata", {})
        namespace = meta.get("namespace") or "default" if kind.namespaced else None
        if namespace is not None:
            meta["namespace"] = namespace
            self._namespace(namespace)
        for field in _SYSTEM:
            meta.pop(field, None)
        body["kind"], body["apiVersion"] = kind.kind, kind.api_version
        status = body.pop("status", None)
        _complete(resource, body)
        node = body.get("spec", {}).pop("nodeName", None) if resource == "pods" else None
        created: Obj = self.request("POST", self._path(resource, namespace), body)
        if node:
            created = self._bind(created, node)
        if status and _written(created.get("status") or {}) != _written(status):
            created = self._write_status(resource, created, status)
        return created

    def update(self, resource: str, obj: Obj) -> Obj:
        """Bring the stored object to `obj`: labels, spec, binding, status, deletion."""
        meta = obj["metadata"]
        namespace = meta.get("namespace")
        current = self.get(resource, namespace, meta["name"])
        if current is None:
            raise KeyError(f"{resource} {namespace}/{meta['name']} not found")
        if resource == "pods":
            node = obj.get("spec", {}).get("nodeName")
            if node and not current["spec"].get("nodeName"):
                current = self._bind(current, node)
        elif obj.get("spec") != current.get("spec"):
            current["spec"] = obj.get("spec")
            current = self.request("PUT", self._path(resource, namespace, meta["name"]), current)
        labels = meta.get("labels") or {}
        if labels != (current["metadata"].get("labels") or {}):
            current["metadata"]["labels"] = labels
            current = self.request("PUT", self._path(resource, namespace, meta["name"]), current)
        if obj.get("status") and obj["status"] != current.get("status"):
            current = self._write_status(resource, current, obj["status"])
        grace = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and not current["metadata"].get("deletionTimestamp"):
            self.request(
                "DELETE",
                self._path(resource, namespace, meta["name"]),
                {"gracePeriodSeconds": int(grace or 30)},
            )
            current = self.get(resource, namespace, meta["name"]) or current
        return current

    def modify(
        self, resource: str, namespace: str | None, name: str, change: Callable[[Obj], None]
    ) -> Obj:
        """Update an object by applying `change` to a copy of it."""
        current = self.get(resource, namespace, name)
        if current is None:
            raise KeyError(f"{resource} {namespace}/{name} not found")
        change(current)
        return self.update(resource, current)

    def delete(self, resource: str, namespace: str | None, name: str) -> Obj:
        """Delete at once (grace period 0): gone, with a DELETED event."""
        # Background: the default of a Job would add the orphan finalizer, which only the
        # garbage collector (not running here) removes.
        options = {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
        found: Obj = self.request("DELETE", self._path(resource, namespace, name), options)
        return found

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        try:
            found: Obj = self.request("GET", self._path(resource, namespace, name))
        except kube_client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion: a consistent list's."""
        listed = self.request("GET", "/api/v1/namespaces/default/pods?limit=1")
        return str(listed["metadata"]["resourceVersion"])

    def compact(self) -> int:
        """etcd's history compacted up to its current revision; the revision."""
        revision = int(self._etcd("/v3/kv/range", {"key": _b64("/")})["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def open_watches(self, resource: str | None = None) -> int:
        """Watches being served now to others than the server itself (its own informers
        watch some resources over loopback), from apiserver_longrunning_requests."""
        return max(0, self._watches(resource) - self._baseline.get(resource, 0))

    def _watches(self, resource: str | None) -> int:
        now = time.monotonic()
        if now - self._metrics_at > 0.2:  # the exposition is over a megabyte
            self._metrics = self.request_text("/metrics")
            self._metrics_at = now
        text = self._metrics
        total = 0.0
        for family in text_string_to_metric_families(text):
            if family.name != "apiserver_longrunning_requests":
                continue
            for sample in family.samples:
                labels = sample.labels
                if labels.get("verb") == "WATCH" and resource in (None, labels.get("resource")):
                    total += sample.value
        return int(total)

    def request_text(self, path: str) -> str:
        return self._call("GET", path, self._auth()).decode()

    def reset(self) -> None:
        """Delete every pod, node, ReplicaSet and Job (namespaces stay)."""
        for namespace in NAMESPACES:
            self._namespace(namespace)
        for resource in ("pods", "replicasets", "jobs", "nodes"):
            kind = RESOURCES[resource]
            listed = self.request("GET", f"{kind.prefix}/{resource}")
            for item in listed["items"]:
                meta = item["metadata"]
                with contextlib.suppress(kube_client.ApiException):
                    self.delete(resource, meta.get("namespace"), meta["name"])
        self._metrics_at = -1.0
        self._baseline = {r: self._watches(r) for r in (None, "pods", "nodes")}

    # ---- the cluster's components' ways ---------------------------------------------

    def _bind(self, pod: Obj, node: str) -> Obj:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.request(
            "POST", self._path("pods", meta["namespace"], meta["name"]) + "/binding", binding
        )
        bound = self.get("pods", meta["namespace"], meta["name"])
        assert bound is not None
        return bound

    def _write_status(self, resource: str, current: Obj, status: Obj) -> Obj:
        meta = current["metadata"]
        # The server works out a pod's QoS class at creation; it cannot change.
        status = {k: v for k, v in status.items() if k != "qosClass"}
        if "qosClass" in current.get("status", {}):
            status["qosClass"] = current["status"]["qosClass"]
        body = dict(current, status=status)
        path = self._path(resource, meta.get("namespace"), meta["name"]) + "/status"
        written: Obj = self.request("PUT", path, body)
        return written

    def _namespace(self, name: str) -> None:
        if name in self._namespaces:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        try:
            self.request("POST", "/api/v1/namespaces", body)
        except kube_client.ApiException as exc:
            if exc.status != 409:
                raise
        self._namespaces.add(name)

    def _etcd(self, path: str, body: Obj) -> Any:
        request = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with _NO_PROXY.open(request, timeout=10) as response:
            return json.loads(response.read())


def _complete(resource: str, body: Obj) -> None:
    """What a real server requires that the test server's objects may leave out: a
    container's image, a ReplicaSet's selector and template, a Job's template."""
    if resource == "pods":
        for container in body.get("spec", {}).get("containers", []):
            container.setdefault("image", "busybox")
        return
    if resource not in ("replicasets", "jobs"):
        return
    spec = body.setdefault("spec", {})
    labels = {"gpuwatch-test": body["metadata"]["name"]}
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


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class UncachedApiServer:
    """A second kube-apiserver over the stack's etcd, with the watch cache off and its
    objects under a prefix of its own: a watch from a compacted resourceVersion is
    etcd's 410 Gone, as a server behind the watch cache's window would answer."""

    def __init__(self, settings: Settings, credentials: kube.KubeCredentials, workdir: Path):
        self.settings = settings
        self.credentials = credentials
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LiveApiServer:
        c = self.credentials
        binary = self.settings.stack.kube_apiserver or kube.cached_binary(
            self.settings.stack.cache_dir.expanduser().resolve()
        )
        own = kube.KubeCredentials.of(self.workdir)
        own.home.mkdir(parents=True, exist_ok=True)
        extra = (f"--etcd-prefix=/gpuwatch-uncached-{secrets.token_hex(4)}", "--watch-cache=false")
        command = kube.command(
            binary,
            etcd=kube.etcd_url(self.settings),
            port=self.port,
            credentials=self.credentials,
            cert_dir=own.cert_dir,
            extra=extra,
        )
        log = (self.workdir / "kube-apiserver.log").open("wb")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        own.tokens = c.tokens
        deadline = time.monotonic() + 60
        while not own.ready(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / "kube-apiserver.log").read_text(errors="replace")[-3000:]
                self.__exit__()
                raise RuntimeError(f"the uncached kube-apiserver did not start:\n{tail}")
            time.sleep(0.2)
        own.write_kubeconfig(self.port)
        self.server = LiveApiServer(
            f"https://127.0.0.1:{self.port}", own.kubeconfig, kube.etcd_url(self.settings)
        )
        return self.server

    def __exit__(self, *_exc: object) -> None:
        if hasattr(self, "server"):
            self.server.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def live(settings: Settings) -> Iterator[LiveApiServer]:
    """The stack's API server, emptied of pods, nodes, ReplicaSets and Jobs."""
    credentials = stack_up(settings)
    server = LiveApiServer(
        f"https://127.0.0.1:{settings.stack.kube_port}",
        credentials.kubeconfig,
        kube.etcd_url(settings),
    )
    try:
        server.reset()
        yield server
    finally:
        server.close()


PROMETHEUS_OPERATOR = "v0.85.0"  # a release of github.com/prometheus-operator/prometheus-operator
MONITORING_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


def monitoring_crds(settings: Settings) -> list[Path]:
    """The Prometheus Operator's CRDs of the objects the chart renders (ServiceMonitor,
    PodMonitor, PrometheusRule), from the operator's Go module (example/prometheus-
    operator-crd), fetched once from the Go module proxy into the cache directory."""
    cache = settings.stack.cache_dir.expanduser().resolve()
    home = cache / "crds" / "prometheus-operator" / PROMETHEUS_OPERATOR
    files = [home / f"monitoring.coreos.com_{name}.yaml" for name in MONITORING_CRDS]
    if all(f.exists() for f in files):
        return files
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuwatch-crds-") as scratch:
        env = os.environ | {"GOMODCACHE": f"{scratch}/mod", "GOFLAGS": "-mod=mod"}
        module = f"github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR}"
        done = subprocess.run(
            [shutil.which("go") or "/usr/local/go/bin/go", "mod", "download", "-json", module],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        source = Path(json.loads(done.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
        for f in files:
            shutil.copyfile(source / f.name, f)
        subprocess.run(["chmod", "-R", "u+w", scratch], check=False)
    return files
