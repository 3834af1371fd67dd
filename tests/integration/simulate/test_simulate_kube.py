"""The simulation on the real kube-apiserver of the local stack (`gpuwatch simulate --kube`):
the simulator writes the cluster there as the scheduler and the kubelet would, the real
watcher watches it there, and a run starts by deleting an earlier run's objects, and
nothing else."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until
from support.publishing import AckingSender

from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.harness.simulate.kube.live import MANAGED_BY, SIMULATOR_LABELS, LiveApiServer
from gpuwatch.harness.simulate.runner import run_simulation, start_simulation
from gpuwatch.harness.simulate.scenario import load_scenario
from gpuwatch.harness.stack import kube
from producers.base.publisher import MessageSender
from schemas import K8S_PODS, NVML_SAMPLES, K8sPod, NvmlSample
from schemas.settings import Settings

S = 1000
SELECTOR = f"{MANAGED_BY}={SIMULATOR_LABELS[MANAGED_BY]}"
SMALL_PODS = {
    "serving/chat-serving-0",
    "research/notebook-ana-0",
    "research/llm-finetune-0",
    "research/vision-train-0",
    "research/vision-train-1",
    "research/bert-oom-0",
    "dev/dev-0",
    "dev/dev-1",
    "dev/dev-2",
}
TINY = """\
name: tiny
description: One node, one pod.
seed: 1
nodes:
  - pool: tiny
    count: 1
    model: h100
    gpus_per_node: 1
    sharing: exclusive
workloads:
  - name: solo
    kind: training
    namespace: ml
    team: t
    project: p
    gpus: 1
    pool: tiny
    start_s: 0
    pull_s: 1
    duration_s: 3600
"""


class Senders:
    """One acknowledging sender per topic, in place of the Kafka clients."""

    def __init__(self) -> None:
        self.by_topic: dict[str, AckingSender] = {}

    def __call__(self, topic: str, client_id: str) -> MessageSender:
        return self.by_topic.setdefault(topic, AckingSender())

    def pods(self, settings: Settings) -> list[K8sPod]:
        sender = self.by_topic[K8S_PODS.full_name(settings.kafka.topic_prefix)]
        return [K8S_PODS.decode(value) for _, value in list(sender.sent)]

    def samples(self, settings: Settings) -> list[NvmlSample]:
        sender = self.by_topic[NVML_SAMPLES.full_name(settings.kafka.topic_prefix)]
        return [NVML_SAMPLES.decode(value) for _, value in list(sender.sent)]


@pytest.fixture
def admin(kube_stack: Settings) -> Iterator[LiveApiServer]:
    """The stack's API server as its admin, writing without labels (as anyone else); the
    pod the test writes so is deleted after."""
    server = LiveApiServer(kube.api_url(kube_stack), kube.admin_kubeconfig(kube_stack))
    yield server
    if server.get("pods", "ml", "foreign-0") is not None:
        server.delete("pods", "ml", "foreign-0")
    server.close()


@pytest.fixture
def writer(kube_stack: Settings) -> Iterator[LiveApiServer]:
    """The API server as the simulator writes to it; what it leaves is deleted after."""
    server = LiveApiServer(
        kube.api_url(kube_stack), kube.admin_kubeconfig(kube_stack), labels=SIMULATOR_LABELS
    )
    yield server
    server.remove_leftovers()
    server.close()


def listed(server: LiveApiServer, resource: str, selector: str | None = None) -> dict[str, Any]:
    """Every object of `resource` on the server, by `namespace/name` (nodes: by name)."""
    prefix = "/apis/apps/v1" if resource == "replicasets" else "/api/v1"
    query = f"?labelSelector={selector}" if selector else ""
    items = server.request("GET", f"{prefix}/{resource}{query}")["items"]
    return {
        "/".join(filter(None, (i["metadata"].get("namespace"), i["metadata"]["name"]))): i
        for i in items
    }


def test_the_simulated_cluster_lives_on_the_real_server_and_the_watcher_follows_it(
    kube_stack: Settings, admin: LiveApiServer, writer: LiveApiServer, tmp_path: Path
) -> None:
    # An earlier run's leftovers (labelled), and somebody else's pod (not labelled).
    now = time.time()
    writer.create("pods", m.gpu_pod("leftover-0", "ml", created=now))
    writer.create("nodes", m.gpu_node("leftover-node", created=now))
    admin.create("pods", m.gpu_pod("foreign-0", "ml", created=now))
    senders = Senders()
    started = time.time()
    handle = start_simulation(
        kube_stack, load_scenario("small"), speed=20, senders=senders, api=writer
    )
    try:

        def running_on_the_server() -> dict[str, Any] | None:
            assert handle.running
            pods = listed(admin, "pods", SELECTOR)
            phases = {name: p["status"].get("phase") for name, p in pods.items()}
            done = set(pods) >= SMALL_PODS and phases["research/bert-oom-0"] == "Running"
            return pods if done else None

        on_server = wait_until(running_on_the_server, timeout_s=30, what="the pods Running")
        everything = listed(admin, "pods")
    finally:
        summary = handle.stop()
    assert summary is not None

    # The earlier run's objects went at the start; somebody else's pod stayed.
    assert "ml/leftover-0" not in everything
    assert "ml/foreign-0" in everything
    assert "leftover-node" not in listed(admin, "nodes")
    assert set(listed(admin, "nodes", SELECTOR)) == {"h100-0", "h100-1", "l40s-0"}
    bound = {n: p["spec"].get("nodeName") for n, p in on_server.items()}
    assert bound["research/vision-train-0"] == "h100-1"
    assert bound["serving/chat-serving-0"] == "h100-0"
    (owner,) = on_server["serving/chat-serving-0"]["metadata"]["ownerReferences"]
    assert f"serving/{owner['name']}" in listed(admin, "replicasets", SELECTOR)

    # The watcher published the server's pods, under the server's uids, up to Running.
    server_uids = {name: p["metadata"]["uid"] for name, p in listed(admin, "pods").items()}
    published = senders.pods(kube_stack)
    final = {f"{p.namespace}/{p.name}": p for p in published}
    assert set(final) >= SMALL_PODS
    for name in SMALL_PODS:
        assert final[name].uid == server_uids[name], name
    bert = [p for p in published if p.name == "bert-oom-0"]
    assert (bert[0].phase, bert[-1].phase) == ("Pending", "Running")
    # Created at 30 simulated seconds (1.5 s of wall time): the server's clock says when;
    # the kubelet's times are the simulation's own.
    epoch_s = summary.epoch_ms // S
    assert started - 1 <= bert[-1].created_at / S <= time.time()
    assert bert[-1].started_at == (epoch_s + 30) * S
    # A pod of the scenario's past shows as created, and started, when it was written.
    chat = final["serving/chat-serving-0"]
    assert started - 1 <= chat.created_at / S <= time.time()
    assert chat.phase == "Running"
    assert chat.started_at is not None
    assert chat.started_at >= chat.created_at
    # The node agents name pods by the server's uids: the samples meet the pods.
    allocated = {a.pod_uid for s in senders.samples(kube_stack) for a in s.allocations}
    assert allocated
    assert allocated <= set(server_uids.values())
    assert final["research/vision-train-0"].uid in allocated
    assert summary.pods["research/vision-train-0"] == "Running"

    # What a run leaves stays until the next run, which deletes it first.
    assert set(listed(admin, "pods", SELECTOR)) >= SMALL_PODS
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    run_simulation(
        kube_stack,
        load_scenario(str(scenario)),
        speed=50,
        until_s=3,
        duration_s=30,
        senders=Senders(),
        api=writer,
    )
    assert set(listed(admin, "pods", SELECTOR)) == {"ml/solo-0"}
    assert set(listed(admin, "nodes", SELECTOR)) == {"tiny-0"}
    assert listed(admin, "pods", SELECTOR)["ml/solo-0"]["status"]["phase"] == "Running"
    assert "ml/foreign-0" in listed(admin, "pods")
