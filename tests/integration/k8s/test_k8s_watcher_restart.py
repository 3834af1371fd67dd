"""A watcher restarted against the real kube-apiserver: a pod deleted while it was down is
published DELETED (final state unknown) from what Kafka holds, and a worker finishes it."""

from __future__ import annotations

import time
from collections.abc import Callable

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

from gpuwatch.run.watcher import WatcherService
from producers.simulate.kube import manifests as m
from schemas import K8S_PODS, NVML_SAMPLES, POD_LIFECYCLE, PodLifecycle
from schemas.settings import Settings

pytestmark = pytest.mark.integration


def run_watcher(settings: Settings, until: Callable[[WatcherService], bool], what: str) -> None:
    """The watcher in this process until `until` holds (its publishers flushed on stop)."""
    service = WatcherService.from_settings(settings)
    service.start()
    try:
        wait_for(what, lambda: until(service), timeout_s=30)
    finally:
        service.stop()


def acknowledged(n: int) -> Callable[[WatcherService], bool]:
    """Kafka acknowledged `n` pod messages of this run."""
    return lambda service: service.publishers[K8S_PODS.name].stats.sent >= n


def story(settings: Settings, name: str) -> list[tuple[str, bool]]:
    """(type, final_state_unknown) of the k8s.pods messages of the pod `name`, in order."""
    return [(v.type, v.final_state_unknown) for v in decoded(settings, K8S_PODS) if v.name == name]


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

    def changes(self, uid: str, to_state: str) -> list[PodLifecycle]:
        """A sample, then the pod's transitions into `to_state` so far."""
        self.tick()
        lifecycle = decoded(self.settings, POD_LIFECYCLE)
        return [c for c in lifecycle if c.uid == uid and c.to_state == to_state]


def test_a_pod_deleted_while_the_watcher_was_down_is_deleted_and_finished(
    *,
    real: LiveApiServer,
    new_scope: NewScope,
    start_worker: StartWorker,
    free_port: Callable[[], int],
) -> None:
    scope = new_scope()
    watcher = scope.watcher.model_copy(
        update={"kubeconfig": real.kubeconfig, "namespaces": ("ml",), "metrics_port": free_port()}
    )
    settings = scope.model_copy(update={"watcher": watcher})
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
