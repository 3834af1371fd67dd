"""Clock and key sanity on the real broker: a sample dated hours ahead of the wall clock and
messages keyed by another identity are dead-lettered, and the healthy nodes' records are
those of a run without them."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.partitioner.default import murmur2
from topic_io import NewScope, consume_all, topic_scopes
from worker_fixtures import (
    FakeClock,
    Message,
    S,
    StartWorker,
    aligned_t0,
    decoded,
    pod_event,
    produce,
    recording_agent,
    wait_for,
)

from gpuwatch import kafka
from gpuwatch.harness.examples import example
from gpuwatch.harness.simulate.node import SimPod
from producers.agent.loop import NodeAgent
from schemas import (
    ALERTS,
    ATTRIBUTION,
    DEADLETTER,
    GPU_WINDOWS,
    K8S_NODES,
    K8S_PODS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
)
from schemas.settings import Settings

pytestmark = pytest.mark.integration

# The default partitioner puts a and b on partition 0 and c, alone, on partition 1; the node
# dated ahead hashes to partition 1 too, where taking its sample would leave c behind.
NODES = {"gwtest-clock-a": 0, "gwtest-clock-b": 0, "gwtest-clock-c": 1}
AHEAD = "gwtest-clock-ahead"
HOUR = 3_600 * S
AHEAD_OF_WALL = re.compile(
    r"^ts (\d+) is (\d+(?:\.\d+)?) s ahead of the wall clock (\d+), more than the clock skew "
    r"allowed \(300 s, GPUWATCH_MAX_CLOCK_SKEW_S\)$"
)


@pytest.fixture
def two_partitions(stack: Settings) -> Iterator[NewScope]:
    """Scopes whose topics have two partitions."""
    with topic_scopes(stack, partitions=2) as scope:
        yield scope


class Fleet:
    """Three healthy nodes, two single-GPU pods each (training, idle), sampled at 1 Hz
    from t0: the pods' events, then each second every node's sample, as messages."""

    def __init__(self, settings: Settings, t0: int, seconds: int) -> None:
        prefix = settings.kafka.topic_prefix
        self.samples_topic = NVML_SAMPLES.full_name(prefix)
        self.pods_topic = K8S_PODS.full_name(prefix)
        self.nodes_topic = K8S_NODES.full_name(prefix)
        self.pods: dict[str, list[SimPod]] = {}
        self.messages: list[Message] = []
        self.by_second: list[list[Message]] = []
        agents: list[NodeAgent] = []
        clocks: list[FakeClock] = []
        raws: list[list[tuple[bytes, bytes]]] = []
        for i, node in enumerate(NODES):
            clock = FakeClock(t0 / S)
            agent, _, pods, raw = recording_agent(node, clock, 2, seed=i, mix=("training", "idle"))
            clocks.append(clock)
            agents.append(agent)
            raws.append(raw)
            self.pods[node] = list(pods.pods.values())
            for n, pod in enumerate(self.pods[node]):
                event = pod_event(
                    pod.uid, pod.name, ts=t0 - 5 * S, rv=10 + n, node=node, created_at=t0 - 60 * S
                )
                self.messages.append(
                    (self.pods_topic, pod.uid.encode(), K8S_PODS.encode(event), None)
                )
        for _ in range(seconds):
            for clock, agent in zip(clocks, agents, strict=True):
                clock.now += 1.0
                agent.tick()
            self.by_second.append(
                [(self.samples_topic, k, v, None) for raw in raws for k, v in raw]
            )
            for raw in raws:
                raw.clear()

    def with_inserted(self, extra: dict[int, list[Message]]) -> list[Message]:
        """Every message, with `extra[s]` sent right after the samples of second `s`."""
        out = list(self.messages)
        for second, samples in enumerate(self.by_second):
            out += samples + extra.get(second, [])
        return out


def partition_of(key: bytes) -> int:
    """The partition of two the producer's default partitioner gives a key."""
    return (murmur2(key) & 0x7FFFFFFF) % 2


def sent_partitions(settings: Settings, messages: list[Message]) -> dict[bytes | None, set[int]]:
    """Produce the messages in order; the partitions each key went to."""
    producer = kafka.producer(settings.kafka, acks="all")
    where: dict[bytes | None, set[int]] = {}
    try:
        futures = [
            (key, producer.send(topic, key=key, value=value, partition=partition))
            for topic, key, value, partition in messages
        ]
        producer.flush(timeout=30)
        for key, future in futures:
            where.setdefault(key, set()).add(future.get(timeout=30).partition)
    finally:
        producer.close()
    return where


def records(settings: Settings, spec: Any) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record of a topic, sorted: the same run gives the same list."""
    topic = spec.full_name(settings.kafka.topic_prefix)
    return sorted((r.key, r.value) for r in consume_all(settings, topic))


def test_a_sample_dated_six_hours_ahead_is_dead_lettered_and_changes_no_other_record(
    two_partitions: NewScope, start_worker: StartWorker
) -> None:
    """Three healthy nodes on two partitions for 150 s; a fourth node's one sample, dated
    six hours ahead of the wall clock, between their samples of 60 s. Taken, it would move
    partition 1's stream time six hours on: its windows would all close, and node c would
    be silent for six hours (NodeTelemetryMissing)."""
    bad, clean = two_partitions(), two_partitions()
    t0 = aligned_t0()
    healthy = Fleet(bad, t0, 150)
    clock = FakeClock(time.time() + 6 * 3_600)
    agent, _, _, ahead = recording_agent(AHEAD, clock, 1, seed=9)
    agent.tick()
    ((key, value),) = ahead
    ahead_ts = NVML_SAMPLES.decode(value).ts
    where = sent_partitions(
        bad, healthy.with_inserted({60: [(healthy.samples_topic, key, value, None)]})
    )
    assert {name: where[name.encode()] for name in NODES} == {n: {p} for n, p in NODES.items()}
    assert where[AHEAD.encode()] == {1}
    produce(clean, Fleet(clean, t0, 150).with_inserted({}))
    workers = {"bad": start_worker(bad, "bad"), "clean": start_worker(clean, "clean")}

    def closed(settings: Settings) -> bool:
        # Two windows of 6 GPUs and of 6 pods close by 150 s ([t0, t0 + 120 s)).
        return min(len(decoded(settings, GPU_WINDOWS)), len(decoded(settings, ATTRIBUTION))) >= 12

    wait_for("the clean run's windows", lambda: closed(clean), workers["clean"])
    wait_for("the windows beside the sample ahead", lambda: closed(bad), workers["bad"])
    wait_for("the dead letter", lambda: decoded(bad, DEADLETTER), workers["bad"])
    for worker in workers.values():
        worker.stop()
        assert worker.process.returncode == 0, worker.log

    (letter,) = decoded(bad, DEADLETTER)
    assert (letter.source_topic, letter.key, letter.partition) == (
        healthy.samples_topic,
        AHEAD,
        1,
    )
    assert letter.raw_bytes() == value
    found = AHEAD_OF_WALL.match(letter.error)
    assert found is not None, letter.error
    ts, seconds, wall = int(found[1]), float(found[2]), int(found[3])
    assert ts == ahead_ts
    assert seconds == (ts - wall) / 1000
    assert 6 * HOUR - 120 * S < ts - wall < 6 * HOUR  # the wall clock when it was read
    assert workers["bad"].counters()["deadletter"] == 1
    assert workers["clean"].counters()["deadletter"] == 0
    assert decoded(clean, DEADLETTER) == []

    for spec in (GPU_WINDOWS, ATTRIBUTION):
        assert records(bad, spec) == records(clean, spec), spec.name
    windows = decoded(bad, GPU_WINDOWS)
    assert sorted({w.window_start - t0 for w in windows}) == [0, 60 * S]
    assert {w.node for w in windows} == set(NODES)
    missing = [a for a in decoded(bad, ALERTS) if a.name == "NodeTelemetryMissing"]
    assert missing == []


def test_messages_keyed_by_another_identity_are_dead_lettered_and_start_no_second_state(
    two_partitions: NewScope, start_worker: StartWorker
) -> None:
    """Node c's sample keyed by node a (partition 0), node a's sample without a key sent to
    partition 1, a pod event keyed by a uid of the other partition and a node event keyed by
    another node. Taken, each would start a second state of its node or pod on another
    partition: a second copy of its GPU windows, of its pod's start."""
    scoped = two_partitions()
    t0 = aligned_t0()
    fleet = Fleet(scoped, t0, 90)
    a, _, c = NODES
    topic = fleet.samples_topic
    of_c = next(v for _, k, v, _ in fleet.by_second[40] if k == c.encode())
    of_a = next(v for _, k, v, _ in fleet.by_second[41] if k == a.encode())
    pod_a = fleet.pods[a][0]
    # A pod whose uid hashes to the other partition than pod_a's.
    other = next(
        p for pods in fleet.pods.values() for p in pods
        if partition_of(p.uid.encode()) != partition_of(pod_a.uid.encode())
    )  # fmt: skip
    event = pod_event(pod_a.uid, pod_a.name, ts=t0 + 50 * S, rv=40, node=a, created_at=t0 - 60 * S)
    node_event = K8S_NODES.value_type(**{**example("gpuwatch.k8s.node/v1"), "node": a, "ts": t0})
    wrong: list[tuple[Message, str]] = [
        ((topic, a.encode(), of_c, None), f"key '{a}' is not the value's node name '{c}'"),
        ((topic, None, of_a, 1), f"no key: the key must be the value's node name '{a}'"),
        (
            (fleet.pods_topic, other.uid.encode(), K8S_PODS.encode(event), None),
            f"key '{other.uid}' is not the value's pod uid '{pod_a.uid}'",
        ),
        (
            (fleet.nodes_topic, c.encode(), K8S_NODES.encode(node_event), None),
            f"key '{c}' is not the value's node name '{a}'",
        ),
    ]
    produce(scoped, fleet.with_inserted({41: [m for m, _ in wrong]}))
    worker = start_worker(scoped)

    def done() -> bool:
        wanted = {GPU_WINDOWS: 6, ATTRIBUTION: 6, DEADLETTER: 4}
        return all(len(decoded(scoped, spec)) >= n for spec, n in wanted.items())

    wait_for("the first windows and the dead letters", done, worker)
    worker.stop()
    assert worker.process.returncode == 0, worker.log

    letters = decoded(scoped, DEADLETTER)
    assert sorted(d.error for d in letters) == sorted(reason for _, reason in wrong)
    by_error = {d.error: d for d in letters}
    for (sent_topic, key, value, _), reason in wrong:
        letter = by_error[reason]
        assert letter.source_topic == sent_topic
        assert letter.key == (None if key is None else key.decode())
        assert letter.raw_bytes() == value
    assert worker.counters()["deadletter"] == 4
    # One copy of each GPU's and pod's first window, and of each pod's start: no second state.
    windows = [(w.uuid, w.window_start) for w in decoded(scoped, GPU_WINDOWS)]
    assert sorted(windows) == sorted(set(windows))
    assert {(w.node, w.window_start - t0) for w in decoded(scoped, GPU_WINDOWS)} == {
        (node, 0) for node in NODES
    }
    pods = [(r.uid, r.window_start) for r in decoded(scoped, ATTRIBUTION)]
    assert len(pods) == len(set(pods)) == 6
    starts = [(r.uid, r.to_state) for r in decoded(scoped, POD_LIFECYCLE) if r.from_state is None]
    assert len(starts) == len(set(starts)) == 6
