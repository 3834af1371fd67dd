"""The whole simulation without Kafka: the real agents and the real watcher (through the
`kubernetes` client and the in-process API server) publishing into recording senders."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from support import wait_until

from gpuwatch.config import load_settings
from gpuwatch.harness.simulate.runner import run_simulation, start_simulation
from gpuwatch.harness.simulate.scenario import load_scenario
from producers.base.publisher import Done, MessageSender
from schemas import K8S_NODES, K8S_PODS, NVML_SAMPLES, K8sNode, K8sPod, NvmlSample
from schemas.settings import Settings

EPOCH = 1_764_400_000  # 2025-11-29 07:06:40 UTC
S = 1000


@dataclass
class Recorder:
    """A MessageSender that keeps what it is given and acknowledges at once."""

    topic: str
    messages: list[tuple[bytes, bytes]] = field(default_factory=list)

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.messages.append((key, value))
        done(None)

    def flush(self, timeout_s: float) -> None:
        """Nothing is held."""

    def close(self, timeout_s: float) -> None:
        """Nothing to release."""


@dataclass
class Recorders:
    by_topic: dict[str, Recorder] = field(default_factory=dict)

    def __call__(self, topic: str, client_id: str) -> MessageSender:
        self.by_topic[topic] = Recorder(topic)
        return self.by_topic[topic]

    def values(self, settings: Settings, name: str) -> list[bytes]:
        full = {"nvml": NVML_SAMPLES, "pods": K8S_PODS, "nodes": K8S_NODES}[name]
        return [
            value
            for _, value in self.by_topic[full.full_name(settings.kafka.topic_prefix)].messages
        ]


@pytest.fixture
def settings() -> Settings:
    return load_settings(env={}, overrides={"kafka.topic_prefix": "sim-offline."})


def last_by_name(pods: list[K8sPod]) -> dict[str, K8sPod]:
    return {pod.name: pod for pod in pods}


def test_the_incident_reaches_the_topics_as_the_scenario_says(settings: Settings) -> None:
    recorders = Recorders()

    summary = run_simulation(
        settings,
        load_scenario("incident"),
        speed=2000,
        until_s=500,
        duration_s=60,
        epoch_s=EPOCH,
        senders=recorders,
    )

    assert summary.ticks == 500
    assert summary.end_ms == (EPOCH + 500) * S
    assert summary.pods["nlp/broken-trainer-0"] == "CrashLoopBackOff"
    assert summary.pods["research/big-train-0"] == "Pending"
    assert summary.unschedulable["research/big-train-0"] == (
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    samples = [NVML_SAMPLES.decode(v) for v in recorders.values(settings, "nvml")]
    pods = [K8S_PODS.decode(v) for v in recorders.values(settings, "pods")]
    nodes = [K8S_NODES.decode(v) for v in recorders.values(settings, "nodes")]
    # h100-2's agent sends no sample of the intervals from 400 s to 490 s: 90 fewer.
    assert len(samples) == summary.samples == 3 * 500 - 90
    assert summary.sent == {
        "nvml.samples": 3 * 500 - 90, "k8s.pods": len(pods), "k8s.nodes": 3, "k8s.workloads": 0
    }  # fmt: skip
    check_samples(samples)
    check_pods(pods)
    check_nodes(nodes)


def check_samples(samples: list[NvmlSample]) -> None:
    by_node: dict[str, list[NvmlSample]] = {}
    for sample in samples:
        by_node.setdefault(sample.node, []).append(sample)
    assert sorted(by_node) == ["h100-0", "h100-1", "h100-2"]
    # Event time tiles from the epoch, one second per tick, the same on every node.
    for node in ("h100-0", "h100-1"):
        assert [s.ts for s in by_node[node]] == [(EPOCH + i) * S for i in range(500)]
        assert [s.seq for s in by_node[node]] == list(range(500))
    down = [s.ts // S - EPOCH for s in by_node["h100-2"]]
    assert down == [*range(400), *range(490, 500)]
    # The leak: from 125 s a process of leaky-eval on h100-0's GPU 3, which nobody holds.
    h100_0 = by_node["h100-0"]
    before, after = h100_0[123], h100_0[126]  # intervals [123, 124) read at 124; [126, 127)
    leaky_gpu = after.gpus[3]
    (process,) = leaky_gpu.processes
    assert process.pod_uid is not None
    assert all(process.pod_uid != a.pod_uid for a in after.allocations)
    assert all(leaky_gpu.uuid not in a.device_ids for a in after.allocations)
    assert before.gpus[3].processes == ()
    # idle-job holds GPUs 1 and 2 of h100-0 at 0 %.
    idle = [a for a in after.allocations if a.pod == "idle-job-0"]
    assert [len(a.device_ids) for a in idle] == [2]
    assert {g.util_pct for g in after.gpus if g.uuid in idle[0].device_ids} == {0.0}
    # oom-job holds a GPU of h100-1 until it is OOMKilled at 185 s.
    h100_1 = by_node["h100-1"]
    assert any(a.pod == "oom-job-0" for a in h100_1[183].allocations)
    assert not any(a.pod == "oom-job-0" for a in h100_1[185].allocations)


def check_pods(pods: list[K8sPod]) -> None:
    final = last_by_name(pods)
    assert sorted(final) == [
        "big-train-0",
        "broken-trainer-0",
        "chat-serving-0",
        "done-job-0",
        "forgotten-notebook-0",
        "idle-job-0",
        "leaky-eval-0",  # requests no GPU: published because the simulation names it
        "oom-job-0",
        "train-a-0",
    ]
    oom = final["oom-job-0"]
    assert (oom.phase, oom.finished_at, oom.node) == ("Failed", (EPOCH + 185) * S, "h100-1")
    assert [(c.reason, c.exit_code) for c in oom.containers] == [("OOMKilled", 137)]
    assert oom.ts == (EPOCH + 185) * S
    done = final["done-job-0"]
    assert (done.phase, done.finished_at) == ("Succeeded", (EPOCH + 245) * S)
    big = final["big-train-0"]
    assert (big.phase, big.node, big.gpu_request) == ("Pending", None, {"nvidia.com/gpu": 4})
    (scheduled,) = big.conditions
    assert (scheduled.type, scheduled.status, scheduled.reason) == (
        "PodScheduled",
        "False",
        "Unschedulable",
    )
    assert big.created_at == (EPOCH + 60) * S
    crash = [p for p in pods if p.name == "broken-trainer-0"]
    waiting = [p for p in crash if p.containers and p.containers[0].reason == "CrashLoopBackOff"]
    # Crashes at 35, 75, 125, 195, 305, 495 s, each published at its own event time.
    assert [p.ts // S - EPOCH for p in waiting] == [35, 75, 125, 195, 305, 495]
    assert [p.containers[0].restarts for p in waiting] == [1, 2, 3, 4, 5, 6]
    assert {(p.containers[0].exit_code, p.phase) for p in waiting} == {(137, "Running")}
    leak = final["leaky-eval-0"]
    assert (leak.phase, leak.node, leak.gpu_request) == ("Running", "h100-0", {})
    assert final["chat-serving-0"].owner is not None
    assert final["chat-serving-0"].owner.kind == "Deployment"
    assert final["train-a-0"].labels == {
        "team": "vision",
        "project": "detector",
        "app.kubernetes.io/name": "train-a",
    }


def check_nodes(nodes: list[K8sNode]) -> None:
    assert sorted(n.node for n in nodes) == ["h100-0", "h100-1", "h100-2"]
    for node in nodes:
        assert node.gpu_capacity == {"nvidia.com/gpu": 4}
        assert node.gpu_product == "NVIDIA-H100-80GB-HBM3"
        assert node.labels["karpenter.sh/nodepool"] == "h100"
        assert node.ready


def test_a_background_simulation_stops_on_request_with_a_summary(settings: Settings) -> None:
    recorders = Recorders()
    handle = start_simulation(
        settings, load_scenario("small"), speed=50, epoch_s=EPOCH, senders=recorders
    )

    def sampled() -> bool:
        assert handle.running
        return bool(recorders.by_topic and recorders.values(settings, "nvml"))

    wait_until(sampled, timeout_s=30, what="a sample", interval_s=0.05)

    summary = handle.stop()

    assert summary is not None
    assert not handle.running
    assert summary.ticks >= 1
    assert summary.samples == 3 * summary.ticks
    assert len(recorders.values(settings, "nvml")) == summary.samples
    assert summary.pods["research/llm-finetune-0"] == "Running"
