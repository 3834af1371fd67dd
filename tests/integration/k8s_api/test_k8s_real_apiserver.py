"""The watcher against the real kube-apiserver 1.34 of the local stack, where the test API
server cannot stand in: etcd's own compaction and the 410 Gone it brings, a pod's life as
the scheduler and the kubelet write it, and the watcher's RBAC (deploy/rbac) enforced by
the real authorizer with a real service-account token."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from typing import Any

import pytest
import yaml
from support.apiservers import LiveApiServer
from support.kube import RBAC, controlled

from gpuwatch.harness.simulate.kube import manifests as m
from producers.base.kubeapi import ApiError, Collection, Expired
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import Backoff
from schemas import K8sPod
from schemas.settings import WatcherSettings

FAST = Backoff(base_s=0.01, cap_s=0.05, rng=random.Random(7))


class Pods:
    """The pods the watcher published, from its threads."""

    def __init__(self) -> None:
        self.seen: list[K8sPod] = []
        self._lock = threading.Lock()

    def __call__(self, value: K8sPod) -> None:
        with self._lock:
            self.seen.append(value)

    def of(self, name: str) -> list[tuple[str, str]]:
        with self._lock:
            return [(p.type, p.phase) for p in self.seen if p.name == name]


def watcher_on(api: Any, pods: Pods, **settings: Any) -> K8sWatcher:
    timeout = settings.pop("watch_timeout_s", 30)
    return K8sWatcher(
        api,
        WatcherSettings(**settings),
        emit_pod=pods,
        emit_node=lambda _: None,
        watch_timeout_s=timeout,
        backoff=FAST,
    )


def test_a_watch_from_a_compacted_version_is_410_gone(uncached: LiveApiServer) -> None:
    api = uncached.client()
    try:
        version = json.loads(api.list(Collection("pods", "ml"), limit=0, continue_token=None))[
            "metadata"
        ]["resourceVersion"]
        # A watch from a version resumes at the next revision: compact past that one.
        uncached.create("pods", m.gpu_pod("p", "ml", created=time.time()))
        uncached.create("pods", m.gpu_pod("q", "ml", created=time.time()))
        uncached.compact()
        lines = api.watch(Collection("pods", "ml"), resource_version=version, timeout_s=5)
        try:
            first = json.loads(next(iter(lines)))
        finally:
            lines.close()
        # As the first event of the stream (HTTP 200), as Kubernetes sends it.
        assert first["type"] == "ERROR"
        assert (first["object"]["code"], first["object"]["reason"]) == (410, "Expired")
        assert "too old" in first["object"]["message"]
    finally:
        api.close()


def test_a_continue_token_from_before_a_compaction_is_410_gone(uncached: LiveApiServer) -> None:
    for i in range(5):
        uncached.create("pods", m.gpu_pod(f"p{i}", "ml", created=time.time()))
    api = uncached.client()
    try:
        first = json.loads(api.list(Collection("pods", "ml"), limit=2, continue_token=None))
        token = first["metadata"]["continue"]
        uncached.create("pods", m.gpu_pod("later", "web", created=time.time()))
        uncached.compact()
        with pytest.raises(Expired, match="continue parameter is too old"):
            api.list(Collection("pods", "ml"), limit=2, continue_token=token)
    finally:
        api.close()


def test_the_watcher_relists_after_a_real_410_and_goes_on(
    uncached: LiveApiServer, wait: Any
) -> None:
    """The watch of namespace ml sees none of web's changes, and a server without the watch
    cache sends no bookmarks: when it renews its watch after a compaction, the version it
    resumes from is gone."""
    uncached.create("pods", m.gpu_pod("a", "ml", created=time.time()))
    pods = Pods()
    api = uncached.client()
    watcher = watcher_on(api, pods, namespaces=("ml",), watch_timeout_s=1)
    watcher.start()
    try:
        wait(lambda: watcher.synced, "the first lists", timeout_s=20)
        watch = watcher.pod_watches[0]
        for name in ("elsewhere", "and-again"):
            uncached.create("pods", m.gpu_pod(name, "web", created=time.time()))
        uncached.compact()
        wait(lambda: watch.stats.relists.get("expired", 0) >= 1, "the relist", timeout_s=20)
        uncached.create("pods", m.gpu_pod("b", "ml", created=time.time()))
        wait(lambda: pods.of("b") == [("ADDED", "Pending")], "the next pod", timeout_s=20)
    finally:
        watcher.stop()
        api.close()
    assert pods.of("a")[0] == ("RESYNC", "Pending")
    assert set(pods.of("a")) == {("RESYNC", "Pending")}  # re-sent by the relist, unchanged
    assert pods.of("elsewhere") == []


def test_a_pods_life_as_the_scheduler_and_the_kubelet_write_it(
    real: LiveApiServer, wait: Any
) -> None:
    pods = Pods()
    api = real.client()
    watcher = watcher_on(api, pods)
    watcher.start()
    try:
        wait(lambda: watcher.synced, "the first lists", timeout_s=20)
        now = time.time()
        pod = real.create("pods", m.gpu_pod("p", "ml", created=now))
        wait(lambda: pods.of("p") == [("ADDED", "Pending")], "ADDED", timeout_s=20)
        real.update("pods", m.running(m.bound(pod, "n1", now + 1), now + 2))
        wait(lambda: ("MODIFIED", "Running") in pods.of("p"), "running", timeout_s=20)
        real.update("pods", m.succeeded(real.get("pods", "ml", "p") or {}, now + 3))
        real.delete("pods", "ml", "p")
        wait(lambda: pods.of("p")[-1][0] == "DELETED", "DELETED", timeout_s=20)
    finally:
        watcher.stop()
        api.close()
    phases = [phase for _, phase in pods.of("p")]
    assert phases[0] == "Pending"
    assert "Running" in phases
    assert pods.of("p")[-1] == ("DELETED", "Succeeded")
    # Each published message is a change of what it says: no two alike in a row.
    seen = [(p.type, p.phase, p.node) for p in pods.seen if p.name == "p"]
    assert all(a != b for a, b in itertools.pairwise(seen))
    assert [p.ts for p in pods.seen] == sorted(p.ts for p in pods.seen)


def test_the_watchers_rbac_is_enough_and_no_more(real: LiveApiServer, wait: Any) -> None:
    """deploy/rbac/k8s-watcher.yaml applied; the watcher runs with a token of its service
    account, enforced by the server's RBAC authorizer."""
    for document in yaml.safe_load_all(RBAC.read_text("utf-8")):
        real.apply(document)
    account = next(
        d for d in yaml.safe_load_all(RBAC.read_text("utf-8")) if d["kind"] == "ServiceAccount"
    )
    real.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": account["metadata"]})
    token = real.service_account_token(
        account["metadata"]["namespace"], account["metadata"]["name"]
    )
    real.create("replicasets", controlled("web-7d9c", ("apps/v1", "Deployment", "web"), "d1"))
    real.create("jobs", controlled("nightly-1", ("batch/v1", "CronJob", "nightly"), "c1"))
    real.create("pods", m.gpu_pod("w", "ml", created=time.time(), owner=("ReplicaSet", "web-7d9c")))
    real.create("pods", m.gpu_pod("n", "ml", created=time.time(), owner=("Job", "nightly-1")))
    pods = Pods()
    api = real.client_as(token)
    watcher = watcher_on(api, pods)
    watcher.start()
    try:
        wait(lambda: watcher.synced and len(pods.seen) == 2, "the first lists", timeout_s=20)
        owners = {p.name: (p.owner.kind, p.owner.name) for p in pods.seen if p.owner}
        assert owners == {"w": ("Deployment", "web"), "n": ("CronJob", "nightly")}
        assert watcher.owners.stats.lookups == 2
        assert all(not w.stats.api_errors for w in watcher.watches)
        # What the role does not grant is refused: another resource, another verb.
        for method, path in (
            ("GET", "/api/v1/services"),
            ("GET", "/api/v1/namespaces/ml/secrets"),
            ("DELETE", "/api/v1/namespaces/ml/pods/w"),
            ("PATCH", "/api/v1/nodes/n1"),
        ):
            with pytest.raises(ApiError) as denied:
                real.request(method, path, {}, token=token)
            assert denied.value.status == 403, (method, path)
    finally:
        watcher.stop()
        api.close()
        # Cluster-scoped: a later install of the chart must not find them.
        for path in (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gpuwatch-k8s-watcher",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpuwatch-k8s-watcher",
            "/api/v1/namespaces/gpuwatch/serviceaccounts/gpuwatch-k8s-watcher",
        ):
            real.request("DELETE", path)
