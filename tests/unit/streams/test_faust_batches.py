"""`Batches` without Kafka: record batches per partition, the partitioner asked once a key."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from streams.faust.batches import Batches


class FakeBatch:
    def __init__(self) -> None:
        self.items: list[tuple[bytes | None, bytes | None]] = []

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: None) -> object:
        self.items.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.items)

    def close(self) -> None:
        pass


class FakeClient:
    """aiokafka's producer as `Batches` uses it: metadata, batches sent per partition."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.sent: list[tuple[str, int, list[tuple[bytes | None, bytes | None]]]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> None:
        self.sent.append((topic, partition, batch.items))


class FakeProducer:
    """Faust's producer: `key_partition` by a stand-in hash, every call counted."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.asked: list[bytes | None] = []

    def _ensure_producer(self) -> FakeClient:
        return self.client

    def key_partition(self, topic: str, key: bytes | None) -> Any:
        self.asked.append(key)
        return SimpleNamespace(partition=sum(key or b"") % self.client.partitions)


def batches(partitions: int = 12, max_keys: int = 100) -> tuple[Batches, FakeProducer]:
    producer = FakeProducer(FakeClient(partitions))

    async def start() -> FakeProducer:
        return producer

    return Batches(SimpleNamespace(maybe_start_producer=start), max_keys=max_keys), producer


def test_each_key_is_placed_by_the_partitioner_once_and_then_where_it_said() -> None:
    b, producer = batches()
    for _ in range(3):
        for key in (b"pod-a", b"pod-b", b"pod-a"):
            b.add("t.pod.usage", key, b"v", None)
        asyncio.run(b.hand_over())
    assert producer.asked == [b"pod-a", b"pod-b"]
    placed = {(p, k) for _, p, items in producer.client.sent for k, _ in items}
    assert placed == {(sum(b"pod-a") % 12, b"pod-a"), (sum(b"pod-b") % 12, b"pod-b")}


def test_explicit_partitions_and_keyless_records_are_not_remembered() -> None:
    b, producer = batches()
    b.add("t.changelog", b"k", b"v", 5)
    b.add("t.ticks", None, b"v", None)
    b.add("t.ticks", None, b"v", None)
    asyncio.run(b.hand_over())
    assert producer.asked == [None, None]
    assert ("t.changelog", 5, [(b"k", b"v")]) in producer.client.sent


def test_a_new_partition_count_or_a_full_memory_starts_afresh() -> None:
    b, producer = batches(max_keys=2)
    for key in (b"a", b"b", b"c", b"a"):
        b.add("t", key, b"v", None)
        asyncio.run(b.hand_over())
    assert producer.asked == [b"a", b"b", b"c", b"a"]  # full at two keys: forgotten at c
    producer.client.partitions = 24
    b.add("t", b"c", b"v", None)
    asyncio.run(b.hand_over())
    assert producer.asked[-1] == b"c"
    assert producer.client.sent[-1][1] == sum(b"c") % 24
