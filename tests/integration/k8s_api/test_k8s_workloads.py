"""Kueue Workloads through the watcher, on the test API server and on the real
kube-apiserver with Kueue v0.17's Workload CRD installed (v1beta2 stored, v1beta1 served):
a suspended job's workload waiting for quota, admitted, finished, deleted; and a cluster
without Kueue, which is said once and looked at again."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.apiservers import LiveApiServer

from gpuwatch.harness.simulate.kube import kueue as k
from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from producers.k8s.client import KubernetesApi
from producers.k8s.objects import parse_time
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import Backoff
from schemas import K8sWorkload, Owner
from schemas.settings import WatcherSettings

T0 = float(int(time.time()) - 3600)
FAST = Backoff(base_s=0.01, cap_s=0.05, rng=random.Random(7))
JOB_UID = "7e6d5c4b-3a29-4817-8f6e-5d4c3b2a1908"
WAITING = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
    "in flavor h100, 4 more needed"
)


class Workloads:
    """What the watcher published, from its threads."""

    def __init__(self) -> None:
        self.seen: list[K8sWorkload] = []
        self._lock = threading.Lock()

    def __call__(self, value: K8sWorkload) -> None:
        with self._lock:
            self.seen.append(value)

    def last(self) -> K8sWorkload | None:
        with self._lock:
            return self.seen[-1] if self.seen else None


@pytest.fixture
def kueue(
    apiserver: FakeApiServer | LiveApiServer, request: pytest.FixtureRequest, wait: Any
) -> Any:
    """The server, serving Kueue's Workloads."""
    if isinstance(apiserver, LiveApiServer):
        apiserver.install_kueue(request.getfixturevalue("kube_stack"))
        for found in apiserver.request("GET", "/apis/kueue.x-k8s.io/v1beta2/workloads")["items"]:
            meta = found["metadata"]
            apiserver.delete("workloads", meta["namespace"], meta["name"])
    return apiserver


def watcher(api: KubernetesApi, workloads: Workloads, **settings: Any) -> K8sWatcher:
    return K8sWatcher(
        api,
        WatcherSettings(**settings),
        emit_pod=lambda _: None,
        emit_node=lambda _: None,
        emit_workload=workloads,
        watch_timeout_s=30,
        backoff=FAST,
        resolve_owners=False,
        kueue_recheck_s=0.05,
    )


@pytest.fixture
def running(kube: KubernetesApi) -> Iterator[list[K8sWatcher]]:
    started: list[K8sWatcher] = []
    yield started
    for w in started:
        w.stop()


def test_a_queued_workload_is_published_waiting_admitted_finished_and_deleted(
    kueue: Any, kube: KubernetesApi, running: list[K8sWatcher], wait: Any
) -> None:
    obj = k.workload(
        "job-train-3f2a1",
        "research",
        created=T0,
        queue="research",
        job=("train", JOB_UID),
        pods=4,
        gpus_per_pod={"nvidia.com/gpu": 8},
        labels={"team": "nlp", "project": "pretrain"},
        priority=100,
        priority_class="research-high",
    )
    stored = kueue.create("workloads", obj)
    # A real server stamps its own creation time (now); the status times follow it.
    t0 = parse_time(stored["metadata"]["creationTimestamp"]) / 1000
    workloads = Workloads()
    w = watcher(kube, workloads)
    running.append(w)
    w.start()
    wait(lambda: workloads.last() is not None, "the workload")
    first = workloads.last()
    assert first is not None
    # A first list is a cold start: what consumers saw is unknown, so RESYNC.
    assert (first.type, first.namespace, first.name) == ("RESYNC", "research", "job-train-3f2a1")
    assert (first.queue, first.cluster_queue, first.priority, first.priority_class) == (
        "research", None, 100, "research-high"
    )  # fmt: skip
    assert (first.pods, dict(first.gpu_request), first.job_uid) == (
        4,
        {"nvidia.com/gpu": 32},
        JOB_UID,
    )
    assert first.owner == Owner(kind="Job", name="train")  # owners not resolved here
    assert first.labels == {"team": "nlp", "project": "pretrain"}
    assert (first.conditions, first.admitted_at, first.active) == ((), None, True)
    assert w.kueue is not None
    assert w.kueue.version == "v1beta2"

    kueue.modify("workloads", "research", "job-train-3f2a1",
                 lambda o: o.update(k.pending(o, t0 + 1, WAITING)))  # fmt: skip
    wait(lambda: len(workloads.seen) == 2, "the pending condition")
    (quota,) = workloads.seen[1].conditions
    assert (quota.type, quota.status, quota.reason, quota.message) == (
        "QuotaReserved", "False", "Pending", WAITING
    )  # fmt: skip
    # The condition's transition time, or the watcher's clock while that is still ahead.
    assert int(t0) * 1000 <= workloads.seen[1].ts <= int(t0 + 1) * 1000

    kueue.modify("workloads", "research", "job-train-3f2a1",
                 lambda o: o.update(k.admitted(o, t0 + 1200, "team-research")))  # fmt: skip
    wait(lambda: len(workloads.seen) == 3, "the admission")
    admitted = workloads.seen[2]
    assert (admitted.cluster_queue, admitted.admitted_at) == (
        "team-research",
        int(t0 + 1200) * 1000,
    )
    assert [c.type for c in admitted.conditions] == ["QuotaReserved", "Admitted"]

    kueue.modify("workloads", "research", "job-train-3f2a1",
                 lambda o: o.update(k.finished(o, t0 + 1800)))  # fmt: skip
    wait(lambda: len(workloads.seen) == 4, "the finish")
    assert workloads.seen[3].finished_at == int(t0 + 1800) * 1000
    kueue.delete("workloads", "research", "job-train-3f2a1")
    wait(lambda: len(workloads.seen) == 5, "the deletion")
    assert workloads.seen[4].type == "DELETED"


@pytest.mark.test_server_only("a CRD cannot be taken away and given back on cue")
def test_without_kueue_it_is_said_once_and_looked_for_again(
    caplog: pytest.LogCaptureFixture, wait: Any
) -> None:
    caplog.set_level(logging.INFO, logger="producers.k8s.watcher")
    with FakeApiServer(bookmark_interval_s=0.1, kueue=False) as server:
        api = KubernetesApi.for_host(server.url)
        workloads = Workloads()
        w = watcher(api, workloads)
        w.start()
        try:
            assert w.kueue is not None
            kueue_watch = w.kueue
            wait(lambda: kueue_watch.checks >= 3, "three looks for Kueue")
            absent = [r for r in caplog.records if "kueue not installed" in r.getMessage()]
            assert len(absent) == 1
            assert w.synced  # pods and nodes are listed; Kueue's absence holds nothing up
            assert workloads.seen == []
            server.kueue = True  # Kueue installed meanwhile
            late = k.workload(
                "late", "ml", created=T0, queue="ml", job=("late", JOB_UID), pods=1,
                gpus_per_pod={"nvidia.com/gpu": 1},
            )  # fmt: skip
            server.create("workloads", late)
            wait(lambda: workloads.last() is not None, "the workload once Kueue is there")
            assert kueue_watch.version == "v1beta2"
        finally:
            w.stop()
            api.close()


def test_workloads_are_not_watched_when_the_settings_say_so(
    kueue: Any, kube: KubernetesApi, running: list[K8sWatcher]
) -> None:
    w = watcher(kube, Workloads(), watch_workloads=False)
    assert w.kueue is None
