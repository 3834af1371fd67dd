"""The watcher against real Kafka: what lands in k8s.pods and k8s.nodes validates and
tells each pod's story, through a 410 relist; and `gpuwatch k8s-watcher` as a user runs it."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import watcher_command
from jsonschema import Draft202012Validator
from support import reaped
from support.fake_apiserver import FakeApiServer

from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.run.watcher import WatcherService
from schemas import K8S_NODES, K8S_PODS, K8sNode, K8sPod
from schemas.settings import Settings

pytestmark = pytest.mark.integration

Consume = Callable[[Settings, str], list[Any]]


def decoded(records: list[Any], spec: Any, validator: Draft202012Validator) -> list[Any]:
    """Each record validated against the JSON Schema and decoded; the key checked."""
    values = []
    for record in records:
        assert list(validator.iter_errors(json.loads(record.value))) == []
        value = spec.decode(record.value)
        assert record.key == spec.key_of(value).encode()
        values.append(value)
    return values


def test_pods_and_nodes_reach_kafka_valid_and_in_order_through_a_relist(
    *,
    scoped: Settings,
    apiserver: FakeApiServer,
    kubeconfig: Path,
    free_port: Callable[[], int],
    consume: Consume,
    validators: dict[str, Draft202012Validator],
    wait: Callable[..., None],
) -> None:
    t0 = time.time() - 600
    apiserver.create("nodes", m.gpu_node("gpu-node-1", created=t0))
    apiserver.create(
        "pods",
        m.running(m.bound(m.gpu_pod("serve", "ml", created=t0), "gpu-node-1", t0 + 2), t0 + 9),
    )
    apiserver.create(
        "pods",
        m.unschedulable(
            m.gpu_pod("train", "ml", created=t0 + 60, gpus={"nvidia.com/gpu": 8}),
            t0 + 61,
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
        ),
    )
    watcher_settings = scoped.watcher.model_copy(
        update={"kubeconfig": kubeconfig, "metrics_port": free_port()}
    )
    settings = scoped.model_copy(update={"watcher": watcher_settings})
    service = WatcherService.from_settings(settings)
    service.start()
    try:
        wait(lambda: service.watcher.synced, "the first lists")
        now = time.time()
        pod = apiserver.get("pods", "ml", "train") or {}
        apiserver.update("pods", m.running(m.bound(pod, "gpu-node-1", now), now))
        apiserver.update(
            "pods", m.crash_looping(apiserver.get("pods", "ml", "train") or {}, now + 1)
        )
        pods_watch = service.watcher.pod_watches[0]
        wait(lambda: pods_watch.stats.published["MODIFIED"] == 2, "train's two changes")
        # The watch is lost and compacted away; meanwhile serve is deleted and a pod appears.
        apiserver.drop_watches()
        apiserver.delete("pods", "ml", "serve")
        apiserver.create("pods", m.gpu_pod("eval", "ml", created=now + 2))
        apiserver.update(
            "nodes", m.node_ready(apiserver.get("nodes", None, "gpu-node-1") or {}, False, now + 3)
        )
        apiserver.compact()
        wait(lambda: pods_watch.stats.relists["expired"] == 1, "the relist")
        wait(
            lambda: service.publishers[K8S_PODS.name].stats.sent == 6, "6 pod messages acknowledged"
        )
        wait(
            lambda: service.publishers[K8S_NODES.name].stats.sent == 2,
            "2 node messages acknowledged",
        )
        metrics = watcher_command.scrape(watcher_settings.metrics_port)
        assert (
            'gpuwatch_k8s_watcher_relists_total{namespace="",reason="expired",resource="pods"} 1.0'
            in metrics
        )
        assert 'gpuwatch_k8s_watcher_sent_total{topic="k8s.pods"} 6.0' in metrics
    finally:
        service.stop()

    prefix = scoped.kafka.topic_prefix
    pods: list[K8sPod] = decoded(
        consume(scoped, K8S_PODS.full_name(prefix)), K8S_PODS, validators[K8S_PODS.name]
    )
    nodes: list[K8sNode] = decoded(
        consume(scoped, K8S_NODES.full_name(prefix)), K8S_NODES, validators[K8S_NODES.name]
    )

    def story(name: str) -> list[tuple[str, str, str | None]]:
        # Records of one key share a partition: their order there is the publish order.
        return [
            (p.type, p.phase, p.containers[0].reason if p.containers else None)
            for p in pods
            if p.name == name
        ]

    assert story("serve") == [("RESYNC", "Running", None), ("DELETED", "Running", None)]
    assert story("train") == [
        ("RESYNC", "Pending", None),
        ("MODIFIED", "Running", None),
        ("MODIFIED", "Running", "CrashLoopBackOff"),
    ]
    assert story("eval") == [("ADDED", "Pending", None)]
    train = [p for p in pods if p.name == "train"]
    assert train[0].conditions[0].reason == "Unschedulable"
    assert train[0].gpu_request == {"nvidia.com/gpu": 8}
    assert [p.ts for p in train] == sorted(p.ts for p in train)
    assert [(n.type, n.node, n.ready) for n in nodes] == [
        ("RESYNC", "gpu-node-1", True),
        ("RESYNC", "gpu-node-1", False),
    ]


def test_the_command_watches_until_sigterm_and_reports(
    *,
    scoped: Settings,
    apiserver: FakeApiServer,
    kubeconfig: Path,
    free_port: Callable[[], int],
    consume: Consume,
    wait: Callable[..., None],
) -> None:
    apiserver.create(
        "pods", m.gpu_pod("p", "ml", created=time.time(), labels={"team": "vision", "secret": "x"})
    )
    apiserver.create("pods", m.gpu_pod("q", "other", created=time.time()))
    metrics_port = free_port()
    process = watcher_command.start(kubeconfig, scoped, metrics_port)
    with reaped(process):
        wait(lambda: apiserver.open_watches("pods") == 1, "the command's pod watch")
        apiserver.modify("pods", "ml", "p", lambda o: o["status"].update(phase="Running"))
        sent = 'gpuwatch_k8s_watcher_sent_total{topic="k8s.pods"} 2.0'
        wait(lambda: sent in watcher_command.scrape(metrics_port), "both pod messages acknowledged")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "k8s watcher started" in stderr
    # 1 pod + its change; a list of nodes, of pods/ml, of workloads/ml (Kueue served) and
    # of resourceslices (resource.k8s.io served)
    assert watcher_command.stopped(stderr) == ("2", "4", "2")
    records = consume(scoped, K8S_PODS.full_name(scoped.kafka.topic_prefix))
    values = [K8S_PODS.decode(r.value) for r in records]
    assert [(v.type, v.name, v.phase) for v in values] == [
        ("RESYNC", "p", "Pending"),
        ("MODIFIED", "p", "Running"),
    ]
    assert values[0].labels == {"team": "vision"}
    assert {r.path for r in apiserver.requests if r.params.get("watch")} == {
        "/api/v1/namespaces/ml/pods",
        "/api/v1/nodes",
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads",
        "/apis/resource.k8s.io/v1/resourceslices",
    }
