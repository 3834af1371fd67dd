"""A watcher restarted against the real kube-apiserver: a pod, or a Kueue Workload, deleted
while it was down is published DELETED (final state unknown) from what Kafka holds, and a
worker finishes it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from support.apiservers import LiveApiServer
from topic_io import NewScope
from worker_fixtures import (
    FakeClock,
    StartWorker,
    decoded,
    produce,
    recording_agent,
    wait_for,
)

from gpuwatch.harness.simulate.kube import kueue as k
from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.run.watcher import WatcherService
from schemas import (
    K8S_PODS,
    K8S_WORKLOADS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    WORKLOAD_LIFECYCLE,
    PodLifecycle,
    WorkloadLifecycle,
)
from schemas.codec import TopicSpec
from schemas.settings import Settings

pytestmark = pytest.mark.integration

WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2"


def run_watcher(settings: Settings, until: Callable[[WatcherService], bool], what: str) -> None:
    """The watcher in this process until `until` holds (its publishers flushed on stop)."""
    service = WatcherService.from_settings(settings)
    service.start()
    try:
        wait_for(what, lambda: until(service), timeout_s=30)
    finally:
        service.stop()


def acknowledged(n: int, spec: TopicSpec[Any] = K8S_PODS) -> Callable[[WatcherService], bool]:
    """Kafka acknowledged `n` messages of this run to `spec`'s topic (pods)."""
    return lambda service: service.publishers[spec.name].stats.sent >= n


def story(settings: Settings, name: str, spec: TopicSpec[Any] = K8S_PODS) -> list[tuple[str, bool]]:
    """(type, final_state_unknown) of the messages of the object `name` (a pod), in order."""
    return [(v.type, v.final_state_unknown) for v in decoded(settings, spec) if v.name == name]


class NodeClock:
    """A simulated GPU node sampling at the wall clock, each second asked: its samples move
    the worker's event time, which releases the pod events it holds."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.clock = FakeClock(time.time())
        self.agent, _, _, self.raw = recording_agent("gwtest-clock", self.clock, 1, seed=3)
        self.topic = NVML_SAMPLES.full_name(settings.kafka.topic_prefix)

    def tick(self) -> None:
        if time.time() - self.clock.now < 1.0:
            return
        self.clock.now = time.time()
        self.agent.tick()
        produce(self.settings, [(self.topic, key, value, None) for key, value in self.raw])
        self.raw.clear()

    def changes(
        self, uid: str, to_state: str, spec: TopicSpec[Any] = POD_LIFECYCLE
    ) -> list[PodLifecycle] | list[WorkloadLifecycle]:
        """A sample, then the transitions of the pod (or workload: `spec`) `uid` into
        `to_state` so far."""
        self.tick()
        lifecycle = decoded(self.settings, spec)
        return [c for c in lifecycle if c.uid == uid and c.to_state == to_state]


@pytest.fixture
def kueue(real: LiveApiServer, kube_stack: Settings) -> LiveApiServer:
    """The stack's kube-apiserver serving Kueue's Workloads, none left in `ml`."""
    real.install_kueue(kube_stack)
    for found in real.request("GET", f"{WORKLOADS}/namespaces/ml/workloads")["items"]:
        real.delete("workloads", "ml", found["metadata"]["name"])
    return real


def watching_ml(settings: Settings, server: LiveApiServer, port: int) -> Settings:
    """`settings` with a watcher of the namespace `ml` of `server`."""
    watcher = settings.watcher.model_copy(
        update={"kubeconfig": server.kubeconfig, "namespaces": ("ml",), "metrics_port": port}
    )
    return settings.model_copy(update={"watcher": watcher})


def test_a_pod_deleted_while_the_watcher_was_down_is_deleted_and_finished(
    *,
    real: LiveApiServer,
    new_scope: NewScope,
    start_worker: StartWorker,
    free_port: Callable[[], int],
) -> None:
    settings = watching_ml(new_scope(), real, free_port())
    worker = start_worker(settings)
    node = NodeClock(settings)
    now = time.time()
    created = real.create(
        "pods", m.running(m.bound(m.gpu_pod("train", "ml", created=now), "gpu-node-1", now), now)
    )
    real.create("pods", m.gpu_pod("kept", "ml", created=now))
    uid = created["metadata"]["uid"]

    run_watcher(settings, acknowledged(2), "both pods in k8s.pods")
    wait_for("train running", lambda: node.changes(uid, "running"), worker)
    real.delete("pods", "ml", "train")  # while no watcher runs: no one sees its DELETED
    deleted_at = int(time.time() * 1000)
    # The restart re-sends kept (its first list re-sends all) and publishes train's deletion.
    run_watcher(settings, acknowledged(2), "the restart's messages acknowledged")

    assert story(settings, "kept") == [("RESYNC", False), ("RESYNC", False)]
    assert story(settings, "train") == [("RESYNC", False), ("DELETED", True)]
    (gone,) = [v for v in decoded(settings, K8S_PODS) if v.type == "DELETED"]
    assert (gone.uid, gone.phase) == (uid, "Running")  # the last state Kafka held
    assert gone.ts >= deleted_at  # the relist's time
    finished = wait_for("train finished", lambda: node.changes(uid, "finished"), worker)
    assert [(c.from_state, c.reason, c.ts) for c in finished] == [
        ("running", "DeletedFinalStateUnknown", gone.ts)
    ]


def test_a_workload_deleted_while_the_watcher_was_down_is_deleted_and_finished(
    *,
    kueue: LiveApiServer,
    new_scope: NewScope,
    start_worker: StartWorker,
    free_port: Callable[[], int],
) -> None:
    settings = watching_ml(new_scope(), kueue, free_port())
    worker = start_worker(settings)
    node = NodeClock(settings)
    now = time.time()

    def queued(name: str, job_uid: str) -> dict[str, Any]:
        obj = k.workload(
            name, "ml", created=now, queue="research", job=(name, job_uid), pods=2,
            gpus_per_pod={"nvidia.com/gpu": 8},
        )  # fmt: skip
        message = "couldn't assign flavors to pod set main: insufficient unused quota"
        return kueue.create("workloads", k.pending(obj, now, message))

    uid = queued("job-gone", "6c1d2e3f-4a5b-4c6d-8e7f-90a1b2c3d4e5")["metadata"]["uid"]
    queued("job-kept", "7d2e3f4a-5b6c-4d7e-8f90-a1b2c3d4e5f6")

    run_watcher(settings, acknowledged(2, K8S_WORKLOADS), "both workloads in k8s.workloads")
    wait_for("job-gone queued", lambda: node.changes(uid, "queued", WORKLOAD_LIFECYCLE), worker)
    kueue.delete("workloads", "ml", "job-gone")  # while no watcher runs: no one sees it
    deleted_at = int(time.time() * 1000)
    # The restart re-sends job-kept (its first list re-sends all), publishes job-gone's deletion.
    run_watcher(settings, acknowledged(2, K8S_WORKLOADS), "the restart's workload messages")

    assert story(settings, "job-kept", K8S_WORKLOADS) == [("RESYNC", False), ("RESYNC", False)]
    assert story(settings, "job-gone", K8S_WORKLOADS) == [("RESYNC", False), ("DELETED", True)]
    (gone,) = [v for v in decoded(settings, K8S_WORKLOADS) if v.type == "DELETED"]
    assert (gone.uid, gone.queue, gone.pods) == (uid, "research", 2)  # the last state held
    assert gone.ts >= deleted_at  # the relist's time
    finished = wait_for(
        "job-gone finished", lambda: node.changes(uid, "finished", WORKLOAD_LIFECYCLE), worker
    )
    # As a DELETED the watcher saw: finished, Deleted, at the relist's time.
    assert [(c.from_state, c.reason, c.ts) for c in finished] == [("queued", "Deleted", gone.ts)]
