"""Sends the outbox to Kafka on a thread of its own, so sampling never waits for the broker.

The sampling loop only calls `Publisher.publish`, which appends to a bounded `Outbox`.
A sender thread hands messages to the Kafka client while fewer than
`in_flight_bytes` are unacknowledged. While the broker is away the client retries what
it holds (idempotently, so a retry never writes a duplicate), the outbox fills, and
the oldest waiting messages are dropped and counted. When the broker is back
everything left goes out in order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from producers.agent.outbox import Entry, Outbox

log = logging.getLogger(__name__)

Done = Callable[[BaseException | None], None]


class SendBlocked(Exception):  # noqa: N818 - a condition to retry, not an error
    """The client cannot take a message now (no broker, no metadata); retry later."""


class MessageSender(Protocol):
    """The Kafka client as the publisher needs it (one topic)."""

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        """Hand one message over; `done(None)` on ack, `done(error)` when it is given up.

        Raises `SendBlocked` when the message was not taken.
        """
        ...

    def flush(self, timeout_s: float) -> None:
        """Wait until what was handed over is acknowledged or `timeout_s` passes."""
        ...

    def close(self, timeout_s: float) -> None:
        """Flush and release connections."""
        ...


@dataclass
class PublisherStats:
    """Counters for the agent's self-metrics."""

    sent: int = 0
    failed: int = 0
    """Lost: refused by the client with an error, or given up after its delivery timeout."""
    blocked: int = 0
    """Times the client could not take a message (broker away)."""


class Publisher:
    """Bounded, non-blocking, ordered publishing of one producer's messages."""

    RETRY_S = 0.5  # pause after the client refused a message; brokers come back in seconds
    DROP_LOG_S = 30.0  # at most one drop warning per this many seconds

    def __init__(
        self, sender: MessageSender, max_buffer_bytes: int, in_flight_bytes: int = 4 << 20
    ) -> None:
        self.outbox = Outbox(max_buffer_bytes)
        self.stats = PublisherStats()
        self._sender = sender
        self._window = in_flight_bytes
        self._in_flight = 0
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_drop_log = 0.0

    def publish(self, key: bytes, value: bytes) -> None:
        """Queue one message; never blocks. The oldest queued ones drop when full."""
        dropped = self.outbox.put(Entry(key, value))
        if dropped:
            now = time.monotonic()
            if now >= self._next_drop_log:
                # Once per DROP_LOG_S: an outage drops a message per tick, the counter has them all.
                self._next_drop_log = now + self.DROP_LOG_S
                log.warning(
                    "buffer full, dropping oldest messages total_dropped=%d buffer_bytes=%d",
                    self.outbox.dropped,
                    self.outbox.size_bytes,
                )

    @property
    def in_flight_bytes(self) -> int:
        """Bytes handed to the client and not yet acknowledged."""
        return self._in_flight

    def start(self) -> None:
        """Start the sender thread."""
        self._thread = threading.Thread(target=self._run, name="gpuwatch-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (for at most `timeout_s`), then close the client."""
        deadline = time.monotonic() + timeout_s
        while len(self.outbox) and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping.set()
        self.outbox.wake()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
        self._sender.close(max(0.1, deadline - time.monotonic()))
        if len(self.outbox):
            log.warning("stopped with messages unsent unsent=%d", len(self.outbox))

    def step(self) -> int:
        """Hand over what the in-flight window allows; returns how many were handed over."""
        with self._lock:
            room = self._window - self._in_flight
        if room <= 0:
            return 0
        entries = self.outbox.take(room)
        for index, entry in enumerate(entries):
            with self._lock:
                self._in_flight += entry.size
            try:
                self._sender.send(entry.key, entry.value, self._on_done(entry.size))
            except SendBlocked:
                with self._lock:
                    self._in_flight -= entry.size
                self.stats.blocked += 1
                self.outbox.push_front(entries[index:])
                return index
            except Exception:
                # The client refused this one message with an error (too large, closed):
                # it is lost and counted, its bytes leave the window, the rest go back.
                with self._lock:
                    self._in_flight -= entry.size
                    self.stats.failed += 1
                self.outbox.push_front(entries[index + 1 :])
                raise
        return len(entries)

    def _on_done(self, size: int) -> Done:
        def done(error: BaseException | None) -> None:
            with self._lock:
                self._in_flight -= size
                if error is None:
                    self.stats.sent += 1
                else:
                    self.stats.failed += 1
                self._lock.notify_all()
            if error is not None:
                log.error("message lost after retries error=%r", error)

        return done

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not self.outbox.wait(timeout=0.2):
                continue
            with self._lock:
                self._lock.wait_for(
                    lambda: self._in_flight < self._window or self._stopping.is_set(), 0.2
                )
            try:
                handed = self.step()
            except Exception:  # a client bug must not kill the sender thread
                log.exception("sender step failed")
                handed = 0
            if handed == 0 and len(self.outbox):
                self._stopping.wait(self.RETRY_S)
