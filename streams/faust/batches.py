"""How the worker's outputs and table writes reach Kafka: a record batch per topic partition,
each confirmed by the broker before anything that depends on it is done."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from streams.faust.internals import aiokafka_producer_of

__all__ = ["MAX_KEYS", "Batches", "DeliveryFailedError"]

log = logging.getLogger(__name__)

MAX_KEYS = 200_000  # keys whose partition is remembered, per topic (40,000 pods: 4 MB)

OnFailure = Callable[[str, str], None]
"""Told (topic, reason) once for each record batch the broker did not take."""


class DeliveryFailedError(Exception):
    """Records handed to the producer were not taken by the broker: they are lost.

    Permanent for the process: nothing made after them may count as written (the state, the
    input offsets), so the worker stops and a restart reads their inputs again.
    """

    def __init__(self, topic: str, partition: int | None, reason: str, detail: str) -> None:
        where = topic if partition is None else f"{topic}[{partition}]"
        super().__init__(f"Kafka did not take records for {where}: {reason}: {detail}")
        self.topic = topic
        self.partition = partition
        self.reason = reason


class Batches:
    """Records handed to aiokafka as one record batch per topic partition, past Faust's buffer.

    Faust's `send_soon` costs a future, a trip through its buffer and a callback per
    message, and its flush an `asyncio.wait_for` per message: with several records per node
    sample that was most of the worker's CPU (BENCHMARKS.md, worker). Here records wait in
    a list until `hand_over` puts them into the client's batches (C code, one future a
    batch); the client sends them as it sends Faust's. Order is kept per topic partition; a
    record without a partition goes where Faust would put it (the client's partitioner),
    which is remembered per key: the partitioner hashes in Python (murmur2, a few
    microseconds a key), and the same pods' usage goes out every few seconds.

    Delivery is checked here, not by flushing the producer: aiokafka's `flush()` waits for
    its batches without raising, and Faust's does the same (a record the broker refused is
    logged and dropped). `confirm` awaits the future of every batch handed over and raises
    `DeliveryFailedError` if one failed. aiokafka has already sent a batch again for as long as
    the error was retriable (a leader moving, the broker away) and its request timeout
    allowed (Faust's `producer_request_timeout`, 20 min): a failed future is final (the
    broker refused the records: too large, not authorized, no such topic; or they expired).
    The first failure stays: every later `confirm` raises it too, so no state written
    after the lost records counts as stored.
    """

    def __init__(
        self, app: Any, max_keys: int = MAX_KEYS, on_failure: OnFailure | None = None
    ) -> None:
        self.app = app
        self._pending: dict[str, list[tuple[int | None, bytes | None, bytes | None]]] = {}
        self._lock = asyncio.Lock()  # two agents hand over: one at a time keeps the order
        self._max_keys = max_keys
        self._placed: dict[str, tuple[int, dict[bytes, int]]] = {}
        """topic -> (its partition count, key -> partition)."""
        self._sent: list[tuple[str, int, asyncio.Future[Any]]] = []
        """(topic, partition, delivery future) of each batch handed over, not yet confirmed."""
        self._on_failure = on_failure
        self.failure: DeliveryFailedError | None = None
        """The first delivery that failed; None while every one has succeeded."""

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
            topic = next(iter(pending))
            try:
                producer = await self.app.maybe_start_producer()
                client = aiokafka_producer_of(producer)
                for topic, records in pending.items():
                    await self._hand_over_topic(producer, client, topic, records)
            except Exception as exc:  # records taken from `_pending` and not handed over
                raise self._failed(topic, None, exc) from exc
            except BaseException as exc:  # cancelled (the worker stopping): likewise lost
                self._failed(topic, None, exc)
                raise

    async def _hand_over_topic(
        self,
        producer: Any,
        client: Any,
        topic: str,
        records: list[tuple[int | None, bytes | None, bytes | None]],
    ) -> None:
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
        sent = self._sent
        for partition, items in by_partition.items():
            for future in await _send_batches(client, topic, partition, items):
                sent.append((topic, partition, future))

    async def confirm(self) -> None:
        """Wait until the broker has answered for every batch handed over so far; raise
        `DeliveryFailedError` if it did not take one (now or before)."""
        waiting = [future for _, _, future in self._sent if not future.done()]
        if waiting:
            await asyncio.wait(waiting)
        self._settle()
        if self.failure is not None:
            raise self.failure

    def _settle(self) -> None:
        """Forget the batches answered; count and log each one that failed (once: no await
        here, so two agents confirming at once see each future settled by one of them)."""
        still: list[tuple[str, int, asyncio.Future[Any]]] = []
        for topic, partition, future in self._sent:
            if not future.done():
                still.append((topic, partition, future))
            elif future.cancelled():
                self._failed(topic, partition, asyncio.CancelledError())
            elif (exc := future.exception()) is not None:
                self._failed(topic, partition, exc)
        self._sent = still

    def _failed(self, topic: str, partition: int | None, exc: BaseException) -> DeliveryFailedError:
        """Count and log a failed delivery; the error it is (the first one stays)."""
        reason = type(exc).__name__
        log.error(
            "delivery failed topic=%s partition=%s reason=%s error=%r",
            topic,
            "-" if partition is None else partition,
            reason,
            exc,
        )
        if self._on_failure is not None:
            self._on_failure(topic, reason)
        failed = DeliveryFailedError(topic, partition, reason, repr(exc))
        if self.failure is None:
            self.failure = failed
        return failed

    def _placed_of(self, topic: str, count: int) -> dict[bytes, int]:
        """The remembered partitions of `topic`'s keys; none when its partition count changed
        or too many are kept."""
        known = self._placed.get(topic)
        if known is None or known[0] != count or len(known[1]) >= self._max_keys:
            known = self._placed[topic] = (count, {})
        return known[1]


async def _send_batches(
    client: Any, topic: str, partition: int, items: list[tuple[bytes | None, bytes | None]]
) -> list[asyncio.Future[Any]]:
    """Records of one topic partition, in order, in as few record batches as they fit; the
    delivery future of each batch (of each record sent alone)."""
    futures: list[asyncio.Future[Any]] = []
    batch = client.create_batch()
    for key, value in items:
        if batch.append(key=key, value=value, timestamp=None) is not None:
            continue
        # Full: append closed it.
        futures.append(await client.send_batch(batch, topic, partition=partition))
        batch = client.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            # Larger than a whole batch (no record of ours is): sent on its own, in order.
            futures.append(await client.send(topic, value, key=key, partition=partition))
            batch = client.create_batch()
    if batch.record_count():
        batch.close()  # nothing else goes in (the client adds `send()`s to open batches)
        futures.append(await client.send_batch(batch, topic, partition=partition))
    return futures
