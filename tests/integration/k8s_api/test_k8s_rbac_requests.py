"""Every request the watcher makes of the test API server is one its RBAC grants."""

from __future__ import annotations

import time
from typing import Any

from support.kube import granted

from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from producers.k8s.client import KubernetesApi
from producers.k8s.watcher import K8sWatcher
from schemas.settings import WatcherSettings


def test_every_request_the_watcher_makes_is_granted(wait: Any) -> None:
    groups = {
        "/api/v1": "",
        "/apis/apps/v1": "apps",
        "/apis/batch/v1": "batch",
        "/apis/kueue.x-k8s.io/v1beta2": "kueue.x-k8s.io",
        "/apis/resource.k8s.io/v1": "resource.k8s.io",
    }
    with FakeApiServer(bookmark_interval_s=0.1) as server:
        server.create(
            "pods", m.gpu_pod("w", "ml", created=time.time(), owner=("ReplicaSet", "web-1"))
        )
        server.create("pods", m.gpu_pod("j", "ml", created=time.time(), owner=("Job", "train")))
        api = KubernetesApi.for_host(server.url)
        watcher = K8sWatcher(
            api,
            WatcherSettings(namespaces=("ml",)),
            emit_pod=lambda _: None,
            emit_node=lambda _: None,
            emit_workload=lambda _: None,
        )
        watcher.start()
        try:
            wait(lambda: watcher.synced and server.open_watches() == 4, "the watches")
        finally:
            watcher.stop()
            api.close()
    used = set()
    # Discovery (/apis/kueue.x-k8s.io: is Kueue there? /apis/resource.k8s.io: DRA?) is
    # every user's (system:discovery). ResourceSlices are checked against the real
    # authorizer too (test_k8s_dra_capacity.py).
    discovery = {"/apis/kueue.x-k8s.io", "/apis/resource.k8s.io"}
    for request in [r for r in server.requests if r.path not in discovery]:
        prefix = next(p for p in groups if request.path.startswith(p + "/"))
        parts = request.path[len(prefix) + 1 :].split("/")
        if parts[0] == "namespaces":
            parts = parts[2:]
        verb = "watch" if request.watch else ("get" if len(parts) > 1 else "list")
        used.add((groups[prefix], parts[0], verb))
    assert used == {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("apps", "replicasets", "get"),
        ("batch", "jobs", "get"),
        ("kueue.x-k8s.io", "workloads", "list"),
        ("kueue.x-k8s.io", "workloads", "watch"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
    }
    assert used <= granted()
