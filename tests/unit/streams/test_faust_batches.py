"""`Batches` without Kafka: record batches per partition, the partitioner asked once a key,
and each batch's delivery confirmed or failed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from streams.faust.batches import Batches, DeliveryFailedError


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
        self.futures: list[asyncio.Future[Any]] = []
        """Each batch's delivery future, answered by the test (`settle`)."""
        self.refuse: dict[str, BaseException] = {}
        """What the broker answers for a topic's batches (absent: it takes them)."""
        self.metadata_error: BaseException | None = None

    async def partitions_for(self, topic: str) -> set[int]:
        if self.metadata_error is not None:
            raise self.metadata_error
        return set(range(self.partitions))

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_batch(
        self, batch: FakeBatch, topic: str, *, partition: int
    ) -> asyncio.Future[Any]:
        self.sent.append((topic, partition, batch.items))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    def settle(self) -> None:
        """The broker answers every batch sent and not answered yet (as aiokafka does)."""
        for (topic, _, _), future in zip(self.sent, self.futures, strict=True):
            if future.done():
                continue
            error = self.refuse.get(topic)
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


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


def batches(
    partitions: int = 12, max_keys: int = 100, failures: list[tuple[str, str]] | None = None
) -> tuple[Batches, FakeProducer]:
    producer = FakeProducer(FakeClient(partitions))

    async def start() -> FakeProducer:
        return producer

    app = SimpleNamespace(maybe_start_producer=start)
    on_failure = None if failures is None else lambda topic, why: failures.append((topic, why))
    return Batches(app, max_keys=max_keys, on_failure=on_failure), producer


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


def test_confirm_waits_for_every_batch_handed_over_and_returns_once_the_broker_took_them() -> None:
    b, producer = batches()
    client = producer.client

    async def run() -> list[bool]:
        b.add("t.attribution", b"pod-a", b"v", None)
        b.add("t.changelog", b"0|k", b"v", 0)
        await b.hand_over()
        confirming = asyncio.ensure_future(b.confirm())
        await asyncio.sleep(0)
        waited = [not confirming.done()]  # no answer from the broker yet
        client.settle()
        await confirming
        return waited

    assert asyncio.run(run()) == [True]
    assert b.failure is None


def test_a_batch_the_broker_refused_fails_confirm_with_its_topic_and_reason_and_for_good() -> None:
    failures: list[tuple[str, str]] = []
    b, producer = batches(failures=failures)
    client = producer.client
    client.refuse["t.attribution"] = MessageSizeTooLargeError()

    async def run() -> list[str]:
        b.add("t.attribution", b"pod-a", b"v", None)
        b.add("t.pod.lifecycle", b"pod-a", b"v", None)
        await b.hand_over()
        client.settle()
        raised = []
        # Two agents confirm at once: the failure is counted once, both see it.
        results = await asyncio.gather(b.confirm(), b.confirm(), return_exceptions=True)
        raised += [str(r) for r in results if isinstance(r, DeliveryFailedError)]
        # Later records the broker takes do not make the state count as stored.
        b.add("t.changelog", b"0|k", b"v", 0)
        await b.hand_over()
        client.settle()
        with pytest.raises(DeliveryFailedError) as later:
            await b.confirm()
        raised.append(str(later.value))
        return raised

    raised = asyncio.run(run())
    assert len(raised) == 3
    assert all("t.attribution" in r and "MessageSizeTooLargeError" in r for r in raised)
    assert failures == [("t.attribution", "MessageSizeTooLargeError")]
    assert b.failure is not None
    assert (b.failure.topic, b.failure.reason) == ("t.attribution", "MessageSizeTooLargeError")


def test_records_that_could_not_be_handed_over_fail_too() -> None:
    failures: list[tuple[str, str]] = []
    b, producer = batches(failures=failures)
    producer.client.metadata_error = KafkaTimeoutError()  # the topic's metadata never came

    async def run() -> None:
        b.add("t.gpu.windows", b"GPU-1", b"v", None)
        with pytest.raises(DeliveryFailedError, match=r"t\.gpu\.windows"):
            await b.hand_over()
        with pytest.raises(DeliveryFailedError):
            await b.confirm()

    asyncio.run(run())
    assert failures == [("t.gpu.windows", "KafkaTimeoutError")]
