"""Input gaps: read again what Faust skipped around a rebalance (and may have committed past).

Offsets of an input partition are contiguous: no input topic is compacted or written in
transactions. Faust 0.15.3 drops records fetched while its flow is paused or of an older
consumer generation, relies on seeking back to the committed offset to read them again,
and can commit past records it never delivered (it takes the first run of acknowledged
offsets after a missing one as committable). Two signs show such a gap to the agent loop:

- an event past the offset it expects next (the last one processed + 1; after a restart,
  the position stored with the state): the event waits, the partition is sought back;
- a tick waiting for offsets beyond the expected one while nothing of that input arrives:
  the partition is sought back to the expected offset.

A partition the worker leaves unread on purpose (watermark alignment,
`streams.core.alignment`) is not quiet: nothing of it arrives because it is not fetched.
Taking that for skipped data sought it back to where it stood at every pause, which
dropped its fetched records and fetched them again, up to four times per pause; a gap
already found is not sought again while its partition is paused either (the seek could
not be read), and its wait starts anew when the partition is read again.

Where nothing places a partition yet (no stored position, no commit, its log start not
learnt: the broker did not answer), its events wait and it is read again (`unplaced`).

A gap is read again until it is filled, each try waiting twice as long (up to
`REWIND_MAX_S`): in a backlog the records fetched before a seek can take many seconds to
drain, and a gap taken as real after three tries a second apart lost the usage in it. It is
taken as real only when the log no longer holds it (its start is past the missing offset)
after `MAX_REWINDS` tries: offsets being contiguous, nothing else makes one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from streams.core.ticks import Progress, Tick

__all__ = [
    "MAX_REWINDS",
    "REWIND_AGAIN_S",
    "REWIND_MAX_S",
    "STALL_S",
    "Paused",
    "Rewinds",
    "Seek",
]

log = logging.getLogger(__name__)

MAX_REWINDS = 3  # seeks back to one missing offset before a gap gone from the log is real
REWIND_AGAIN_S = 1.0  # events fetched before a seek still arrive for a while after it
REWIND_MAX_S = 8.0  # the longest wait between two seeks to one gap
STALL_S = 3.0  # a tick waiting this long with its input quiet: the data was skipped

Seek = Callable[[str, int, int], Awaitable[None]]
"""Move the consumer of a topic partition to an offset: `seek(topic, partition, offset)`."""
StartOf = Callable[[str, int], "int | None"]
"""The log start offset of a topic partition, None when not known (yet)."""
Paused = Callable[[str, int], bool]
"""Whether the worker leaves a topic partition unread for now (watermark alignment)."""


class Rewinds:
    """Gaps found in the inputs of one agent, and the seeks that read them again."""

    def __init__(
        self,
        progress: Progress,
        seek: Seek | None,
        start_of: StartOf,
        now: Callable[[], float],
        paused: Paused = lambda topic, partition: False,
    ) -> None:
        self.progress = progress
        self._seek = seek
        self._start_of = start_of
        self._now = now
        self._paused = paused
        self._rewinds: dict[tuple[str, int], tuple[int, int, float]] = {}
        """(topic, partition) -> (first missing offset, seeks so far, last seek)."""
        self._last_event: dict[tuple[str, int], float] = {}
        self._waiting: dict[int, tuple[int, float]] = {}
        """partition -> (id of the tick at the head of its queue, since when)."""

    def expected(self, topic: str, partition: int) -> int | None:
        """The offset the next event of an input partition should have."""
        return self.progress.expected(topic, partition, self._start_of(topic, partition))

    def gap(self, topic: str, partition: int, offset: int) -> bool:
        """Whether an event comes after a gap and must wait for the missing ones."""
        key = (topic, partition)
        self._last_event[key] = self._now()
        expected = self.expected(topic, partition)
        if expected is None:
            return self._still_unplaced(key)
        if offset <= expected:
            self._rewinds.pop(key, None)
            return False
        missing, tries, _ = self._rewinds.get(key, (expected, 0, 0.0))
        if missing != expected:
            self._rewinds[key] = (expected, 0, 0.0)
        elif tries >= MAX_REWINDS and self._gone(topic, partition, missing):
            log.warning(
                "input gap taken as real topic=%s partition=%d offsets=%d..%d",
                topic,
                partition,
                expected,
                offset - 1,
            )
            del self._rewinds[key]
            return False
        else:
            self._rewinds.setdefault(key, (missing, tries, 0.0))
        return True

    def _gone(self, topic: str, partition: int, missing: int) -> bool:
        """Whether the log no longer holds offset `missing` (deleted: its start is past it)."""
        start = self._start_of(topic, partition)
        return start is not None and start > missing

    def unplaced(self, topic: str, partition: int, offset: int) -> None:
        """Nothing says where an input partition starts: its events from `offset` wait.

        The partition is sought back to `offset` and read again, by which time its start is
        known; after `MAX_REWINDS` tries its events are taken as they come.
        """
        self._rewinds.setdefault((topic, partition), (offset, 0, 0.0))

    def _still_unplaced(self, key: tuple[str, int]) -> bool:
        entry = self._rewinds.get(key)
        if entry is None:
            return False
        if entry[1] >= MAX_REWINDS:
            log.warning("input start taken as found topic=%s partition=%d", *key)
            del self._rewinds[key]
            return False
        return True

    def watch(self, partition: int, head: Tick | None) -> None:
        """Look for inputs a waiting tick needs that have gone quiet."""
        if head is None:
            self._waiting.pop(partition, None)
            return
        now = self._now()
        tick_id, since = self._waiting.get(partition, (id(head), now))
        if tick_id != id(head):
            tick_id, since = id(head), now
        self._waiting[partition] = (tick_id, since)
        if now - since < STALL_S:
            return
        for topic in self.progress.inputs:
            key = (topic, partition)
            if self._paused(topic, partition):
                self._last_event[key] = now  # unread on purpose: not quiet
                continue
            end, expected = head.ends.get(topic), self.expected(topic, partition)
            quiet = now - self._last_event.get(key, since) >= STALL_S
            if end is not None and expected is not None and end > expected and quiet:
                self._rewinds.setdefault(key, (expected, 0, 0.0))

    async def seek(self) -> None:
        """Seek the partitions with a gap back to their first missing offset."""
        now = self._now()
        for key, (missing, tries, at) in list(self._rewinds.items()):
            topic, partition = key
            if self._paused(topic, partition):
                if tries:
                    self._rewinds[key] = (missing, tries, now)  # its wait starts on resume
                continue
            wait = min(REWIND_AGAIN_S * 2 ** max(tries - 1, 0), REWIND_MAX_S)
            if self._seek is None or (tries and now - at < wait):
                continue
            log.warning(
                "input gap, reading again topic=%s partition=%d from=%d try=%d",
                topic,
                partition,
                missing,
                tries + 1,
            )
            self._rewinds[key] = (missing, tries + 1, now)
            try:
                await self._seek(topic, partition, missing)
            except Exception:  # revoked meanwhile: its new owner reads from the commit
                log.exception("seek failed topic=%s partition=%d", topic, partition)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop what is known of partitions this worker no longer owns."""
        gone = set(partitions)
        for mapping in (self._rewinds, self._last_event):
            for key in [key for key in mapping if key[1] in gone]:
                del mapping[key]
        for partition in gone:
            self._waiting.pop(partition, None)
