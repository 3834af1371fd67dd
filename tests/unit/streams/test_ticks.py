"""Ticks wait for the data sent before them; the pod side's watermark is the lowest claim."""

from __future__ import annotations

import msgspec
import pytest

from streams.core.ticks import (
    MAX_PENDING,
    Progress,
    SourceWatermarks,
    Tick,
    decode_tick,
    encode_tick,
    usage_frontier,
)

SAMPLES, NODES = "t.nvml.samples", "t.k8s.nodes"


def tick(ends: dict[str, int], starts: dict[str, int] | None = None, wm: int = 1) -> Tick:
    return Tick(sender="w1", claims={0: wm}, ends=ends, starts=starts or {})


def test_a_tick_waits_until_every_input_reaches_its_end_offset() -> None:
    progress = Progress((SAMPLES, NODES), committed=lambda topic, p: None)
    progress.processed(SAMPLES, 0, 4)
    progress.processed(NODES, 0, 0)
    progress.park(0, tick({SAMPLES: 7, NODES: 1}, wm=10))
    progress.park(0, tick({SAMPLES: 7, NODES: 1}, wm=11))
    assert progress.ready(0) == []
    progress.processed(SAMPLES, 0, 5)
    progress.processed(SAMPLES, 1, 6)  # another partition's offset proves nothing here
    assert progress.ready(0) == []
    progress.processed(SAMPLES, 0, 6)
    assert [t.claims[0] for t in progress.ready(0)] == [10, 11]
    assert progress.ready(0) == []


def test_before_any_event_the_committed_offset_says_where_processing_stands() -> None:
    committed = {(SAMPLES, 0): 7, (NODES, 0): 3}
    progress = Progress((SAMPLES, NODES), committed=lambda topic, p: committed.get((topic, p)))
    progress.park(0, tick({SAMPLES: 7, NODES: 3}))
    progress.park(0, tick({SAMPLES: 8, NODES: 3}))
    assert len(progress.ready(0)) == 1  # the second waits for offset 7
    progress.processed(SAMPLES, 0, 7)
    assert len(progress.ready(0)) == 1


def test_a_never_committed_input_is_caught_up_only_when_empty() -> None:
    progress = Progress((SAMPLES,), committed=lambda topic, p: None)
    progress.park(0, tick({SAMPLES: 5}, starts={SAMPLES: 0}))
    assert progress.ready(0) == []  # five messages to read first
    progress.park(1, tick({SAMPLES: 5}, starts={SAMPLES: 5}))  # retention emptied it
    assert len(progress.ready(1)) == 1
    progress.park(2, tick({}))  # a tick that does not say where the input ended
    assert progress.ready(2) == []


def test_forget_drops_offsets_and_ticks_of_revoked_partitions() -> None:
    progress = Progress((SAMPLES,), committed=lambda topic, p: None)
    progress.processed(SAMPLES, 0, 9)
    progress.park(0, tick({SAMPLES: 20}))
    progress.park(1, tick({SAMPLES: 0}, starts={SAMPLES: 0}))
    assert progress.has_pending() == [0, 1]
    progress.forget([0])
    assert progress.has_pending() == [1]
    progress.park(0, tick({SAMPLES: 10}))
    assert progress.ready(0) == []  # offset 9 was forgotten with the partition


def test_a_lagging_partition_keeps_only_the_newest_ticks() -> None:
    progress = Progress((SAMPLES,), committed=lambda topic, p: None)
    for wm in range(MAX_PENDING + 10):
        progress.park(0, tick({SAMPLES: 1}, wm=wm))
    progress.processed(SAMPLES, 0, 0)
    assert [t.claims[0] for t in progress.ready(0)] == list(range(10, MAX_PENDING + 10))


def test_the_pod_watermark_is_the_lowest_claim_once_every_partition_claimed() -> None:
    sources = SourceWatermarks(3)
    assert sources.update({0: 100, 1: 90}) is None
    assert sources.update({2: 95, 7: 1}) == 90  # partition 7 does not exist: ignored
    assert sources.update({1: 200}) == 95
    assert sources.update({2: 50}) == 95  # a stale claim moves nothing back
    assert sources.update({2: 300}) == 100


def test_idle_partitions_count_at_the_time_they_were_raised_to() -> None:
    sources = SourceWatermarks(3, frontier=lambda st: st - 10)
    assert sources.update({0: 100, 1: -1, 2: 40}, idle=[1]) == -11  # not raised yet
    assert sources.lowest_active(but=1) == 40
    assert sources.lowest_active(but=2) == 100  # the idle one is never a target
    assert sources.update({1: 40}, idle=[1]) == 30  # raised to the lowest of the others
    assert sources.highest == 100
    assert sources.update({2: 120}) == 30  # partition 1 is behind until raised again
    assert sources.update({1: 100}, idle=[1]) == 90
    assert sources.lowest_active(but=0) == 120
    assert sources.update({1: 95}) == 90  # its next sample is older: the watermark holds


def test_usage_frontier_is_lateness_behind_or_the_last_boundary_passed() -> None:
    assert usage_frontier(125_000, 10_000, 10_000, 60_000) == 115_000
    assert usage_frontier(125_000, 2_000, 10_000, 60_000) == 120_000  # lateness < a flush
    assert usage_frontier(125_000, 2_000, 10_000, 15_000) == 120_000
    assert usage_frontier(121_000, 0, 10_000, 15_000) == 120_000


def test_ticks_round_trip_and_garbage_is_refused() -> None:
    value = Tick(
        sender="w1", claims={0: 1, 11: 2}, idle=[11], ends={SAMPLES: 3}, starts={SAMPLES: 0}
    )
    assert decode_tick(encode_tick(value)) == value
    with pytest.raises(msgspec.DecodeError):
        decode_tick(b'{"schema": "gpuwatch.nvml.sample/v1"}')
