"""The watcher's own metrics: events, relists, API errors, last event age, buffers."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.fake_apiserver import FakeApiServer

from gpuwatch.harness.simulate.kube import manifests as m
from producers.base.publisher import Done, Publisher
from producers.k8s.client import KubernetesApi
from producers.k8s.metrics import WatcherCollector
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import Backoff
from schemas import K8S_PODS, K8sPod
from schemas.settings import WatcherSettings


class NoSender:
    """A Kafka client that is never asked: the publisher is not started."""

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        raise AssertionError("not started")

    def flush(self, timeout_s: float) -> None:
        pass

    def close(self, timeout_s: float) -> None:
        pass


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                return float(value)
    return None


@pytest.mark.test_server_only("failing the next request and cutting a watch on cue")
def test_metrics_count_what_the_watches_did(
    apiserver: FakeApiServer, kube: KubernetesApi, wait: Any
) -> None:
    publisher = Publisher(NoSender(), 1 << 20)

    def emit(value: K8sPod) -> None:
        publisher.publish(value.uid.encode(), K8S_PODS.encode(value))

    apiserver.create("pods", m.gpu_pod("a", "ml", created=time.time()))
    watcher = K8sWatcher(
        kube,
        WatcherSettings(),
        emit_pod=emit,
        emit_node=lambda _: None,
        watch_timeout_s=30,
        backoff=Backoff(base_s=0.01, cap_s=0.05),
    )
    registry = CollectorRegistry()
    registry.register(
        WatcherCollector(watcher.watches, watcher.owners.stats, {"k8s.pods": publisher})
    )
    watcher.start()
    try:
        wait(lambda: apiserver.open_watches("pods") == 1, "the pod watch")
        apiserver.fail_next(1, status=500, resource="pods")
        apiserver.drop_watches("pods")
        apiserver.create("pods", m.gpu_pod("b", "ml", created=time.time()))
        wait(lambda: watcher.pod_watches[0].stats.published["ADDED"] == 1, "the new pod")
    finally:
        watcher.stop()
    text = generate_latest(registry).decode()
    pods = {"resource": "pods", "namespace": ""}
    assert sample(text, "gpuwatch_k8s_watcher_events_total", type="ADDED", **pods) == 1
    assert sample(text, "gpuwatch_k8s_watcher_published_total", type="RESYNC", **pods) == 1
    assert sample(text, "gpuwatch_k8s_watcher_published_total", type="ADDED", **pods) == 1
    assert sample(text, "gpuwatch_k8s_watcher_relists_total", reason="initial", **pods) == 1
    assert (
        sample(text, "gpuwatch_k8s_watcher_relists_total", reason="initial", resource="nodes") == 1
    )
    assert sample(text, "gpuwatch_k8s_watcher_api_errors_total", status="500", **pods) == 1
    assert sample(text, "gpuwatch_k8s_watcher_api_errors_total", status="disconnect", **pods) == 1
    age = sample(text, "gpuwatch_k8s_watcher_last_event_age_seconds", **pods)
    assert age is not None
    assert 0 <= age < 10
    assert sample(text, "gpuwatch_k8s_watcher_tracked_objects", **pods) == 2
    assert sample(text, "gpuwatch_k8s_watcher_watch_requests_total", **pods) == 3
    buffered = sample(text, "gpuwatch_k8s_watcher_buffer_bytes", topic="k8s.pods")
    assert buffered is not None
    assert buffered > 0
    assert sample(text, "gpuwatch_k8s_watcher_owner_lookups_total") == 0
