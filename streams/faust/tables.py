"""The worker's state tables: Faust memory tables keyed by partition, written through `Batches`."""

from __future__ import annotations

from typing import Any

from streams.faust.batches import Batches

__all__ = ["FaustTable"]


class FaustTable:
    """A Faust table used with explicit partitions: keys are `b"<partition>|<key>"`."""

    def __init__(self, table: Any, batches: Batches) -> None:
        self.table = table
        self._batches = batches
        self._changelog = table.changelog_topic.get_topic_name()

    def load(self, partition: int) -> list[tuple[bytes, bytes]]:
        """Every key (without its partition) and value of a partition."""
        prefix = f"{partition}|".encode()
        n = len(prefix)
        return [(k[n:], v) for k, v in list(self.table.data.items()) if k.startswith(prefix)]

    def keep_only(self, partitions: set[int]) -> None:
        """Forget local keys of partitions not assigned here (their changelog restores them)."""
        data = self.table.data
        for key in [k for k in list(data.keys()) if int(k.split(b"|", 1)[0]) not in partitions]:
            del data[key]

    def write(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Set or delete a key locally and in the changelog partition of `partition`."""
        full = f"{partition}|".encode() + key
        data = self.table.data
        if value is None:
            if full in data:
                del data[full]
        else:
            data[full] = value
        self._batches.add(self._changelog, full, value, partition)
