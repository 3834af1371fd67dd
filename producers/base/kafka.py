"""The kafka-python client behind `MessageSender`: idempotent, acks=all, compressed, lingering."""

from __future__ import annotations

import logging
import threading
from typing import Any

from kafka import KafkaProducer
from kafka.codec import has_lz4
from kafka.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)

from producers.base.publisher import Abandoned, Done, Rejected, SendBlocked
from schemas.settings import KafkaSettings

log = logging.getLogger(__name__)

LINGER_MS = 20  # batches a node's burst without adding visible latency to 1 s ticks
FAST_LINGER_MS = 250  # below FAST_INTERVAL_S: several samples to a request
FAST_INTERVAL_S = 0.5


def linger_ms(interval_s: float) -> int:
    """How long the client holds a message for others to join it, for a sampling interval.

    Sampling faster than every half second is for resolution, not latency: holding each
    message up to a quarter of a second lets two or three samples share one request,
    which halves the Kafka client's CPU at 10 Hz (BENCHMARKS.md). At 1 Hz and slower a
    message has nothing to wait for.
    """
    return FAST_LINGER_MS if interval_s < FAST_INTERVAL_S else LINGER_MS


MAX_BLOCK_MS = 500  # the sender thread, not sampling, waits this long for metadata
# The client bootstraps in its constructor, by default for up to 30 s: with no broker the
# sender thread would sit there and `Publisher.stop` could not join it. It retries anyway.
BOOTSTRAP_TIMEOUT_MS = 5_000
# The publisher abandons a client that acknowledged nothing for `delivery_timeout_s`; the
# client's own expiry comes this much later, so it never gives up messages one batch at a
# time (a later batch of the same key could then be written before an earlier one is sent
# again).
CLIENT_EXPIRY_AFTER_S = 60.0
CLOSE_JOIN_S = 2.0  # how long a forced close waits for the client's I/O thread to end
# Refused for good: the same message would be refused again.
REJECTED = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    InvalidRecordError,
    CorruptRecordError,
    InvalidTopicError,
)


def force_close(producer: KafkaProducer, flush_s: float) -> None:
    """Close a kafka-python producer in about `flush_s` whatever the broker does.

    `KafkaProducer.close(timeout)` flushes first and raises KafkaTimeoutError when that
    flush times out, before it would force the close: its I/O thread would then go on
    retrying. Here the flush is bounded and its timeout caught, then the I/O thread is
    told to stop and fail what it holds (its `force_close`, which `close` itself calls
    only after a successful flush), and the producer is closed.
    """
    if flush_s > 0:
        try:
            producer.flush(timeout=flush_s)
        except KafkaTimeoutError:
            log.warning("flush timed out, closing anyway timeout_s=%.1f", flush_s)
    io_thread = getattr(producer, "_sender", None)
    if io_thread is not None:
        io_thread.force_close()
        io_thread.join(CLOSE_JOIN_S)
    try:
        producer.close(timeout=0)
    except KafkaError as exc:
        log.warning("kafka client did not close cleanly error=%r", exc)


class KafkaSender:
    """Sends to one topic; the client is created on first use and re-created when abandoned.

    `delivery_timeout_s` is how long messages in flight may go unacknowledged before the
    publisher abandons this client and sends them again through a fresh one; the client
    itself would expire them `CLIENT_EXPIRY_AFTER_S` later. Messages are not lost by it:
    the publisher's outbox holds them until acknowledged.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        client_id: str,
        delivery_timeout_s: float = 600.0,
        linger_ms: int = LINGER_MS,
    ) -> None:
        self._topic = topic
        self._delivery_timeout_s = delivery_timeout_s
        self._config: dict[str, Any] = {
            **kafka.client_options(),
            "client_id": client_id,
            "acks": "all",
            "enable_idempotence": True,
            "compression_type": "lz4" if has_lz4() else "gzip",
            "linger_ms": linger_ms,
            "max_block_ms": MAX_BLOCK_MS,
            "bootstrap_timeout_ms": BOOTSTRAP_TIMEOUT_MS,
            "delivery_timeout_ms": int((delivery_timeout_s + CLIENT_EXPIRY_AFTER_S) * 1000),
            "request_timeout_ms": 10_000,
            "reconnect_backoff_max_ms": 2_000,
            # kafka-python's own sensors cost CPU on every send and nothing reads them:
            # the agent exports what matters itself.
            "metrics_enabled": False,
        }
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self._making = threading.Lock()  # one client made at a time
        self._closed = False
        self._warned = False
        self._generation = 0
        # Messages without an answer yet: the client generation each went to, its callback.
        self._pending: dict[int, tuple[int, Done]] = {}
        self._next_id = 0

    @property
    def delivery_timeout_s(self) -> float:
        """Seconds without an acknowledgement before the publisher abandons this client."""
        return self._delivery_timeout_s

    def _client(self) -> KafkaProducer:
        """The current client, made here if there is none. It is made outside `_lock` (its
        constructor waits up to BOOTSTRAP_TIMEOUT_MS for a broker), so `close` and `abandon`
        never wait for it."""
        with self._making:
            with self._lock:
                current = self._producer
            if current is not None:
                return current
            try:
                producer = KafkaProducer(**self._config)
            except KafkaError as exc:
                if not self._warned:
                    log.warning(
                        "kafka unreachable, buffering bootstrap=%s error=%r",
                        self._config["bootstrap_servers"],
                        exc,
                    )
                    self._warned = True
                raise SendBlocked(str(exc)) from exc
            with self._lock:
                closed = self._closed
                if not closed:
                    self._producer = producer
            if closed:  # closed while it was being made: nobody will close it but us
                force_close(producer, flush_s=0.0)
                raise SendBlocked("closed")
            if self._warned:
                log.info("kafka reachable again topic=%s", self._topic)
                self._warned = False
            return producer

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        """Hand one message to the client; raises SendBlocked when it cannot take it."""
        producer = self._client()
        with self._lock:
            abandoned = producer is not self._producer
            if abandoned:
                raise SendBlocked("client abandoned")
            message, self._next_id = self._next_id, self._next_id + 1
            self._pending[message] = (self._generation, done)
        try:
            future = producer.send(self._topic, key=key, value=value)
        except KafkaTimeoutError as exc:
            self._answered(message)
            raise SendBlocked(str(exc)) from exc
        except BaseException:
            self._answered(message)
            raise
        future.add_callback(lambda _metadata: self._answer(message, None))
        future.add_errback(lambda error: self._answer(message, error))

    def _answered(self, message: int) -> tuple[int, Done] | None:
        with self._lock:
            return self._pending.pop(message, None)

    def _answer(self, message: int, error: BaseException | None) -> None:
        answered = self._answered(message)  # None: already answered by `abandon`
        if answered is None:
            return
        generation, done = answered
        if isinstance(error, REJECTED):
            error = Rejected(repr(error))
        elif error is not None and generation != self._generation:
            # Failed by the forced close of an abandoned client, not by the broker.
            error = Abandoned(repr(error))
        done(error)

    def abandon(self) -> None:
        """Close the client at once; everything it held is answered `Abandoned`."""
        with self._lock:
            producer, self._producer = self._producer, None
            self._generation += 1
        if producer is not None:
            force_close(producer, flush_s=0.0)
        with self._lock:  # what the forced close did not answer (an I/O thread still busy)
            left = [
                m for m, (generation, _) in self._pending.items() if generation < self._generation
            ]
        for message in left:
            self._answer(message, Abandoned("kafka client abandoned"))

    def flush(self, timeout_s: float) -> None:
        """Wait for acknowledgements of what was handed over."""
        if self._producer is not None:
            try:
                self._producer.flush(timeout=timeout_s)
            except KafkaTimeoutError:
                log.warning("flush timed out timeout_s=%.1f", timeout_s)

    def close(self, timeout_s: float) -> None:
        """Flush for at most `timeout_s`, then close the client, whatever the broker does."""
        with self._lock:
            producer, self._producer = self._producer, None
            self._generation += 1
            self._closed = True
        if producer is not None:
            force_close(producer, flush_s=timeout_s)
