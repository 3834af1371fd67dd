"""The kafka-python client behind `MessageSender`: idempotent, acks=all, compressed, lingering."""

from __future__ import annotations

import logging
import threading
from typing import Any

from kafka import KafkaProducer
from kafka.codec import has_lz4
from kafka.errors import KafkaError, KafkaTimeoutError

from producers.agent.publisher import Done, SendBlocked
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


class KafkaSender:
    """Sends to one topic; the client is created on first use and re-created on failure.

    `delivery_timeout_s` is how long the client keeps retrying what it holds while the
    broker is away; past it those messages are reported lost. Keep it above the
    outages you want to ride out.
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
        self._config: dict[str, Any] = {
            **kafka.client_options(),
            "client_id": client_id,
            "acks": "all",
            "enable_idempotence": True,
            "compression_type": "lz4" if has_lz4() else "gzip",
            "linger_ms": linger_ms,
            "max_block_ms": MAX_BLOCK_MS,
            "bootstrap_timeout_ms": BOOTSTRAP_TIMEOUT_MS,
            "delivery_timeout_ms": int(delivery_timeout_s * 1000),
            "request_timeout_ms": 10_000,
            "reconnect_backoff_max_ms": 2_000,
            # kafka-python's own sensors cost CPU on every send and nothing reads them:
            # the agent exports what matters itself.
            "metrics_enabled": False,
        }
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self._warned = False

    def _client(self) -> KafkaProducer:
        with self._lock:
            if self._producer is None:
                try:
                    self._producer = KafkaProducer(**self._config)
                except KafkaError as exc:
                    if not self._warned:
                        log.warning(
                            "kafka unreachable, buffering bootstrap=%s error=%r",
                            self._config["bootstrap_servers"],
                            exc,
                        )
                        self._warned = True
                    raise SendBlocked(str(exc)) from exc
                if self._warned:
                    log.info("kafka reachable again topic=%s", self._topic)
                    self._warned = False
            return self._producer

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        """Hand one message to the client; raises SendBlocked when it cannot take it."""
        producer = self._client()
        try:
            future = producer.send(self._topic, key=key, value=value)
        except KafkaTimeoutError as exc:
            raise SendBlocked(str(exc)) from exc
        future.add_callback(lambda _metadata: done(None))
        future.add_errback(done)

    def flush(self, timeout_s: float) -> None:
        """Wait for acknowledgements of what was handed over."""
        if self._producer is not None:
            try:
                self._producer.flush(timeout=timeout_s)
            except KafkaTimeoutError:
                log.warning("flush timed out timeout_s=%.1f", timeout_s)

    def close(self, timeout_s: float) -> None:
        """Flush, then close the client."""
        if self._producer is not None:
            self._producer.close(timeout=timeout_s)
            self._producer = None
