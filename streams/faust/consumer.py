"""The worker's Faust consumer: Faust's own, rewinding never-committed inputs when it seeks back."""

from __future__ import annotations

from typing import Any

from streams.faust.inbox import Inboxes
from streams.faust.internals import (
    drain_messages,
    getmany_leaving,
    new_offset,
    replace_read_offsets,
    seek_to_beginning,
)

__all__ = ["ReadOffsets", "rewinding_consumer"]


class ReadOffsets(dict[Any, "int | None"]):
    """Faust's offset last read of each partition, kept at a seek's target until it is read.

    Faust's fetch loop drops a fetched record below its partition's read offset and sets the
    offset to each record it delivers. After a seek back (the agent loop reading a gap
    again) the rest of the records fetched before it still come, and set the offset past
    the target again: the records read again were then dropped and the seek repeated (after
    three tries the gap was taken as real, the usage in it lost). While a partition is held,
    the records of the old fetch (past the target) are delivered, and skipped by the agent
    loop as past its gap, without moving the offset; the first record at the target, or at
    or behind one already delivered (the log start, where the target has gone), ends it.
    While held the offset reads as None: nothing is dropped.

    The hold starts before the seek (`hold`, then the seek, then `sought`). Faust's seek
    (`_seek_wait`) sets the offset to the target from the consumer's thread and then waits
    for the broker: a hold taken after it left that wait to the old fetch, whose next record
    (past the target) the fetch loop took for a jump over the records between, recording
    them for the commit as a gap (`_add_gap`) that the agent loop then read a second time.
    The seek's own write of the target is not a record read, and does not end the hold.
    """

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[Any, tuple[int, int | None]] = {}
        """partition -> (seek target, newest record of the old fetch delivered since)."""
        self._seeking: set[Any] = set()
        """Held partitions whose seek has not yet written its target."""

    def __getitem__(self, tp: Any) -> int | None:
        # Held: None, so every record is delivered and none taken for a gap in Faust's
        # acks (its `_add_gap` per record of the old fetch made the read again wait
        # seconds); the agent loop knows which ones it expects.
        return None if tp in self._held else self.get(tp)

    def hold(self, tp: Any, offset: int) -> None:
        """A seek of `tp` back to `offset` is about to start: the offset read stays there
        until it is read."""
        self._held[tp] = (offset, None)
        if offset > 0:  # Faust's seek to 0 writes nothing (it forgets the offset)
            self._seeking.add(tp)
        else:
            self._seeking.discard(tp)
        super().__setitem__(tp, offset if offset else None)

    def sought(self, tp: Any) -> None:
        """The seek of a held partition is done (its write of the target, if any, came)."""
        self._seeking.discard(tp)

    def release(self, tp: Any) -> None:
        """End a hold whose seek did not happen (the partition was revoked meanwhile)."""
        self._held.pop(tp, None)
        self._seeking.discard(tp)

    def __setitem__(self, tp: Any, offset: int | None) -> None:
        held = self._held.get(tp)
        if held is not None and offset is not None:
            target, newest = held
            if offset == target and tp in self._seeking:
                self._seeking.discard(tp)  # the seek's own write, not a record
                return
            if offset != target and (newest is None or offset > newest):
                self._held[tp] = (target, offset)  # fetched before the seek
                return
            del self._held[tp]
            self._seeking.discard(tp)
        super().__setitem__(tp, offset)

    def pop(self, tp: Any, *default: Any) -> Any:
        """Forget a partition (revoked), its hold with it."""
        self.release(tp)
        return super().pop(tp, *default)


def rewinding_consumer(base: Any, topics: frozenset[str], inboxes: Inboxes | None = None) -> Any:
    """Faust's consumer, rewinding never-committed input partitions when it seeks back.

    With `inboxes`, its fetch loop puts the records of the agents' topics into their
    inboxes (`streams.faust.inbox`) instead of handing them to Faust's conductor one by one.

    Records fetched while Faust's flow is paused (a rebalance) are dropped, and Faust seeks
    back to the committed offsets to read them again; aiokafka skips that seek for a
    partition without a commit (or committed at 0), so those records were lost for the
    group. Such a partition is read again from its beginning, as a new group would.
    `rewind` reads a partition again for the agent loop (`ReadOffsets`). The partitions in
    `unread` are left out of its fetches (watermark alignment, `streams.core.alignment`).
    What it commits counts an offset acknowledged twice once (`internals.new_offset`).
    """

    class RewindingConsumer(base):  # type: ignore[misc]
        __module__ = base.__module__  # mode names a service's logger after its module

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.read_offsets = ReadOffsets()
            replace_read_offsets(self, self.read_offsets)
            self.unread: frozenset[Any] = frozenset()
            """Partitions left out of the fetches for now (watermark alignment)."""

        async def _getmany(self, active_partitions: Any, timeout: float) -> Any:  # noqa: ASYNC109
            # Faust's signature, its `timeout` name included.
            return await getmany_leaving(super()._getmany, active_partitions, timeout, self.unread)

        def _new_offset(self, tp: Any) -> int | None:
            # Faust's, an offset acknowledged twice (a gap read again) counted once.
            return new_offset(self, tp)

        async def seek_to_committed(self) -> Any:
            committed = await super().seek_to_committed()
            rewind = [tp for tp, offset in committed.items() if not offset and tp.topic in topics]
            if rewind:
                await seek_to_beginning(self, *rewind)
            return committed

        async def rewind(self, partition: Any, offset: int) -> None:
            """Read `partition` again from `offset` (the agent loop found a gap).

            Faust's `seek` calls the aiokafka consumer from the event loop while the
            consumer's thread fetches: the seek could be lost to a fetch in progress, or
            crash the fetcher (`KeyError` in `fetched_records`). `seek_wait` seeks in the
            consumer's thread.
            """
            self.read_offsets.hold(partition, offset)
            try:
                await self.seek_wait({partition: offset})
            except BaseException:
                self.read_offsets.release(partition)
                raise
            self.read_offsets.sought(partition)

        async def _drain_messages(self, fetcher: Any) -> None:
            if inboxes is None:
                await super()._drain_messages(fetcher)
                return

            await drain_messages(self, fetcher, inboxes.deliver, inboxes.hold)

    return RewindingConsumer
