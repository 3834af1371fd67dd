"""The watcher through the real `kubernetes` client against the test API server: list,
watch, bookmarks, timeouts, dropped connections, 410 Gone, API errors."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.fake_apiserver import FakeApiServer
from support.kube import controlled

from gpuwatch.harness.simulate.kube import manifests as m
from producers.k8s.client import KubernetesApi
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import Backoff
from schemas import K8sNode, K8sPod
from schemas.settings import WatcherSettings

T0 = time.time() - 3600  # objects created an hour ago
FAST = Backoff(base_s=0.01, cap_s=0.05, rng=random.Random(7))


class Recorder:
    """What the watcher published, in order, from its threads."""

    def __init__(self) -> None:
        self.pods: list[K8sPod] = []
        self.nodes: list[K8sNode] = []
        self._lock = threading.Lock()

    def pod(self, value: K8sPod) -> None:
        with self._lock:
            self.pods.append(value)

    def node(self, value: K8sNode) -> None:
        with self._lock:
            self.nodes.append(value)

    def of(self, name: str) -> list[tuple[str, str]]:
        """(type, phase) of the messages of the pod named `name`."""
        with self._lock:
            return [(p.type, p.phase) for p in self.pods if p.name == name]


Start = Callable[..., K8sWatcher]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def start(kube: KubernetesApi, recorder: Recorder, wait: Any) -> Iterator[Start]:
    """Start a watcher (settings overridable) and wait for its first lists; stopped after."""
    started: list[K8sWatcher] = []

    def run(**overrides: Any) -> K8sWatcher:
        options = {"watch_timeout_s": overrides.pop("watch_timeout_s", 30), "backoff": FAST}
        options.update({k: overrides.pop(k) for k in ("full_resync_s",) if k in overrides})
        watcher = K8sWatcher(
            kube,
            WatcherSettings(**overrides),
            emit_pod=recorder.pod,
            emit_node=recorder.node,
            **options,
        )
        started.append(watcher)
        watcher.start()
        wait(lambda: watcher.synced, "the first lists")
        return watcher

    yield run
    for watcher in started:
        watcher.stop()


def pod_watch(watcher: K8sWatcher) -> Any:
    return watcher.pod_watches[0]


@pytest.mark.test_server_only(
    "it needs objects created in the past: a real server sets creationTimestamp itself"
)
def test_the_first_list_publishes_gpu_pods_as_resync(
    apiserver: FakeApiServer, start: Start, recorder: Recorder
) -> None:
    apiserver.create(
        "pods", m.running(m.bound(m.gpu_pod("train", "ml", created=T0), "n1", T0 + 5), T0 + 30)
    )
    apiserver.create(
        "pods",
        {"metadata": {"name": "web", "namespace": "ml"}, "spec": {"containers": [{"name": "c"}]}},
    )
    watcher = start()
    assert recorder.of("train") == [("RESYNC", "Running")]
    assert recorder.of("web") == []
    # The state began at its last recorded transition (running at T0 + 30).
    assert recorder.pods[0].ts == int(T0 + 30) * 1000
    listed_at = pod_watch(watcher).resource_version
    assert listed_at == apiserver.resource_version


@pytest.mark.test_server_only(
    "one write per change: a real server binds and writes status in separate requests "
    "and marks a pod before deleting it, so its events differ in number; "
    "test_k8s_real_apiserver.py follows a pod's life on it"
)
def test_live_changes_are_published_once_each_and_churn_is_not(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    watcher = start()
    pod = apiserver.create("pods", m.gpu_pod("p", "ml", created=time.time()))
    wait(lambda: recorder.of("p") == [("ADDED", "Pending")], "ADDED")
    apiserver.update("pods", m.running(m.bound(pod, "n1", time.time()), time.time()))
    wait(lambda: len(recorder.of("p")) == 2, "MODIFIED")
    # Status churn our values do not show: a new pod IP, a probe time.
    apiserver.modify("pods", "ml", "p", lambda o: o["status"].update(podIP="10.244.9.9"))
    final = apiserver.delete("pods", "ml", "p")
    wait(lambda: len(recorder.of("p")) == 3, "DELETED")
    assert recorder.of("p") == [
        ("ADDED", "Pending"),
        ("MODIFIED", "Running"),
        ("DELETED", "Running"),
    ]
    assert recorder.pods[-1].resource_version == final["metadata"]["resourceVersion"]
    stats = pod_watch(watcher).stats
    assert stats.events["MODIFIED"] == 2
    assert stats.published == {"ADDED": 1, "MODIFIED": 1, "DELETED": 1}
    assert [p.ts for p in recorder.pods] == sorted(p.ts for p in recorder.pods)


def test_bookmarks_move_the_resource_version_and_publish_nothing(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    watcher = start(watch_timeout_s=4)  # a real server bookmarks 2 s before the timeout
    for i in range(3):
        last = apiserver.create("replicasets", {"metadata": {"name": f"rs{i}", "namespace": "ml"}})
    newest = int(last["metadata"]["resourceVersion"])  # a real server writes on its own too
    wait(lambda: int(pod_watch(watcher).resource_version or 0) >= newest, "a bookmark")
    assert pod_watch(watcher).stats.events["BOOKMARK"] >= 1
    assert recorder.pods == []
    assert pod_watch(watcher).stats.relists == {"initial": 1}


def test_watch_timeouts_are_renewed_from_the_last_version_invisibly(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    apiserver.create("pods", m.gpu_pod("p", "ml", created=T0))
    watcher = start(watch_timeout_s=1)
    wait(lambda: pod_watch(watcher).stats.watch_requests >= 3, "two renewals", timeout_s=15)
    apiserver.modify("pods", "ml", "p", lambda o: o["status"].update(phase="Running"))
    wait(lambda: len(recorder.of("p")) == 2, "the change after the renewals")
    assert recorder.of("p") == [("RESYNC", "Pending"), ("MODIFIED", "Running")]
    assert pod_watch(watcher).stats.relists == {"initial": 1}
    if not isinstance(apiserver, FakeApiServer):
        return
    watches = [r for r in apiserver.requests if r.watch and r.path == "/api/v1/pods"]
    versions = [int(r.params["resourceVersion"]) for r in watches]
    assert versions == sorted(versions)
    assert all(r.params["timeoutSeconds"] == "1" for r in watches)


@pytest.mark.test_server_only("cutting a connection mid-stream needs the server's own socket")
def test_a_dropped_watch_resumes_from_the_last_version_without_a_relist(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    apiserver.create("pods", m.gpu_pod("p", "ml", created=T0))
    watcher = start()
    wait(lambda: apiserver.open_watches("pods") == 1, "the pod watch")
    resume_from = pod_watch(watcher).resource_version
    apiserver.drop_watches()
    apiserver.modify("pods", "ml", "p", lambda o: o["status"].update(phase="Running"))
    apiserver.create("pods", m.gpu_pod("q", "ml", created=time.time()))
    apiserver.delete("pods", "ml", "p")
    wait(
        lambda: len(recorder.of("p")) == 3 and recorder.of("q"),
        "the changes made while disconnected",
    )
    assert recorder.of("p") == [
        ("RESYNC", "Pending"),
        ("MODIFIED", "Running"),
        ("DELETED", "Running"),
    ]
    assert recorder.of("q") == [("ADDED", "Pending")]
    stats = pod_watch(watcher).stats
    assert stats.relists == {"initial": 1}
    assert stats.api_errors["disconnect"] == 1
    resumed = [r for r in apiserver.requests if r.watch and r.path == "/api/v1/pods"]
    assert resumed[1].params["resourceVersion"] == resume_from


@pytest.mark.test_server_only(
    "changes made while the watch is cut, then compacted; test_k8s_real_apiserver.py has "
    "a real 410 after a compaction, on a server without the watch cache"
)
@pytest.mark.parametrize("as_status", [False, True], ids=["error-event", "http-status"])
def test_410_relists_and_publishes_the_difference(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any, as_status: bool
) -> None:
    apiserver.expired_as_status = as_status
    for name in ("same", "changed", "gone", "churned"):
        apiserver.create("pods", m.gpu_pod(name, "ml", created=T0))
    watcher = start()
    wait(lambda: apiserver.open_watches("pods") == 1, "the pod watch")
    # Lost while disconnected, and compacted away before the watcher comes back.
    apiserver.drop_watches("pods")
    apiserver.modify("pods", "ml", "changed", lambda o: o["status"].update(phase="Running"))
    apiserver.modify("pods", "ml", "churned", lambda o: o["status"].update(podIP="10.1.1.1"))
    apiserver.delete("pods", "ml", "gone")
    apiserver.create("pods", m.gpu_pod("new", "ml", created=time.time()))
    apiserver.compact()
    wait(lambda: pod_watch(watcher).stats.relists["expired"] == 1, "the relist")
    wait(lambda: len(recorder.pods) == 7, "the relist's messages")
    assert recorder.of("same") == [("RESYNC", "Pending")]
    assert recorder.of("churned") == [("RESYNC", "Pending")]
    assert recorder.of("changed") == [("RESYNC", "Pending"), ("RESYNC", "Running")]
    assert recorder.of("gone") == [("RESYNC", "Pending"), ("DELETED", "Pending")]
    assert recorder.of("new") == [("ADDED", "Pending")]
    # And the watch goes on from the relist.
    apiserver.modify("pods", "ml", "same", lambda o: o["status"].update(phase="Running"))
    wait(lambda: recorder.of("same")[-1] == ("MODIFIED", "Running"), "the next change")


@pytest.mark.test_server_only("no real server ends open watches with 410 on cue")
def test_410_on_an_open_watch_relists(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    watcher = start()
    wait(lambda: apiserver.open_watches("pods") == 1, "the pod watch")
    apiserver.expire_watches("pods")
    wait(lambda: pod_watch(watcher).stats.relists["expired"] == 1, "the relist")
    assert pod_watch(watcher).stats.events["ERROR"] == 1
    assert recorder.pods == []


@pytest.mark.test_server_only("failing the next requests on cue is the test server's own")
def test_api_errors_back_off_and_recover(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    watcher = start()
    wait(lambda: apiserver.open_watches("pods") == 1, "the pod watch")
    apiserver.fail_next(3, status=500, resource="pods")
    apiserver.drop_watches("pods")
    apiserver.create("pods", m.gpu_pod("p", "ml", created=time.time()))
    wait(lambda: recorder.of("p") == [("ADDED", "Pending")], "the change after the errors")
    assert pod_watch(watcher).stats.api_errors["500"] == 3
    assert pod_watch(watcher).stats.relists == {"initial": 1}


def test_the_first_list_is_paginated(
    apiserver: FakeApiServer, kube: KubernetesApi, recorder: Recorder, wait: Any
) -> None:
    from producers.base.kubeapi import Collection
    from producers.k8s.watching import Watch

    for i in range(5):
        apiserver.create("pods", m.gpu_pod(f"p{i}", "ml", created=T0))
    watcher = K8sWatcher(kube, WatcherSettings(), emit_pod=recorder.pod, emit_node=recorder.node)
    watch: Watch[Any, K8sPod] = Watch(
        api=kube,
        collection=Collection("pods"),
        kind=watcher.pod_watches[0].kind,
        emit=recorder.pod,
        watch_timeout_s=5,
        page_size=2,
    )
    assert watch.step() is True  # one step: the whole (paginated) list
    assert sorted(p.name for p in recorder.pods) == [f"p{i}" for i in range(5)]
    if not isinstance(apiserver, FakeApiServer):
        return
    lists = [r for r in apiserver.requests if not r.watch]
    assert [r.params.get("limit") for r in lists] == ["2", "2", "2"]
    assert "continue" in lists[1].params


def test_a_pod_leaving_the_label_selection_is_deleted(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    apiserver.create("pods", m.gpu_pod("p", "ml", created=T0, labels={"team": "vision"}))
    apiserver.create("pods", m.gpu_pod("other", "ml", created=T0, labels={"team": "nlp"}))
    start(label_selector="team=vision")
    assert recorder.of("p") == [("RESYNC", "Pending")]
    apiserver.modify("pods", "ml", "p", lambda o: o["metadata"]["labels"].update(team="nlp"))
    wait(lambda: recorder.of("p")[-1] == ("DELETED", "Pending"), "DELETED")
    assert recorder.of("other") == []
    if not isinstance(apiserver, FakeApiServer):
        return
    assert {
        r.params.get("labelSelector") for r in apiserver.requests if r.path == "/api/v1/pods"
    } == {"team=vision"}


def test_one_watch_per_namespace(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    watcher = start(namespaces=("ml", "research"))
    # (and, where the server serves resource.k8s.io, one of ResourceSlices, once found)
    watched = [
        str(w.collection) for w in watcher.watches if w.collection.resource != "resourceslices"
    ]
    assert watched == ["nodes", "pods/ml", "pods/research"]
    for namespace in ("ml", "web", "research"):
        apiserver.create("pods", m.gpu_pod(f"p-{namespace}", namespace, created=time.time()))
    wait(lambda: len(recorder.pods) == 2, "two pods")
    assert sorted(p.namespace for p in recorder.pods) == ["ml", "research"]


def test_owners_resolve_through_the_api(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    apiserver.create("replicasets", controlled("web-7d9c", ("apps/v1", "Deployment", "web"), "d1"))
    apiserver.create("jobs", controlled("nightly-1", ("batch/v1", "CronJob", "nightly"), "c1"))
    apiserver.create("pods", m.gpu_pod("w", "ml", created=T0, owner=("ReplicaSet", "web-7d9c")))
    apiserver.create("pods", m.gpu_pod("n", "ml", created=T0, owner=("Job", "nightly-1")))
    apiserver.create("pods", m.gpu_pod("j", "ml", created=T0, owner=("Job", "gone")))
    watcher = start()
    owners = {p.name: p.owner for p in recorder.pods}
    assert {name: (o.kind, o.name) if o else None for name, o in owners.items()} == {
        "w": ("Deployment", "web"),
        "n": ("CronJob", "nightly"),
        "j": ("Job", "gone"),
    }
    assert watcher.owners.stats.lookups == 3


@pytest.mark.test_server_only(
    "it needs objects created in the past: a real server sets creationTimestamp itself"
)
def test_gpu_nodes_and_their_changes(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    apiserver.create("nodes", m.gpu_node("gpu-1", created=T0))
    apiserver.create(
        "nodes", {"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "16"}}}
    )
    start()
    assert [(n.type, n.node, n.ready) for n in recorder.nodes] == [("RESYNC", "gpu-1", True)]
    # Heartbeats change nothing we publish.
    apiserver.modify(
        "nodes",
        None,
        "gpu-1",
        lambda o: o["status"]["conditions"][0].update(lastHeartbeatTime="2030-01-01T00:00:00Z"),
    )
    down_at = time.time() - 5
    apiserver.update(
        "nodes", m.node_ready(apiserver.get("nodes", None, "gpu-1") or {}, False, down_at)
    )
    # A CPU node whose device plugin comes up becomes a GPU node.
    apiserver.modify(
        "nodes", None, "cpu-1", lambda o: o["status"]["capacity"].update({"nvidia.com/gpu": "4"})
    )
    wait(lambda: len(recorder.nodes) == 3, "two more node messages")
    assert [(n.type, n.node, n.ready) for n in recorder.nodes[1:]] == [
        ("MODIFIED", "gpu-1", False),
        ("ADDED", "cpu-1", False),
    ]
    assert recorder.nodes[1].ts == int(down_at) * 1000  # the Ready transition's time
    assert recorder.nodes[2].gpu_capacity == {"nvidia.com/gpu": 4}


def test_named_pods_are_published_without_a_gpu_request(
    apiserver: FakeApiServer, start: Start, recorder: Recorder
) -> None:
    apiserver.create(
        "pods",
        {"metadata": {"name": "leaky", "namespace": "ml"}, "spec": {"containers": [{"name": "c"}]}},
    )
    start(extra_pods=("ml/leaky",))
    assert recorder.of("leaky") == [("RESYNC", "Pending")]
    assert recorder.pods[0].gpu_request == {}


@pytest.mark.test_server_only("a real server refuses to store such an object")
def test_an_unreadable_object_is_skipped_and_the_rest_goes_on(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    watcher = start()
    bad = m.gpu_pod("bad", "ml", created=time.time())
    bad["status"]["containerStatuses"] = [{"name": "c", "restartCount": "many"}]
    apiserver.create("pods", bad)
    apiserver.create("pods", m.gpu_pod("good", "ml", created=time.time()))
    wait(lambda: recorder.of("good") == [("ADDED", "Pending")], "the next pod")
    stats = pod_watch(watcher).stats
    assert stats.malformed >= 1
    assert stats.relists["malformed"] == 1  # an event it could not read: relist to converge
    assert recorder.of("bad") == []


def test_stop_interrupts_a_blocked_watch_at_once(
    start: Start, wait: Any, apiserver: FakeApiServer
) -> None:
    watcher = start(watch_timeout_s=300)
    # Nodes, pods and ResourceSlices (both servers serve resource.k8s.io).
    wait(lambda: apiserver.open_watches() == 3, "every watch")
    began = time.monotonic()
    watcher.stop()
    assert time.monotonic() - began < 2


def test_a_periodic_full_resync_resends_live_pods(
    apiserver: FakeApiServer, start: Start, recorder: Recorder, wait: Any
) -> None:
    apiserver.create("pods", m.gpu_pod("p", "ml", created=T0))
    watcher = start(full_resync_s=0.3, watch_timeout_s=1)
    wait(
        lambda: pod_watch(watcher).stats.relists["periodic"] >= 1, "a periodic resync", timeout_s=10
    )
    wait(lambda: len(recorder.of("p")) >= 2, "the re-sent pod")
    assert set(recorder.of("p")) == {("RESYNC", "Pending")}
