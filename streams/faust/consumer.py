"""The worker's Faust consumer: Faust's own, rewinding never-committed inputs when it seeks back."""

from __future__ import annotations

from typing import Any

from streams.faust.internals import seek_to_beginning

__all__ = ["rewinding_consumer"]


def rewinding_consumer(base: Any, topics: frozenset[str]) -> Any:
    """Faust's consumer, rewinding never-committed input partitions when it seeks back.

    Records fetched while Faust's flow is paused (a rebalance) are dropped, and Faust seeks
    back to the committed offsets to read them again; aiokafka skips that seek for a
    partition without a commit (or committed at 0), so those records were lost for the
    group. Such a partition is read again from its beginning, as a new group would.
    """

    class RewindingConsumer(base):  # type: ignore[misc]
        __module__ = base.__module__  # mode names a service's logger after its module

        async def seek_to_committed(self) -> Any:
            committed = await super().seek_to_committed()
            rewind = [tp for tp, offset in committed.items() if not offset and tp.topic in topics]
            if rewind:
                await seek_to_beginning(self, *rewind)
            return committed

    return RewindingConsumer
