"""The worker's state tables: Faust memory tables keyed by partition, written through `Batches`.

A table's memory holds, for each key, the value last written; the processors work from
their own objects and read the table only when they load a partition. Large values (a
node's document, 8-10 kB of JSON) are kept there lz4-compressed, about a quarter of their
size; the changelog gets them as written, and what Faust restores from it is read as is.

Writes do not go through Faust's `table[key] = value`: Faust sends a changelog record with
`send_soon`, and a record the broker refuses is only logged (`Topic._on_published`) while
the value stays in memory and its offsets are committed. Here the record goes through
`Batches` with the outputs, and the agent loop's flush after a state write confirms it
(`Batches.confirm`): one the broker did not take stops the worker, so a value in memory
that the changelog lacks never outlives the failure.
"""

from __future__ import annotations

from typing import Any

import lz4.block

from streams.faust.batches import Batches

__all__ = ["PACK_MIN_BYTES", "FaustTable"]

PACK_MIN_BYTES = 2048
"""Values this large or larger are kept compressed in memory (a pod's state, about 1 kB,
compresses to two thirds: not worth its CPU; a node's document to a quarter)."""


class _Packed(bytes):
    """A value kept lz4-compressed in the table's memory."""

    __slots__ = ()


def _pack(value: bytes) -> bytes:
    if len(value) < PACK_MIN_BYTES:
        return value
    return _Packed(lz4.block.compress(value, mode="fast"))


def _unpack(value: bytes) -> bytes:
    if type(value) is _Packed:
        unpacked: bytes = lz4.block.decompress(value)
        return unpacked
    return value


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
        return [
            (k[n:], _unpack(v)) for k, v in list(self.table.data.items()) if k.startswith(prefix)
        ]

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
            data[full] = _pack(value)
        self._batches.add(self._changelog, full, value, partition)
