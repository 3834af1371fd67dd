"""How long each input partition has waited for a consumer that made no progress.

A consumer is stalled on a partition while records wait there (the partition's end
offset is beyond the consumer's position) and its position does not advance. The stall
counts from the later of its last advance and the moment records were first seen waiting,
so a partition quiet for an hour that gets one record is not an hour stalled.

Observations come from a timer (positions and end offsets read every few seconds), and the
stall is read at scrape time from the last of them: while the consumer is stuck and no
observation comes any more, the figure still grows with the clock. A position is the
offset of the next record to process (a committed offset, or a consumer's position taken
once the records before it are done); only a position past every one seen counts as
progress, so reading a partition again after a seek back is not taken for new work done.

State is replaced whole on each change, never mutated: a reader in another thread (the
HTTP server of /metrics) sees one observation or the next, without a lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

__all__ = ["Partition", "Stalls"]

Partition = tuple[str, int]
"""(topic, partition)."""


@dataclass(frozen=True)
class _Seen:
    """What is known of one partition: the newest position and end, and since when the
    consumer has not moved while records waited."""

    position: int | None = None
    end: int | None = None
    since: float = 0.0

    @property
    def waiting(self) -> bool:
        return self.position is not None and self.end is not None and self.end > self.position


class Stalls:
    """The stall of each partition a consumer holds, from positions and end offsets."""

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        """A stall past this many seconds makes the process not live (`stuck`)."""
        self._clock = clock
        self._seen: dict[Partition, _Seen] = {}

    def hold(self, partitions: Iterable[Partition]) -> None:
        """The partitions the consumer holds now: others are forgotten, new ones start."""
        held = set(partitions)
        seen = self._seen
        if held != seen.keys():
            now = self._clock()
            self._seen = {p: seen.get(p) or _Seen(since=now) for p in held}

    def positions(self, positions: Mapping[Partition, int | None]) -> None:
        """Positions of partitions held: one past every position seen is progress."""
        self._update(positions, _advanced)

    def ends(self, ends: Mapping[Partition, int]) -> None:
        """End offsets of partitions held: records waiting from now, if none did."""
        self._update(ends, _ended)

    def positioned(self, partition: Partition) -> bool:
        """Whether a position of `partition` is known since it is held."""
        seen = self._seen.get(partition)
        return seen is not None and seen.position is not None

    def stalled(self) -> dict[Partition, float]:
        """Seconds each partition held has been stalled (0 while nothing waits)."""
        now = self._clock()
        return {p: max(0.0, now - s.since) if s.waiting else 0.0 for p, s in self._seen.items()}

    def stuck(self) -> list[tuple[Partition, float]]:
        """Partitions stalled past the limit, with their stall, longest first."""
        over = [(p, s) for p, s in self.stalled().items() if s > self.limit_s]
        return sorted(over, key=lambda item: -item[1])

    def _update(
        self,
        values: Mapping[Partition, int | None],
        step: Callable[[_Seen, int | None, float], _Seen],
    ) -> None:
        now = self._clock()
        seen = dict(self._seen)
        for p, value in values.items():
            if p in seen:
                seen[p] = step(seen[p], value, now)
        self._seen = seen


def _advanced(seen: _Seen, position: int | None, now: float) -> _Seen:
    if position is None or (seen.position is not None and position <= seen.position):
        return seen
    return replace(seen, position=position, since=now)


def _ended(seen: _Seen, end: int | None, now: float) -> _Seen:
    if end is None:
        return seen
    moved = replace(seen, end=end)
    return moved if seen.waiting or not moved.waiting else replace(moved, since=now)
