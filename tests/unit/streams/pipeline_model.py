"""The worker's stream logic over in-memory topic logs, in any order of arrival.

Everything the worker runs is here except Faust and Kafka: the agent loops (batches, the
barrier of `Progress`, positions), the node and pod partitions, the tick timer's claims
and end offsets. Topics are lists per partition; `Pipeline.step` delivers what a schedule
picks next (so a test can read every pod event first, every sample first, or interleave
them as a live worker would), `tick` sends one tick to every partition as `TickSender`
does, and `drain` ends with every input read and the ticks applied until nothing moves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from histories import Input, partition_of

from schemas import (
    ALERTS,
    ATTRIBUTION,
    CAPACITY,
    GPU_WINDOWS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    POD_USAGE,
    WORKLOAD_LIFECYCLE,
)
from schemas.prices import BUILTIN_PRICES
from schemas.settings import RuleSettings, WindowSettings
from streams.core.integrals import PriceBook
from streams.core.ticks import Tick, claims_of, encode_tick
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Record
from streams.processors.pod import PodConfig, PodPartition
from streams.runtime.agent_loop import POSITIONS, AgentLoop, Message

PREFIX = "pm."
TICKS = f"{PREFIX}pm.ticks"
FLEET = f"{PREFIX}pm.fleet"
SAMPLES = NVML_SAMPLES.full_name(PREFIX)
NODES = K8S_NODES.full_name(PREFIX)
PODS = K8S_PODS.full_name(PREFIX)
USAGE = POD_USAGE.full_name(PREFIX)
WORKLOADS = K8S_WORKLOADS.full_name(PREFIX)
POD_TICKED = (PODS, USAGE, WORKLOADS)
DERIVED = {
    spec.full_name(PREFIX): spec
    for spec in (POD_LIFECYCLE, ATTRIBUTION, GPU_WINDOWS, ALERTS, CAPACITY, WORKLOAD_LIFECYCLE)
}


class MemTable:
    """A state table of one agent: key/value by partition."""

    def __init__(self) -> None:
        self.data: dict[int, dict[bytes, bytes]] = {}

    def load(self, partition: int) -> list[tuple[bytes, bytes]]:
        return list(self.data.get(partition, {}).items())

    def write(self, partition: int, key: bytes, value: bytes | None) -> None:
        part = self.data.setdefault(partition, {})
        if value is None:
            part.pop(key, None)
        else:
            part[key] = value


class MemJournal:
    """The writes of one state write, in order, by partition (what a crash may cut short)."""

    def __init__(self) -> None:
        self.writes: dict[int, list[tuple[bytes, bytes | None]]] = {}

    def load(self, partition: int) -> list[tuple[bytes, bytes]]:
        raise AssertionError("a state write reads nothing")

    def write(self, partition: int, key: bytes, value: bytes | None) -> None:
        self.writes.setdefault(partition, []).append((key, value))


@dataclass
class Pipeline:
    """One worker owning every partition, over in-memory logs."""

    partitions: int
    rules: RuleSettings
    windows: WindowSettings
    idle_after_ms: int = 60_000
    input_end_ms: int | None = None
    end_ms: int | None = None
    """Where the input ends, told the worker once everything is read and settled (as a
    replay of a range is), so that every window of it closes; None: left open."""
    batch: int = 50
    logs: dict[str, list[list[tuple[bytes, bytes]]]] = field(default_factory=dict)
    derived: list[tuple[str, bytes]] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    fleet: bool = True
    """Whether the worker runs the fleet partition (capacity and fragmentation)."""
    state_every: int = 1
    """Batches between two state writes of an agent (the worker's `STATE_EVERY_S`)."""
    batches: int = 0
    """Batches delivered so far."""

    def __post_init__(self) -> None:
        for topic in (SAMPLES, NODES, PODS, USAGE, WORKLOADS, TICKS, FLEET):
            self.logs[topic] = [[] for _ in range(self.partitions)]
        self.loop = asyncio.new_event_loop()
        self.node_table, self.pod_table = MemTable(), MemTable()
        self.node = self._agent("node", (SAMPLES, NODES), self.node_table, self._node)
        pod_inputs = (PODS, USAGE, WORKLOADS, FLEET) if self.fleet else (PODS, USAGE, WORKLOADS)
        self.pod = self._agent("pod", pod_inputs, self.pod_table, self._pod, ticked=POD_TICKED)
        self.read: dict[str, dict[tuple[str, int], int]] = {"node": {}, "pod": {}}

    def close(self) -> None:
        self.loop.close()

    # --- wiring as streams.faust.app wires the worker

    def _node(self, partition: int, stored: list[tuple[bytes, bytes]]) -> NodePartition:
        config = NodeConfig(
            prefix=PREFIX,
            window_ms=self.windows.window_s * 1000,
            lateness_ms=self.windows.allowed_lateness_s * 1000,
            rules=self.rules,
            prices=PriceBook(BUILTIN_PRICES),
            partitions=self.partitions,
            idle_after_ms=self.idle_after_ms,
            horizon_ms=self.windows.revision_horizon_s * 1000,
            input_end_ms=self.input_end_ms,
            fleet_topic=FLEET if self.fleet else None,
        )
        return NodePartition(partition, config, self.counters, stored)

    def _pod(self, partition: int, stored: list[tuple[bytes, bytes]]) -> PodPartition:
        config = PodConfig(
            PREFIX,
            self.partitions,
            self.rules,
            self.windows,
            fleet_topic=FLEET if self.fleet else None,
        )
        return PodPartition(partition, config, self.counters, stored)

    def _agent(
        self,
        name: str,
        inputs: tuple[str, ...],
        table: MemTable,
        make: Callable[[int, list[tuple[bytes, bytes]]], Any],
        ticked: tuple[str, ...] | None = None,
    ) -> AgentLoop:
        async def flush() -> None:
            return None

        return AgentLoop(
            name=name,
            inputs=inputs,
            tick_topic=TICKS,
            table=table,
            make=make,
            outputs=Outputs(PREFIX, self.counters, now_ms=lambda: 0),
            committed=lambda topic, partition: None,
            send=self._send,
            flush=flush,
            start_of=lambda topic, partition: 0,
            ticked=ticked,
            monotonic=lambda: float(self.batches),  # the loops' clock: a second a batch
            state_every_s=self.state_every - 0.5,
        )

    def _send(self, record: Record) -> None:
        if record.topic == USAGE:
            self.append(USAGE, record.key, record.value)
        elif record.topic == FLEET:
            assert record.partition is not None
            self.logs[FLEET][record.partition].append((record.key, record.value))
        elif record.topic in DERIVED:
            self.derived.append((record.topic, record.value))
        else:
            assert record.topic.endswith("deadletter"), record.topic
            self.derived.append((record.topic, record.value))

    def restart(self, tear: random.Random | None = None) -> None:
        """Both agents stop as a crash stops them, after their last state write, and start
        again: each partition is made from the table and read from the positions stored.

        With `tear`, the crash comes while that write is being sent: of each partition's
        records of it (keys, then the positions) only a prefix of a random length is
        stored, as the producer's record batches get to the changelog one by one."""
        for loop, table in ((self.node, self.node_table), (self.pod, self.pod_table)):
            if tear is None:
                loop._write_state()
                continue
            sent = MemJournal()
            loop._table = sent
            loop._write_state()
            loop._table = table
            for partition, writes in sorted(sent.writes.items()):
                for key, value in writes[: tear.randint(0, len(writes))]:
                    table.write(partition, key, value)
        self.node = self._agent("node", self.node.progress.inputs, self.node_table, self._node)
        self.pod = self._agent(
            "pod", self.pod.progress.inputs, self.pod_table, self._pod, ticked=POD_TICKED
        )
        for agent, loop, table in (
            ("node", self.node, self.node_table),
            ("pod", self.pod, self.pod_table),
        ):
            read = self.read[agent]
            for partition in range(self.partitions):
                raw = dict(table.load(partition)).get(POSITIONS)
                stored = {} if raw is None else json.loads(raw)
                for topic in loop.progress.inputs:
                    read[(topic, partition)] = stored.get(topic, 0)

    # --- the broker

    def append(self, topic: str, key: bytes, value: bytes) -> None:
        """Produce one message, partitioned by key."""
        self.logs[topic][partition_of(key, self.partitions)].append((key, value))

    def produce(self, inputs: Iterable[Input]) -> None:
        """Produce input messages in the order given."""
        for m in inputs:
            topic = {
                NVML_SAMPLES.name: SAMPLES,
                K8S_NODES.name: NODES,
                K8S_WORKLOADS.name: WORKLOADS,
            }.get(m.spec.name, PODS)
            self.append(topic, m.key, m.value)

    def available(self, agent: str, topic: str) -> list[int]:
        """Partitions of a topic with messages the agent has not read."""
        read = self.read[agent]
        return [p for p, log in enumerate(self.logs[topic]) if read.get((topic, p), 0) < len(log)]

    def deliver(self, agent: str, topic: str, partition: int, limit: int | None = None) -> int:
        """Hand the agent its next messages of one topic partition; how many."""
        read = self.read[agent]
        start = read.get((topic, partition), 0)
        log = self.logs[topic][partition]
        end = len(log) if limit is None else min(len(log), start + limit)
        if end <= start:
            return 0
        messages = [Message(topic, partition, o, *log[o]) for o in range(start, end)]
        read[(topic, partition)] = end
        self.batches += 1
        loop = self.node if agent == "node" else self.pod
        self.loop.run_until_complete(loop.process(messages))
        return end - start

    def tick(self) -> None:
        """One tick to every partition, as `TickSender` makes them."""
        claims, idle = claims_of(self.node.partitions, range(self.partitions))
        inputs = (SAMPLES, NODES, PODS, USAGE, WORKLOADS)
        for q in range(self.partitions):
            tick = Tick(
                sender="model",
                claims=claims,
                idle=idle,
                ends={topic: len(self.logs[topic][q]) for topic in inputs},
                starts={topic: 0 for topic in inputs},
            )
            self.logs[TICKS][q].append((b"", encode_tick(tick)))

    # --- schedules

    def step(self, order: list[tuple[str, str]]) -> str | None:
        """Deliver one batch from the first (agent, topic) in `order` that has any: its topic."""
        for agent, topic in order:
            parts = self.available(agent, topic)
            if parts:
                self.deliver(agent, topic, parts[0], None if topic == TICKS else self.batch)
                return topic
        return None

    def drain(self, order: list[tuple[str, str]], tick_every: int = 5) -> None:
        """Read everything in `order`'s priority, a tick every few data batches, then settle."""
        n = 0
        while (topic := self.step(order)) is not None:
            if topic != TICKS:
                n += 1
                if n % tick_every == 0:
                    self.tick()
        self.settle()

    def settle(self, rounds: int = 8) -> None:
        """Ticks until everything is read and nothing more comes out."""
        everything = [(a, t) for a in ("node", "pod") for t in (TICKS,)]
        everything += [("node", SAMPLES), ("node", NODES), ("pod", PODS), ("pod", USAGE)]
        everything += [("pod", WORKLOADS), ("pod", FLEET)]
        quiet = 0
        while quiet < rounds:
            before = (len(self.derived), sum(len(p) for p in self.logs[USAGE]))
            self.tick()
            while self.step(everything) is not None:
                pass
            after = (len(self.derived), sum(len(p) for p in self.logs[USAGE]))
            quiet = quiet + 1 if after == before else 0

    def newest(self) -> dict[str, dict[tuple[Any, ...], Any]]:
        """The newest revision of each window record (attribution, gpu.windows) by identity,
        as a consumer that keeps the highest revision (the later of two equal) ends with."""
        out: dict[str, dict[tuple[Any, ...], Any]] = {}
        for topic, value in self.derived:
            name = topic.removeprefix(PREFIX)
            key = {"attribution": "uid", "gpu.windows": "uuid"}.get(name)
            if key is None:
                continue
            record = json.loads(value)
            identity = (record[key], record["window_start"])
            kept = out.setdefault(name, {}).get(identity)
            if kept is None or record.get("revision", 0) >= kept.get("revision", 0):
                out[name][identity] = record
        return out

    def end(self) -> None:
        """Tell the node side where the input ends (`end_ms`) and settle again."""
        if self.end_ms is None:
            return
        self.input_end_ms = self.end_ms
        for processor in self.node.partitions.values():
            assert isinstance(processor, NodePartition)
            processor.config = dataclasses.replace(processor.config, input_end_ms=self.end_ms)
        self.settle()

    def records(self) -> dict[str, list[Any]]:
        """The derived records by topic name (unprefixed), each as sorted JSON objects."""
        out: dict[str, list[Any]] = {}
        for topic, value in self.derived:
            name = topic.removeprefix(PREFIX)
            out.setdefault(name, []).append(json.loads(value))
        for values in out.values():
            values.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return out


NODE_FIRST = [("node", TICKS), ("pod", TICKS), ("node", SAMPLES), ("node", NODES)]
ORDERS: dict[str, list[tuple[str, str]]] = {
    # Every pod event read before the first sample, then the samples and the usage (and
    # what the fleet partition gets, as soon as it comes).
    "pod events first": [
        ("pod", PODS),
        ("pod", WORKLOADS),
        ("pod", FLEET),
        *NODE_FIRST,
        ("pod", USAGE),
    ],
    # Every sample and every usage first, the pod events last, the fleet's inputs after all.
    "samples first": [
        *NODE_FIRST,
        ("pod", USAGE),
        ("pod", PODS),
        ("pod", WORKLOADS),
        ("pod", FLEET),
    ],
}


def run_backlog(history_inputs: list[Input], order: str, **kw: Any) -> Pipeline:
    """Everything produced first, then read in one of `ORDERS`."""
    pipe = Pipeline(**kw)
    pipe.produce(history_inputs)
    pipe.drain(ORDERS[order])
    pipe.end()
    pipe.close()
    return pipe


EVERYTHING: list[tuple[str, str]] = [
    ("node", TICKS),
    ("pod", TICKS),
    ("node", SAMPLES),
    ("node", NODES),
    ("pod", PODS),
    ("pod", USAGE),
    ("pod", WORKLOADS),
    ("pod", FLEET),
]
"""Every agent's every input, ticks first: what a live worker reads as it comes."""


def run_live(
    history_inputs: list[Input],
    every: int = 3,
    *,
    crash_at: int | None = None,
    tear: random.Random | None = None,
    **kw: Any,
) -> Pipeline:
    """Produced in the order given while being read, a tick every few messages; with
    `crash_at`, a crash (`Pipeline.restart`, cut short by `tear`) after that message."""
    pipe = Pipeline(**kw)
    for n, message in enumerate(history_inputs):
        pipe.produce([message])
        while pipe.step(EVERYTHING) is not None:
            pass
        if n % every == 0:
            pipe.tick()
        if n == crash_at:
            pipe.restart(tear)
    pipe.settle()
    pipe.end()
    pipe.close()
    return pipe
