"""The fleet of `gpuwatch bench worker`: its node samples and pod events, sent backlogged or paced.

Each node is a simulated 8-GPU node (`simple_node`: training, inference, notebook and idle
pods, one per GPU) sampled by the real `NodeAgent` on a clock of its own, so messages are
what agents send (about 5.7 kB each, processes and allocations included). Nodes tick at
phases spread over the second, as a real fleet does. The backlog is sent one message per
record batch, as each node's own producer sends it; the paced load comes from one producer
for the whole fleet, so its batches hold several nodes' samples.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gpuwatch.harness.simulate.node import SimPod, simple_node
from producers.agent.loop import NodeAgent
from schemas.ids import NodeName
from schemas.k8s_pod import Condition, ContainerStatus, K8sPod, Owner
from schemas.nvml_sample import NvmlSample
from schemas.settings import KafkaSettings
from schemas.topics import K8S_PODS, NVML_SAMPLES
from streams.faust.clients import aiokafka_producer

__all__ = ["Fleet", "PacedResult", "build_fleet", "pace", "pod_event", "produce", "send_live"]

S = 1000
POD_EVENTS_BEFORE_MS = 5 * S  # pods are running before the first sample
POD_AGE_MS = 600 * S  # created ten minutes before
TEAMS = 20  # pods carry one of 20 team labels, as a shared cluster's namespaces do
ONE_PER_BATCH = 1  # bytes: every message exceeds it, so each is a record batch of its own
PACED_BATCH_BYTES = 256 << 10  # the paced producer batches many nodes: one process, 5,000 nodes
PACED_LINGER_MS = 5  # a few ms of batching: small against the latency measured
SEND_DEADLINE_S = 120.0  # the broker acknowledges a backlog of 50,000 messages within this


class _NodeClock:
    """A node's clocks, moved by the fleet: event time is what the bench says."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


@dataclass
class Fleet:
    """Every message of the backlog, and what the paced phase sends next."""

    nodes: list[str]
    gpus: int
    seconds: int
    backlog: list[tuple[bytes, bytes]]
    """Node samples (key, value), second by second, each node once a second."""
    pod_events: list[tuple[bytes, bytes]]
    """One ADDED event per pod (key: pod uid), Running on its node."""
    last: list[NvmlSample]
    """Each node's last backlog sample: the paced phase goes on from it, one second a round."""
    watched: dict[int, str] = field(default_factory=dict)
    """Node index -> uuid of its first GPU: the GPUs whose Redis state the latency probe reads."""

    @property
    def messages(self) -> int:
        """Node samples in the backlog."""
        return len(self.backlog)

    @property
    def gpu_samples(self) -> int:
        """GPU-samples in the backlog."""
        return self.messages * self.gpus

    @property
    def pods(self) -> int:
        """Pods of the fleet (the worker tracks every one)."""
        return len(self.pod_events)

    @property
    def mean_bytes(self) -> float:
        """Mean size of a node sample."""
        return sum(len(value) for _, value in self.backlog) / max(1, self.messages)

    def paced_end(self, node: int, round_: int) -> int:
        """End time of a node's sample in a round of the paced phase (0: its last backlog one)."""
        last = self.last[node]
        return last.ts + (round_ + 1) * last.interval_ms

    def paced(self, index: int) -> tuple[bytes, bytes, str, int]:
        """The `index`-th message of the paced phase: key, value, watched uuid or "", end ms."""
        nodes = len(self.nodes)
        node, round_ = index % nodes, index // nodes + 1
        last = self.last[node]
        sample = msgspec.structs.replace(
            last, ts=last.ts + round_ * last.interval_ms, seq=last.seq + round_
        )
        end = sample.ts + sample.interval_ms
        return (
            self.nodes[node].encode(),
            NVML_SAMPLES.encode(sample),
            self.watched.get(node, ""),
            end,
        )


def build_fleet(
    nodes: int, gpus: int, seconds: int, t0_ms: int, watch: int, *, interval_s: float = 1.0
) -> Fleet:
    """`nodes` simulated nodes sampled every `interval_s` for `seconds` from `t0_ms`, and
    their pods' events.

    `watch` nodes, spread over the fleet, have their first GPU read by the latency probe.
    """
    names = [f"bench-node-{i:05d}" for i in range(nodes)]
    clocks: list[_NodeClock] = []
    agents: list[NodeAgent] = []
    backlog: list[tuple[bytes, bytes]] = []
    pod_events: list[tuple[bytes, bytes]] = []
    for i, name in enumerate(names):
        # The first tick claims the nominal interval, ending at the clock: ts = t0 + phase.
        clock = _NodeClock((t0_ms + S + i * S // nodes) / S)
        reader, pods = simple_node(name, gpus, seed=i, now=clock.time)
        agent = NodeAgent(
            node=name,
            reader=reader,
            resolver=pods,
            allocations=pods,
            publish=lambda key, value: backlog.append((key, value)),
            interval_s=interval_s,
            clock=clock,
        )
        clocks.append(clock)
        agents.append(agent)
        for pod in pods.pods.values():
            event = pod_event(pod, name, t0_ms, team=f"team-{i % TEAMS:02d}")
            pod_events.append((pod.uid.encode(), K8S_PODS.encode(event)))
    last: list[NvmlSample] = []
    rounds = max(1, round(seconds / interval_s))
    for round_ in range(rounds):
        for clock, agent in zip(clocks, agents, strict=True):
            sample = agent.tick()
            clock.now += interval_s
            if round_ == rounds - 1:
                last.append(sample)
    step = max(1, nodes // max(1, watch))
    watched = {i: str(last[i].gpus[0].uuid) for i in range(0, nodes, step)[:watch]} if last else {}
    return Fleet(names, gpus, seconds, backlog, pod_events, last, watched)


def pod_event(pod: SimPod, node: str, t0_ms: int, team: str) -> K8sPod:
    """The `k8s.pods` ADDED event of a pod running on `node` since before `t0_ms`."""
    created = t0_ms - POD_AGE_MS
    return K8sPod(
        schema="gpuwatch.k8s.pod/v1",
        type="ADDED",
        ts=t0_ms - POD_EVENTS_BEFORE_MS,
        resource_version="1",
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node=NodeName(node),
        phase="Running",
        created_at=created,
        scheduled_at=created + S,
        started_at=created + 2 * S,
        finished_at=None,
        gpu_request={pod.resource: len(pod.gpu_uuids)},
        conditions=(Condition(type="PodScheduled", status="True", reason=None, message=None),),
        containers=(
            ContainerStatus(
                name=pod.container, state="running", reason=None, exit_code=None, restarts=0
            ),
        ),
        labels={"team": team},
        owner=Owner(kind="Job", name=pod.name),
        priority_class=None,
        queue=None,
    )


def _producer(kafka: KafkaSettings, **options: Any) -> Any:
    return aiokafka_producer(
        kafka,
        client_id="gpuwatch-bench",
        acks=1,
        compression_type="lz4",  # as the agents and the watcher send
        request_timeout_ms=30_000,
        **options,
    )


async def produce(kafka: KafkaSettings, topic: str, messages: Iterable[tuple[bytes, bytes]]) -> int:
    """Send every (key, value), each in a record batch of its own; acknowledged on return."""
    producer = _producer(kafka, max_batch_size=ONE_PER_BATCH, linger_ms=0)
    await producer.start()
    sent = 0
    try:
        futures = []
        for key, value in messages:
            futures.append(await producer.send(topic, value, key=key))
            sent += 1
        await asyncio.wait_for(asyncio.gather(*futures), SEND_DEADLINE_S)
    finally:
        await producer.stop()
    return sent


@dataclass(frozen=True)
class PacedResult:
    """What the paced producer did."""

    target_messages_per_s: float
    messages: int
    seconds: float
    """From the first send to the last send returning."""
    sent_at: dict[tuple[str, int], float]
    """(watched GPU uuid, sample end ms) -> wall time the sample was handed to the client."""

    @property
    def achieved_messages_per_s(self) -> float:
        """Messages per second the producer managed."""
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def pace(
    kafka: KafkaSettings, topic: str, fleet: Fleet, messages_per_s: float, seconds: float
) -> PacedResult:
    """Send the fleet's next samples at a steady rate for `seconds`, nodes in turn."""
    producer = _producer(kafka, max_batch_size=PACED_BATCH_BYTES, linger_ms=PACED_LINGER_MS)
    await producer.start()
    total = max(1, int(messages_per_s * seconds))
    sent_at: dict[tuple[str, int], float] = {}
    futures = []
    started = time.monotonic()
    try:
        index = 0
        while index < total:
            due = min(total, int((time.monotonic() - started) * messages_per_s) + 1)
            while index < due:
                key, value, watched, end = fleet.paced(index)
                now = time.time()
                futures.append(await producer.send(topic, value, key=key))
                if watched:
                    sent_at[(watched, end)] = now
                index += 1
            await asyncio.sleep(0.002)
        elapsed = time.monotonic() - started
        await asyncio.wait_for(asyncio.gather(*futures), SEND_DEADLINE_S)
    finally:
        await producer.stop()
    return PacedResult(messages_per_s, total, elapsed, sent_at)


async def send_live(
    kafka: KafkaSettings, topic: str, messages: Iterable[tuple[float, bytes, bytes]]
) -> list[float]:
    """Send each (due wall time, key, value) at its time, as an agent does at a sample's end.

    Returns the wall time each was handed to the client; acknowledged on return.
    """
    producer = _producer(kafka, linger_ms=0)
    await producer.start()
    sent_at: list[float] = []
    try:
        futures = []
        for due, key, value in messages:
            await asyncio.sleep(max(0.0, due - time.time()))
            sent_at.append(time.time())
            futures.append(await producer.send(topic, value, key=key))
        await asyncio.wait_for(asyncio.gather(*futures), SEND_DEADLINE_S)
    finally:
        await producer.stop()
    return sent_at
