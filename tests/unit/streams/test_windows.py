"""Event-time windows: bucket keys, intervals cut at boundaries, closing and lateness."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from streams.core.windows import (
    Part,
    closable,
    closes_at,
    is_late,
    split_interval,
    window_start,
)

MIN = 60_000  # the default 60 s window, in ms
LATE = 10_000  # the default 10 s allowed lateness


def test_window_start_is_epoch_aligned() -> None:
    # 1764412345000 ms is 25 s into its minute (as in the schema examples' windows)
    assert window_start(1_764_412_345_000, MIN) == 1_764_412_320_000
    assert window_start(1_764_412_320_000, MIN) == 1_764_412_320_000  # a start is its own
    assert window_start(1_764_412_379_999, MIN) == 1_764_412_320_000
    assert window_start(1_764_412_380_000, MIN) == 1_764_412_380_000


def test_a_sample_straddling_a_boundary_is_cut_in_half() -> None:
    # 59.5 s .. 60.5 s: half in [0, 60 s), half in [60 s, 120 s)
    assert split_interval(59_500, 1_000, MIN) == (
        Part(0, 59_500, 60_000, 0.5),
        Part(60_000, 60_000, 60_500, 0.5),
    )


def test_a_sample_inside_a_window_or_ending_on_its_boundary_is_one_part() -> None:
    assert split_interval(10_000, 1_000, MIN) == (Part(0, 10_000, 11_000, 1.0),)
    assert split_interval(59_000, 1_000, MIN) == (Part(0, 59_000, 60_000, 1.0),)


def test_a_long_interval_spans_several_windows() -> None:
    # 30 s .. 150 s in 60 s windows: 30 s, 60 s, 30 s of 120 s.
    assert split_interval(30_000, 120_000, MIN) == (
        Part(0, 30_000, 60_000, 0.25),
        Part(60_000, 60_000, 120_000, 0.5),
        Part(120_000, 120_000, 150_000, 0.25),
    )


def test_window_closes_at_end_plus_lateness() -> None:
    assert closes_at(0, MIN, LATE) == 70_000
    assert closable([0, 60_000, 120_000], 69_999, MIN, LATE) == []
    assert closable([120_000, 0, 60_000], 130_000, MIN, LATE) == [0, 60_000]


def test_data_for_a_closed_window_is_late() -> None:
    assert not is_late(0, None, MIN, LATE)  # nothing closed yet
    assert not is_late(0, 69_999, MIN, LATE)
    assert is_late(0, 70_000, MIN, LATE)
    assert not is_late(60_000, 70_000, MIN, LATE)


@given(st.integers(0, 2**42), st.integers(1, 10 * MIN), st.integers(1_000, 5 * MIN))
def test_parts_tile_the_interval(ts: int, interval: int, window: int) -> None:
    parts = split_interval(ts, interval, window)
    assert parts[0].start_ms == ts
    assert parts[-1].end_ms == ts + interval
    assert all(a.end_ms == b.start_ms for a, b in pairwise(parts))
    assert abs(sum(p.fraction for p in parts) - 1.0) < 1e-9
    for p in parts:
        assert p.window_start == window_start(p.start_ms, window)
        assert p.end_ms <= p.window_start + window
        assert p.fraction == (p.end_ms - p.start_ms) / interval


@given(
    st.lists(st.integers(0, 100).map(lambda n: n * MIN), max_size=20),
    st.integers(0, 120 * MIN),
)
def test_closable_is_exactly_the_windows_stream_time_passed(starts: list[int], now: int) -> None:
    closed = closable(starts, now, MIN, LATE)
    assert closed == sorted(closed)
    assert set(closed) == {s for s in starts if closes_at(s, MIN, LATE) <= now}
    assert all(is_late(s, now, MIN, LATE) for s in closed)
