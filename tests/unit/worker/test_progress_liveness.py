"""A stalled process made visible: the stall gauges, the reason /livez gives, and a sink's
tracked consumer (the server's /livez: tests/integration/worker/test_worker_stalled.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry

from gpuwatch.run.progress import StallCollector, TrackedConsumer, stuck
from streams.core.progress import Stalls


class TP(NamedTuple):
    topic: str
    partition: int


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeConsumer:
    """kafka-python's consumer as far as the tracking reads it."""

    def __init__(self, committed: int | None = None) -> None:
        self.tp = TP("t.pod.lifecycle", 0)
        self.position_at = 0
        self.end = 0
        self.paused_tps: set[TP] = set()
        self.committed_at = committed
        self.polls = 0

    def assignment(self) -> set[TP]:
        return {self.tp}

    def paused(self) -> set[TP]:
        return set(self.paused_tps)

    def position(self, tp: TP) -> int:
        return self.position_at

    def committed(self, tp: TP) -> int | None:
        return self.committed_at

    def beginning_offsets(self, tps: list[TP]) -> Mapping[TP, int]:
        return dict.fromkeys(tps, 0)

    def end_offsets(self, tps: list[TP]) -> Mapping[TP, int]:
        return dict.fromkeys(tps, self.end)

    def poll(self, timeout_ms: int) -> dict[Any, Any]:
        self.polls += 1
        return {}


def test_the_gauges_and_the_reason_name_each_stalled_partition() -> None:
    clock = Clock()
    stalls = Stalls(20.0, clock)
    stalls.hold([("t.ticks", 1), ("t.nvml.samples", 0)])
    stalls.positions({("t.ticks", 1): 4, ("t.nvml.samples", 0): 9})
    stalls.ends({("t.ticks", 1): 7, ("t.nvml.samples", 0): 9})
    registry = CollectorRegistry()
    registry.register(StallCollector(stalls, "gpuwatch_worker_", "worker"))
    reason = stuck(stalls, "worker")
    clock.now = 20.0
    get = registry.get_sample_value
    assert get("gpuwatch_worker_stalled_seconds", {"topic": "t.ticks", "partition": "1"}) == 20.0
    labels = {"topic": "t.nvml.samples", "partition": "0"}
    assert get("gpuwatch_worker_stalled_seconds", labels) == 0.0
    assert get("gpuwatch_worker_stall_limit_seconds") == 20.0
    assert reason() is None  # at the limit, not past it
    clock.now = 21.5
    assert reason() == "worker stalled past 20 s: t.ticks:1=22s"


def test_a_sink_holding_an_unwritten_batch_is_stalled_though_it_keeps_polling() -> None:
    clock = Clock()
    stalls = Stalls(20.0, clock)
    fake = FakeConsumer(committed=10)
    consumer = TrackedConsumer(fake, stalls, clock, ends_every_s=0.0)  # type: ignore[arg-type]
    key = (fake.tp.topic, fake.tp.partition)
    fake.position_at, fake.end = 10, 10
    consumer.poll(100)  # starts at the group's commit, caught up
    assert stalls.stalled() == {key: 0.0}
    fake.end = 15
    clock.now = 1.0
    consumer.poll(100)  # records wait from here
    fake.position_at = 15  # fetched; the write fails: the sink pauses and keeps polling
    fake.paused_tps = {fake.tp}
    for now in (5.0, 10.0, 30.0):
        clock.now = now
        consumer.poll(0)
    assert stalls.stalled() == {key: 29.0}
    fake.paused_tps = set()  # written: the next poll moves on
    clock.now = 31.0
    consumer.poll(100)
    assert stalls.stalled() == {key: 0.0}
    assert fake.polls == 6


def test_a_stuck_sink_polls_no_more_and_its_stall_still_grows() -> None:
    clock = Clock()
    stalls = Stalls(20.0, clock)
    fake = FakeConsumer()  # never committed: starts at its position
    consumer = TrackedConsumer(fake, stalls, clock, ends_every_s=0.0)  # type: ignore[arg-type]
    fake.position_at, fake.end = 3, 8
    consumer.poll(100)
    clock.now = 45.0  # inside a write that never returns
    assert stalls.stuck() == [((fake.tp.topic, 0), 45.0)]
