"""NodeAgent: seq, ts/interval tiling, stalls and clock steps, the drift-free schedule."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from reading_fixtures import device

from producers.agent.loop import NodeAgent
from producers.base.ports import (
    DeviceAllocation,
    PodRef,
    ProcessReading,
    ReadResult,
)
from schemas import NVML_SAMPLES
from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import NvmlSample

GPU = GpuUuid("GPU-8f3c6a1e-58d2-8a34-1b2c-9d0e7f6a5b4c")
POD = PodUid("6f1c0e2a-1111-4a2b-9c3d-000000000001")
T0 = 1_764_412_345.0  # wall seconds; a whole millisecond, so ms arithmetic is exact


class FakeClock:
    """Wall and monotonic time, moved only by the test (or by the fakes below)."""

    def __init__(self, wall: float = T0, mono: float = 100.0) -> None:
        self.wall = wall
        self.mono = mono

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


READING = device(GPU, 0, processes=(ProcessReading(4242, 1 << 30, 90.0),))


class FakeReader:
    """One GPU; each read takes `durations[i]` seconds of the fake clock, or raises."""

    def __init__(self, clock: FakeClock, durations: list[float] | None = None) -> None:
        self.clock = clock
        self.durations = durations or []
        self.fail_on: set[int] = set()
        self.errors: tuple[str, ...] = ()
        self.read_at: list[float] = []

    def read(self) -> ReadResult:
        call = len(self.read_at)
        self.read_at.append(self.clock.mono)
        if call < len(self.durations):
            self.clock.advance(self.durations[call])
        if call in self.fail_on:
            raise RuntimeError(f"driver hiccup on read {call}")
        return ReadResult((READING,), self.errors)

    def close(self) -> None:
        return None


class FakePods:
    def resolve(self, pid: int) -> PodRef | None:
        return PodRef(POD, None) if pid == 4242 else None

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        return (DeviceAllocation(POD, "ml", "train-0", "trainer", "nvidia.com/gpu", (GPU,)),)


class FakeStop(threading.Event):
    """`run`'s stop event: each wait advances the fake clock; set after `ticks` waits."""

    def __init__(self, clock: FakeClock, ticks: int) -> None:
        super().__init__()
        self.clock = clock
        self.ticks = ticks
        self.waits: list[float] = []
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        assert timeout > 0, f"waited {timeout}: the schedule fell behind itself"
        self.waits.append(timeout)
        self.clock.advance(timeout)
        if len(self.waits) >= self.ticks:
            self._set = True
        return self._set


Published = list[tuple[bytes, bytes]]


def make_agent(
    interval_s: float = 1.0, durations: list[float] | None = None
) -> tuple[NodeAgent, FakeClock, FakeReader, Published]:
    clock = FakeClock()
    reader = FakeReader(clock, durations)
    published: Published = []
    pods = FakePods()
    agent = NodeAgent(
        node="gpu-node-17",
        reader=reader,
        resolver=pods,
        allocations=pods,
        publish=lambda key, value: published.append((key, value)),
        interval_s=interval_s,
        clock=clock,
    )
    return agent, clock, reader, published


def decoded(published: Published) -> list[NvmlSample]:
    return [NVML_SAMPLES.decode(value) for _, value in published]


def ticks_at(agent: NodeAgent, clock: FakeClock, offsets_s: list[float]) -> list[NvmlSample]:
    """Tick once at each wall offset from T0; the samples taken."""
    samples = []
    for offset in offsets_s:
        clock.wall = T0 + offset
        samples.append(agent.tick())
    return samples


def spans(samples: list[NvmlSample]) -> list[tuple[int, int]]:
    """Each sample's [ts, ts + interval_ms) relative to T0, in ms."""
    t0 = int(T0 * 1000)
    return [(s.ts - t0, s.ts + s.interval_ms - t0) for s in samples]


def test_each_tick_publishes_the_next_seq_keyed_by_node() -> None:
    agent, _, _, published = make_agent()

    returned = [agent.tick() for _ in range(3)]

    assert [s.seq for s in decoded(published)] == [0, 1, 2]
    assert decoded(published) == returned
    assert {key for key, _ in published} == {b"gpu-node-17"}
    assert agent.seq == 3
    assert agent.stats.ticks == 3
    first = returned[0]
    assert (first.node, first.gpus[0].uuid, first.gpus[0].processes[0].container) == (
        "gpu-node-17",
        GPU,
        "trainer",
    )


def test_consecutive_samples_tile_time() -> None:
    agent, clock, _, _ = make_agent()

    samples = ticks_at(agent, clock, [0.0, 1.0, 2.003, 2.999, 4.5])

    # The first claims the nominal interval before it; each next one starts where the
    # previous ended and ends at its own tick.
    assert spans(samples) == [(-1000, 0), (0, 1000), (1000, 2003), (2003, 2999), (2999, 4500)]


def test_a_sub_second_interval_is_nominal_in_milliseconds() -> None:
    agent, clock, _, _ = make_agent(interval_s=0.1)

    samples = ticks_at(agent, clock, [0.0, 0.1, 0.25])

    assert spans(samples) == [(-100, 0), (0, 100), (100, 250)]


def test_a_stall_over_two_intervals_claims_only_the_nominal_interval() -> None:
    agent, clock, _, _ = make_agent()

    samples = ticks_at(agent, clock, [0.0, 1.0, 3.0, 5.001, 6.0])

    assert spans(samples) == [
        (-1000, 0),
        (0, 1000),
        (1000, 3000),  # exactly two intervals late: still one span
        (4001, 5001),  # 2.001 s late: a gap, not a made-up long interval
        (5001, 6000),  # tiling resumes from the stalled tick
    ]


def test_a_clock_step_back_claims_only_the_nominal_interval() -> None:
    agent, clock, _, _ = make_agent()

    samples = ticks_at(agent, clock, [0.0, 1.0, -5.0, -4.0, -4.0])

    assert spans(samples) == [
        (-1000, 0),
        (0, 1000),
        (-6000, -5000),
        (-5000, -4000),
        (-5000, -4000),  # the same millisecond again: never an interval of 0
    ]
    assert all(s.interval_ms > 0 for s in samples)


def test_stats_count_what_the_ticks_did(caplog: pytest.LogCaptureFixture) -> None:
    agent, _, reader, published = make_agent(durations=[0.25, 0.5])
    agent.tick()
    reader.errors = ("GPU 3 GPU-dead: GPU is lost", "GPU 5 GPU-gone: GPU is lost")

    with caplog.at_level(logging.WARNING, logger="producers.agent.loop"):
        agent.tick()

    stats = agent.stats
    assert (stats.ticks, stats.gpus, stats.read_errors) == (2, 1, 2)
    assert stats.last_read_s == 0.5
    assert stats.last_sample_bytes == len(published[-1][1])
    assert stats.skipped_ticks == 0
    assert "gpu read failed node=gpu-node-17 error='GPU 5 GPU-gone: GPU is lost'" in caplog.text


def test_an_error_every_tick_is_logged_when_it_starts_and_ends_and_counted_each_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, _, reader, _ = make_agent(durations=[0.1] * 6)
    lost, other = "GPU 3 GPU-dead: GPU is lost", "GPU 1 GPU-b: Unknown Error"
    with caplog.at_level(logging.INFO, logger="producers.agent.loop"):
        for errors in [(lost,), (lost,), (lost, other), (other,), (), (lost,)]:
            reader.errors = errors
            agent.tick()
    lines = [r.getMessage().split("error=")[1] for r in caplog.records]
    assert [r.levelname for r in caplog.records] == [
        "WARNING",
        "WARNING",
        "INFO",
        "INFO",
        "WARNING",
    ]
    assert lines == [repr(lost), repr(other), repr(lost), repr(other), repr(lost)]
    assert agent.stats.read_errors == 6


def run_agent(
    interval_s: float, durations: list[float], ticks: int, prepare: Callable[[FakeReader], None]
) -> tuple[NodeAgent, FakeReader, FakeStop, Published]:
    agent, clock, reader, published = make_agent(interval_s, durations)
    prepare(reader)
    stop = FakeStop(clock, ticks)
    agent.run(stop)
    return agent, reader, stop, published


def test_run_ticks_on_a_fixed_grid_whatever_each_tick_takes() -> None:
    # Binary fractions, so the grid arithmetic is exact.
    durations = [0.125, 0.375, 0.0625, 0.25, 0.125]
    agent, reader, stop, published = run_agent(0.5, durations, 5, lambda r: None)

    assert [t - 100.0 for t in reader.read_at] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert stop.waits == [0.375, 0.125, 0.4375, 0.25, 0.375]
    assert [s.seq for s in decoded(published)] == [0, 1, 2, 3, 4]
    assert agent.stats.skipped_ticks == 0


def test_run_skips_and_counts_the_ticks_an_overrun_swallowed() -> None:
    durations = [0.25, 2.5, 0.25, 1.125, 0.25]
    agent, reader, stop, published = run_agent(1.0, durations, 5, lambda r: None)

    # The tick at 1 ends at 3.5: the ones due at 2 and 3 are skipped, the grid stays.
    # The tick at 5 ends at 6.125: the one due at 6 is late, skipped too.
    assert [t - 100.0 for t in reader.read_at] == [0.0, 1.0, 4.0, 5.0, 7.0]
    assert agent.stats.skipped_ticks == 3
    assert stop.waits == [0.75, 0.5, 0.75, 0.875, 0.75]
    samples = decoded(published)
    assert [s.seq for s in samples] == [0, 1, 2, 3, 4]
    # Wall time moved with the fake clock: the 3 s gap after the overrun is a stall.
    assert [s.interval_ms for s in samples] == [1000, 1000, 1000, 1000, 2000]


def test_a_failing_tick_is_logged_and_the_next_one_happens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fail_second(reader: FakeReader) -> None:
        reader.fail_on = {1}

    with caplog.at_level(logging.ERROR, logger="producers.agent.loop"):
        agent, reader, _, published = run_agent(1.0, [0.125] * 4, 4, fail_second)

    assert len(reader.read_at) == 4
    samples = decoded(published)
    assert [s.seq for s in samples] == [0, 1, 2]  # the failed tick took no seq
    # The failed tick's interval is covered by the next sample: time still tiles.
    assert spans(samples) == [(-1000, 0), (0, 2000), (2000, 3000)]
    assert agent.stats.ticks == 3
    failed = [r for r in caplog.records if r.getMessage() == "tick failed node=gpu-node-17 seq=1"]
    assert len(failed) == 1
    assert failed[0].exc_info is not None
    assert "driver hiccup on read 1" in str(failed[0].exc_info[1])
