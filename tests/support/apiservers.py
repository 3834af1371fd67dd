"""The real Kubernetes API server of the local stack (`gpuwatch stack up --kube`), driven
as the in-process test API server is: create, update, delete, compact, count watches.

The writing is the product's (`gpuwatch.harness.simulate.kube.live.LiveApiServer`: statuses
through the status subresource, pods bound through the binding subresource, deletes with
a grace period of 0); what only tests do is added here.

Compaction is etcd's own, through its JSON gateway. A server with the watch cache (the
stack's, as every cluster runs) serves watches from memory and never shows a client a
compacted version; `UncachedApiServer` runs a second kube-apiserver over the same etcd
with the cache off, where a watch from a compacted version is a real 410 Gone.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.dynamic import DynamicClient
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.harness.simulate.kube.live import LiveApiServer as ApiServerWriter
from gpuwatch.harness.simulate.kube.store import RESOURCES
from gpuwatch.harness.stack import kube, manager
from producers.base.kubeapi import ApiError
from producers.k8s.client import KubernetesApi
from schemas.settings import Settings

Obj = dict[str, Any]

# Every namespace a test may use; they are created once (nothing deletes a namespace:
# without a controller manager its deletion never finishes).
NAMESPACES = ("default", "ml", "web", "research", "serving", "gpuwatch")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def stack_up(settings: Settings) -> kube.KubeCredentials:
    """The stack with its API server up (started, and built once, when it is not)."""
    manager.up(settings, kube=True)
    return kube.credentials(settings)


class LiveApiServer(ApiServerWriter):
    """The product's writer of a real API server, with what only tests do: compact etcd,
    count watches, empty the server, apply any object, act as a service account."""

    def __init__(self, url: str, kubeconfig: Path, etcd_url: str) -> None:
        super().__init__(url, kubeconfig)
        self.etcd_url = etcd_url
        self._metrics = ""
        self._metrics_at = -1.0
        self._baseline: dict[str | None, int] = {}
        self._dynamic: DynamicClient | None = None

    def client_as(self, token: str) -> KubernetesApi:
        """The watcher's client of this server, as whoever `token` names."""
        return self._kube.another(token=token)

    def apply(self, document: Obj, *, dry_run: bool = False) -> Obj:
        """Server-side apply of any object (its kind found by discovery), as
        `kubectl apply --server-side [--dry-run=server]` does; the answer."""
        dynamic = self._dynamic_client()
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

    def _dynamic_client(self) -> DynamicClient:
        if self._dynamic is None:
            configuration = kube_client.Configuration()
            kube_config.load_kube_config(
                config_file=str(self.kubeconfig), client_configuration=configuration
            )
            configuration.host = self.url
            self._dynamic = DynamicClient(kube_client.ApiClient(configuration))
        return self._dynamic

    def close(self) -> None:
        if self._dynamic is not None:
            self._dynamic.client.close()
        super().close()

    def install_kueue(self, settings: Settings, timeout_s: float = 30.0) -> None:
        """Kueue's Workload CRD (`kueue_crds`), served: it stays installed (idempotent)."""
        for path in kueue_crds(settings):
            self.apply(yaml.safe_load(path.read_text("utf-8")))
        deadline = time.monotonic() + timeout_s
        while True:
            try:  # a CRD serves moments after it is discovered
                self.request("GET", "/apis/kueue.x-k8s.io/v1beta2/workloads?limit=1")
                return
            except ApiError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

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
        ApiError for an HTTP error."""
        data = self._kube.call(method, path, body, content_type=content_type, token=token)
        return json.loads(data) if data else None

    def request_text(self, path: str) -> str:
        return self._kube.call("GET", path).decode()

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

    def reset(self) -> None:
        """Delete every pod, node, ReplicaSet and Job (namespaces stay)."""
        for namespace in NAMESPACES:
            self._namespace(namespace)
        for resource in ("pods", "replicasets", "jobs", "nodes"):
            kind = RESOURCES[resource]
            listed = self.request("GET", f"{kind.prefix}/{resource}")
            for item in listed["items"]:
                meta = item["metadata"]
                with contextlib.suppress(ApiError):
                    self.delete(resource, meta.get("namespace"), meta["name"])
        self._metrics_at = -1.0
        self._baseline = {r: self._watches(r) for r in (None, "pods", "nodes")}

    def _etcd(self, path: str, body: Obj) -> Any:
        request = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with _NO_PROXY.open(request, timeout=10) as response:
            return json.loads(response.read())


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
        own = kube.KubeCredentials(self.workdir)
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


KUEUE = "v0.17.0"  # a release of sigs.k8s.io/kueue


def kueue_crds(settings: Settings) -> list[Path]:
    """Kueue's Workload CRD (config/components/crd/bases of its Go module: v1beta2 stored,
    v1beta1 served), fetched once from the Go module proxy into the cache directory."""
    return _module_files(
        settings,
        f"sigs.k8s.io/kueue@{KUEUE}",
        "config/components/crd/bases",
        ["kueue.x-k8s.io_workloads.yaml"],
        "kueue",
    )


PROMETHEUS_OPERATOR = "v0.85.0"  # a release of github.com/prometheus-operator/prometheus-operator
MONITORING_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


def monitoring_crds(settings: Settings) -> list[Path]:
    """The Prometheus Operator's CRDs of the objects the chart renders (ServiceMonitor,
    PodMonitor, PrometheusRule), from the operator's Go module (example/prometheus-
    operator-crd), fetched once from the Go module proxy into the cache directory."""
    return _module_files(
        settings,
        f"github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR}",
        "example/prometheus-operator-crd",
        [f"monitoring.coreos.com_{name}.yaml" for name in MONITORING_CRDS],
        "prometheus-operator",
    )


def _module_files(
    settings: Settings, module: str, folder: str, names: list[str], cached_as: str
) -> list[Path]:
    """Files of a Go module's folder, fetched once with `go mod download` into the cache
    directory (crds/<cached_as>/<version>)."""
    cache = settings.stack.cache_dir.expanduser().resolve()
    home = cache / "crds" / cached_as / module.rsplit("@", 1)[1]
    files = [home / name for name in names]
    if all(f.exists() for f in files):
        return files
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuwatch-crds-") as scratch:
        env = os.environ | {"GOMODCACHE": f"{scratch}/mod", "GOFLAGS": "-mod=mod"}
        done = subprocess.run(
            [shutil.which("go") or "/usr/local/go/bin/go", "mod", "download", "-json", module],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        source = Path(json.loads(done.stdout)["Dir"]) / folder
        for f in files:
            shutil.copyfile(source / f.name, f)
        subprocess.run(["chmod", "-R", "u+w", scratch], check=False)
    return files
