"""Event-time windows as explicit bucket keys, closed by stream time (docs/DESIGN.md §4).

Faust's windowed tables bucket by wall clock and close per partition unreliably, so windows
are plain integers here: a window is `[start, start + window_ms)` with `start` a multiple of
`window_ms` since the epoch. Stream time is the largest event time (`ts`) seen on a
partition; a window closes once stream time reaches `end + allowed_lateness`. Data for a
window that has closed already is late: the caller counts it (`late_events_total`) and leaves
the emitted window as it is, since a window record's identity is `(key, window_start)` and a
second record would replace the first with a fragment.
"""

from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "Part",
    "closable",
    "closes_at",
    "is_late",
    "split_interval",
    "window_start",
]


class Part(NamedTuple):
    """The piece of an interval inside one window; `fraction` of the interval's length."""

    window_start: int
    start_ms: int
    end_ms: int
    fraction: float


def window_start(ts_ms: int, window_ms: int) -> int:
    """Start of the window that holds event time `ts_ms`."""
    return ts_ms - ts_ms % window_ms


def split_interval(ts_ms: int, interval_ms: int, window_ms: int) -> tuple[Part, ...]:
    """`[ts, ts + interval)` cut at window boundaries, each piece with its fraction.

    Integrals are linear in time, so a piece carries `fraction` of each integral of the
    interval (peaks are not integrals: each piece keeps the interval's peak). A sample from
    59.5 s to 60.5 s with 60 s windows gives two pieces of 0.5.
    """
    start = window_start(ts_ms, window_ms)
    end_ms = ts_ms + interval_ms
    if end_ms <= start + window_ms:  # the common case: inside one window
        return (Part(start, ts_ms, end_ms, 1.0),)
    parts = []
    cut = ts_ms
    while cut < end_ms:
        stop = min(start + window_ms, end_ms)
        parts.append(Part(start, cut, stop, (stop - cut) / interval_ms))
        cut = start = stop
    return tuple(parts)


def closes_at(start: int, window_ms: int, lateness_ms: int) -> int:
    """Stream time at which the window starting at `start` closes."""
    return start + window_ms + lateness_ms


def closable(
    open_windows: Iterable[int], stream_time: int, window_ms: int, lateness_ms: int
) -> list[int]:
    """Starts of the open windows that stream time closes, oldest first."""
    last = stream_time - window_ms - lateness_ms  # closes_at(start) <= stream_time
    return sorted(start for start in open_windows if start <= last)


def is_late(start: int, closed_through: int | None, window_ms: int, lateness_ms: int) -> bool:
    """Whether the window starting at `start` closed when stream time reached `closed_through`.

    `closed_through` is the stream time of the last close (None: nothing closed yet).
    """
    return closed_through is not None and closes_at(start, window_ms, lateness_ms) <= (
        closed_through
    )
