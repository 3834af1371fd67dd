"""How the worker's outputs and table writes reach Kafka: a record batch per topic partition."""

from __future__ import annotations

import asyncio
from typing import Any

from streams.faust.internals import aiokafka_producer_of

__all__ = ["MAX_KEYS", "Batches"]

MAX_KEYS = 200_000  # keys whose partition is remembered, per topic (40,000 pods: 4 MB)


class Batches:
    """Records handed to aiokafka as one record batch per topic partition, past Faust's buffer.

    Faust's `send_soon` costs a future, a trip through its buffer and a callback per
    message, and its flush an `asyncio.wait_for` per message: with several records per node
    sample that was most of the worker's CPU (BENCHMARKS.md, worker). Here records wait in
    a list until `hand_over` puts them into the client's batches (C code, one future a
    batch); the client sends them as it sends Faust's, and `app.producer.flush()` (also
    Faust's before each commit) waits for them. Order is kept per topic partition; a record
    without a partition goes where Faust would put it (the client's partitioner), which is
    remembered per key: the partitioner hashes in Python (murmur2, a few microseconds a
    key), and the same pods' usage goes out every few seconds.
    """

    def __init__(self, app: Any, max_keys: int = MAX_KEYS) -> None:
        self.app = app
        self._pending: dict[str, list[tuple[int | None, bytes | None, bytes | None]]] = {}
        self._lock = asyncio.Lock()  # two agents hand over: one at a time keeps the order
        self._max_keys = max_keys
        self._placed: dict[str, tuple[int, dict[bytes, int]]] = {}
        """topic -> (its partition count, key -> partition)."""

    def add(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        """Keep a record until the next `hand_over`."""
        self._pending.setdefault(topic, []).append((partition, key, value))

    async def hand_over(self) -> None:
        """Put every record kept so far into the client's batches (not waiting for acks)."""
        async with self._lock:
            if not self._pending:
                return
            pending, self._pending = self._pending, {}
            producer = await self.app.maybe_start_producer()
            client = aiokafka_producer_of(producer)
            for topic, records in pending.items():
                count = len(await client.partitions_for(topic))  # metadata, for the partitioner
                placed = self._placed_of(topic, count)
                by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
                for explicit, key, value in records:
                    partition = explicit
                    if partition is None:
                        partition = placed.get(key) if key is not None else None
                        if partition is None:
                            partition = producer.key_partition(topic, key).partition
                            if key is not None:
                                placed[key] = partition
                    by_partition.setdefault(partition, []).append((key, value))
                for partition, items in by_partition.items():
                    await _send_batches(client, topic, partition, items)

    def _placed_of(self, topic: str, count: int) -> dict[bytes, int]:
        """The remembered partitions of `topic`'s keys; none when its partition count changed
        or too many are kept."""
        known = self._placed.get(topic)
        if known is None or known[0] != count or len(known[1]) >= self._max_keys:
            known = self._placed[topic] = (count, {})
        return known[1]


async def _send_batches(
    client: Any, topic: str, partition: int, items: list[tuple[bytes | None, bytes | None]]
) -> None:
    """Records of one topic partition, in order, in as few record batches as they fit."""
    batch = client.create_batch()
    for key, value in items:
        if batch.append(key=key, value=value, timestamp=None) is not None:
            continue
        await client.send_batch(batch, topic, partition=partition)  # full: append closed it
        batch = client.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            # Larger than a whole batch (no record of ours is): sent on its own, in order.
            await client.send(topic, value, key=key, partition=partition)
            batch = client.create_batch()
    if batch.record_count():
        batch.close()  # nothing else goes in (the client adds `send()`s to open batches)
        await client.send_batch(batch, topic, partition=partition)
