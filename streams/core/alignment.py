"""Watermark alignment: which node partitions to stop reading while they run ahead.

Behind a backlog the node partitions do not progress evenly in event time: the consumer
fetches them evenly by offset, so a partition of few nodes runs hours of event time ahead
of one of many. The pod side's watermark is the lowest usage frontier of them all
(`streams.core.ticks.SourceWatermarks`): the usage of every partition ahead of it is held
in memory until the slowest catches up, so the memory a backlog takes grew with its length.

Aligned (as Flink's watermark alignment does), a node partition whose stream time is more
than `ahead_ms` past the lowest stream time of the partitions that are not idle is paused
(its records stay in Kafka) until it is within half of that again: the usage held on the
pod side is then at most about `ahead_ms` of event time of the fleet's usage, whatever the
backlog's length. Live, the partitions are seconds apart and none is paused.

The lowest stream time is that of every node partition: this worker's own, as its node
processors have them now, and the others' as the ticks of their workers claimed them
(`Tick.claims`; a claim never goes backwards). Until every partition has been claimed once
nothing is paused (the watermark is not known yet either), nor is the slowest partition
ever paused, so the slowest always moves. When the lowest stream time has not moved for
`stuck_s` seconds of wall time while partitions are paused (its worker gone, its records
stuck), they are read again anyway (`released`), until it moves again: alignment bounds
memory, it must never stop the fleet.

No Kafka here: the worker's consumer leaves the partitions this returns out of its fetches
(`streams.faust.consumer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

__all__ = ["Alignment"]

Claim = tuple[int, bool]
"""A node partition's (stream time, idle), as `NodePartition.claim` says it."""


class Alignment:
    """The node partitions of this worker to leave unread for now, and what it did."""

    def __init__(
        self,
        partitions: int,
        ahead_ms: int,
        stuck_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.partitions = partitions
        self.ahead_ms = ahead_ms
        self.stuck_s = stuck_s
        self._monotonic = monotonic
        self._heard: dict[int, Claim] = {}
        """Each partition's latest claim in a tick (any worker's)."""
        self.paused: frozenset[int] = frozenset()
        """The partitions paused now."""
        self.pauses = 0
        """Times a partition was paused (`gpuwatch_alignment_pauses_total`)."""
        self.released = 0
        """Times the pauses were lifted because the lowest stream time stood still."""
        self.lowest: int | None = None
        """The lowest stream time of the partitions not idle, last seen."""
        self._moved_at = monotonic()
        self._stuck = False

    def heard(self, claims: Mapping[int, int], idle: Iterable[int] = ()) -> None:
        """A tick's claims (every worker's ticks reach every partition)."""
        idle = set(idle)
        for partition, stream_time in claims.items():
            known = self._heard.get(partition)
            if known is None or stream_time >= known[0]:
                self._heard[partition] = (stream_time, partition in idle)

    def forget(self) -> None:
        """Partitions were revoked: nothing paused (the next `decide` says anew)."""
        self.paused = frozenset()

    def decide(self, local: Mapping[int, Claim | None]) -> frozenset[int]:
        """The partitions of `local` (this worker's, with their claims now) to pause."""
        if self.ahead_ms <= 0:
            return self.paused
        claims = dict(self._heard)
        for partition, claim in local.items():
            if claim is not None:
                claims[partition] = claim
        if len(claims) < self.partitions:
            self.paused = frozenset()
            return self.paused
        active = [st for st, idle in claims.values() if not idle]
        lowest = min(active) if active else None
        now = self._monotonic()
        moved = lowest is None or self.lowest is None or lowest > self.lowest
        if moved:
            self._stuck = False
        if moved or not self.paused:
            self._moved_at = now  # stuck counts from the later of its move and the pause
        self.lowest = lowest
        if lowest is None:
            self.paused = frozenset()
            return self.paused
        if self.paused and not self._stuck and now - self._moved_at >= self.stuck_s:
            self._stuck = True
            self.released += 1
        if self._stuck:
            self.paused = frozenset()
            return self.paused
        pause_above = lowest + self.ahead_ms
        resume_at = lowest + self.ahead_ms // 2
        paused = set()
        for partition, claim in local.items():
            if claim is None or claim[1]:
                continue
            stream_time = claim[0]
            if stream_time > pause_above or (partition in self.paused and stream_time > resume_at):
                paused.add(partition)
        self.pauses += len(paused - self.paused)
        self.paused = frozenset(paused)
        return self.paused
