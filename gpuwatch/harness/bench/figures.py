"""The arithmetic of `gpuwatch bench worker`: percentiles, drain rates, latencies to Redis."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Latencies", "drain_rate", "kept_up", "latencies_ms", "percentile"]


@dataclass(frozen=True)
class Latencies:
    """End-to-end latencies of the watched samples."""

    samples: list[tuple[float, float]]
    """(send time, ms), in send order."""
    censored: int
    """Samples not in Redis when the wait ended: their ms are lower bounds."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, linear between the closest ranks (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be 0..100, got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def drain_rate(started: float, points: Sequence[tuple[float, int]], total: int) -> float:
    """Messages per second from `started`, by the worker's commits read at `points`.

    `points` are (time read, messages committed since `started`). A commit made while work
    went on marks exactly what was done by then; the one reaching `total` comes up to a
    commit interval after the last message, so it counts only when no other was read.
    """
    partial = [(t, n) for t, n in points if 0 < n < total and t > started]
    if partial:
        t, n = max(partial, key=lambda point: point[1])
        return n / (t - started)
    done = [t for t, n in points if n >= total and t > started]
    if not done:
        return 0.0
    return total / (min(done) - started)


def latencies_ms(
    seen: Sequence[tuple[str, int, float]],
    sent_at: Mapping[tuple[str, int], float],
    censor_at: float,
) -> Latencies:
    """The latency of each sent sample: until its end time, or a later one, was read.

    Redis holds a GPU's newest state only, so a sample overtaken by the next before a write
    is in Redis from the moment the newer one is. `seen` is (uuid, updated_at, read time)
    per new value read; `sent_at` maps (uuid, end time) to the send time.
    """
    reads: dict[str, list[tuple[int, float]]] = {}
    for uuid_, updated, read_at in seen:
        reads.setdefault(uuid_, []).append((updated, read_at))
    # The first read at or after each value: a later read of a newer state covers it too.
    firsts: dict[str, tuple[list[int], list[float]]] = {}
    for uuid_, values in reads.items():
        values.sort()
        ends, times = [], []
        earliest = math.inf
        for updated, read_at in reversed(values):
            earliest = min(earliest, read_at)
            ends.append(updated)
            times.append(earliest)
        firsts[uuid_] = (ends[::-1], times[::-1])
    out: list[tuple[float, float]] = []
    censored = 0
    for (uuid_, end), sent in sent_at.items():
        ends, times = firsts.get(uuid_, ([], []))
        i = bisect.bisect_left(ends, end)
        if i < len(ends):
            out.append((sent, (times[i] - sent) * 1000))
        else:
            censored += 1
            out.append((sent, (censor_at - sent) * 1000))
    return Latencies(sorted(out), censored)


def kept_up(latencies: Latencies, slack_ms: float = 1000.0) -> bool:
    """Whether the worker kept pace: every sample arrived and latency did not grow.

    A worker slower than the pace builds a backlog, so its latency grows for as long as
    the load lasts: the last fifth's median is then well above the first fifth's.
    """
    samples = latencies.samples
    if latencies.censored or len(samples) < 10:
        return False
    fifth = len(samples) // 5
    first = [ms for _, ms in samples[:fifth]]
    last = [ms for _, ms in samples[-fifth:]]
    return percentile(last, 50) <= percentile(first, 50) + slack_ms
