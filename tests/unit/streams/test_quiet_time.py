"""Time that moves when the inputs are quiet (SEMANTICS.md, Time: the wall clock).

A node partition whose newest sample was live when processed (within `LIVE_MS` of its end
by the wall clock) moves with the wall clock less the allowed lateness once a tick finds it
caught up: its windows close and its silent nodes are seen missing, though no data comes. A
backlog or a replay of history moves with its data only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from test_gpu_alerts_fixtures import GPU_A, GPU_B, NODE, POD_P, RULES, S, alloc, gpu, sample

from schemas import ALERTS, GPU_WINDOWS, NVML_SAMPLES, POD_USAGE, NvmlSample
from schemas.prices import BUILTIN_PRICES
from streams.core.integrals import PriceBook
from streams.core.ticks import SourceWatermarks, Tick
from streams.processors.node import LIVE_MS, NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Source

W0 = 1_764_399_960_000  # a window start (a multiple of 60 s)
PREFIX = "t."
SAMPLES = NVML_SAMPLES.full_name(PREFIX)


class Wall:
    """The worker's wall clock, moved by hand."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def partition(wall: Wall, partitions: int = 1) -> tuple[NodePartition, Outputs]:
    cfg = NodeConfig(
        PREFIX, 60 * S, 10 * S, RULES, PriceBook(BUILTIN_PRICES), partitions, now_ms=wall
    )
    counters = Counters()
    return NodePartition(0, cfg, counters), Outputs(PREFIX, counters)


def samples(start_s: int, stop_s: int) -> list[NvmlSample]:
    """One node, GPU A held by pod P at 50 %, GPU B unallocated, 1 s apart."""
    return [
        sample(W0 + t * S, [gpu(GPU_A, 50.0), gpu(GPU_B, 0.0)], [alloc(POD_P, GPU_A)], seq=t)
        for t in range(start_s, stop_s)
    ]


def feed(part: NodePartition, items: list[NvmlSample], out: Outputs) -> None:
    """The samples, processed at the partition's wall clock as it is."""
    for i, item in enumerate(items):
        part.handle(Source(SAMPLES, 0, i, NODE.encode()), NVML_SAMPLES.encode(item), out)


def decoded(out: Outputs, spec: Any) -> list[Any]:
    name = spec.full_name(PREFIX)
    return [spec.decode(r.value) for r in out.records if r.topic == name]


def tick(part: NodePartition, out: Outputs, now: int, claims: dict[int, int] | None = None) -> None:
    own = part.claim()
    mine = {0: own[0]} if own is not None else {}
    part.on_tick(Tick(sender="w", claims={**mine, **(claims or {})}, now=now), out)


def test_a_quiet_partition_of_live_data_moves_with_the_wall_clock() -> None:
    wall = Wall(W0 + 30 * S)  # the 30 samples have just ended: live
    part, out = partition(wall)
    feed(part, samples(0, 30), out)
    assert part.meta.live
    tick(part, out, now=W0 + 31 * S)  # within the lateness: nothing moves
    assert part.stream_time == W0 + 29 * S
    # The agent stops. Telemetry is missing once stream time passes its last sample's end
    # (30 s) plus 30 s: the wall clock less the lateness passes 60 s after 70 s.
    tick(part, out, now=W0 + 70 * S)
    assert [a.name for a in decoded(out, ALERTS)] == []
    tick(part, out, now=W0 + 71 * S)
    missing = [a for a in decoded(out, ALERTS) if a.name == "NodeTelemetryMissing"]
    assert [(a.status, a.ts - W0) for a in missing] == [("firing", 60 * S)]
    # The first window closes at its end plus the lateness: 70 s of stream time, 80 s of wall.
    assert decoded(out, GPU_WINDOWS) == []
    tick(part, out, now=W0 + 80 * S)
    windows = decoded(out, GPU_WINDOWS)
    assert [(w.uuid, w.window_start - W0, w.allocated_seconds) for w in windows] == [
        (GPU_A, 0, 30.0),
        (GPU_B, 0, 0.0),
    ]
    # The pod's usage went out at the flush boundaries the wall clock passed.
    assert sum(u.end_ts - u.ts for u in decoded(out, POD_USAGE)) == 30 * S


def test_a_replay_of_history_moves_with_its_data_only() -> None:
    wall = Wall(W0 + 30 * S + LIVE_MS + 1)  # the samples ended more than LIVE_MS ago
    part, out = partition(wall)
    feed(part, samples(0, 30), out)
    assert not part.meta.live
    tick(part, out, now=wall.ms + 3_600 * S)
    assert part.stream_time == W0 + 29 * S
    assert decoded(out, GPU_WINDOWS) == []
    assert decoded(out, ALERTS) == []


def test_a_replayed_range_keeps_its_own_end() -> None:
    wall = Wall(W0 + 30 * S)
    part, out = partition(wall)
    part.config = dataclasses.replace(part.config, input_end_ms=W0 + 30 * S)
    feed(part, samples(0, 30), out)
    tick(part, out, now=W0 + 3_600 * S)
    assert part.stream_time == W0 + 50 * S  # the end plus twice the lateness, not the wall


def test_live_data_flowing_is_not_moved_by_the_wall_clock() -> None:
    """A partition whose data keeps coming stays at its data's time (ahead of the wall
    clock less the lateness), whatever the ticks say."""
    wall = Wall(W0 + 30 * S)
    part, out = partition(wall)
    feed(part, samples(0, 30), out)
    tick(part, out, now=W0 + 30 * S)
    assert part.stream_time == W0 + 29 * S


def test_a_partition_without_samples_follows_the_quiet_ones_when_all_are_idle() -> None:
    """A fleet gone quiet: every partition with data idle and moved by the wall clock; one
    with no sample at all follows the lowest of them, so the pod side's watermark moves."""
    marks = SourceWatermarks(3)
    marks.update({0: W0 + 500 * S, 1: W0 + 480 * S, 2: -1}, idle=[0, 1, 2])
    assert marks.lowest_active(but=2) == W0 + 480 * S
    # While one is active, it is the active ones that count, as before.
    marks.update({0: W0 + 600 * S}, idle=[])
    assert marks.lowest_active(but=2) == W0 + 600 * S


def test_data_that_comes_a_little_behind_is_not_made_late_by_the_wall_clock() -> None:
    """Live data processed 60 s after it ended (a slow agent, a worker a little behind):
    quiet, the partition moves with the wall clock from where its data was, less the
    lateness, so the data that follows at the same lag is on time."""
    wall = Wall(W0 + 90 * S)  # the samples of [0, 30) s, processed 60 s after they ended
    part, out = partition(wall)
    feed(part, samples(0, 30), out)
    assert (part.meta.live, part.meta.lag_ms) == (True, 60 * S)
    tick(part, out, now=W0 + 99 * S)  # 99 - 60 - 10: short of the last sample's start
    assert part.stream_time == W0 + 29 * S
    tick(part, out, now=W0 + 130 * S)
    assert part.stream_time == W0 + 60 * S  # 130 - 60 - 10
