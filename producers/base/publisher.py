"""Sends the outbox to Kafka on a thread of its own, so sampling never waits for the broker.

The sampling loop only calls `Publisher.publish`, which appends to a bounded `Outbox`.
A sender thread hands messages to the Kafka client while fewer than `in_flight_bytes`
are unacknowledged (a small window: the outbox, not the client, holds an outage). An
entry leaves the outbox only when the broker acknowledges it. When the client gives
messages up (its delivery timeout passed, or the broker answered with an error worth
retrying), or nothing was acknowledged for `sender.delivery_timeout_s` while messages
were in flight, the publisher abandons the client (`MessageSender.abandon`: everything it
holds fails), waits until every message in flight has its answer, puts the given-up ones
back at the head of the outbox in their order and sends them again through a fresh
client (counted in `retried`). So nothing is lost while the outbox has room, and each
key's messages arrive in order. The outbox drops only when full, its oldest waiting
messages first, counted.

A message the broker may have written without its acknowledgement reaching the client
(the broker froze after the write) is sent again by a fresh client: idempotence covers
retries inside one client only, so the copy can arrive twice. The worker applies a
node's sample once: a sample starting before the node's newest one ended is a
redelivery and changes nothing (streams/SEMANTICS.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from producers.base.outbox import Entry, Outbox

log = logging.getLogger(__name__)

Done = Callable[[BaseException | None], None]
Acked = Callable[[bytes, bytes], None]

IN_FLIGHT_BYTES = 256 << 10
"""The default window: about a minute of an 8-GPU node's samples at 1 Hz, and at most
this much for a fresh client to send again after an outage."""


class SendBlocked(Exception):  # noqa: N818 - a condition to retry, not an error
    """The client cannot take a message now (no broker, no metadata); retry later."""


class Rejected(Exception):  # noqa: N818 - the broker's verdict on one message
    """The broker or the client refused this message for good (too large, invalid): sending
    it again would fail again. It is lost and counted (`failed`)."""


class Abandoned(Exception):  # noqa: N818 - the answer to an `abandon`, retried
    """The client the message was handed to was abandoned before it was acknowledged."""


class MessageSender(Protocol):
    """The Kafka client as the publisher needs it (one topic)."""

    @property
    def delivery_timeout_s(self) -> float:
        """How long messages in flight may go unacknowledged before the publisher abandons
        the client and sends them again."""
        ...

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        """Hand one message over; `done(None)` on ack, `done(error)` when it is given up
        (`Rejected`: for good; any other error: it may be sent again).

        Raises `SendBlocked` when the message was not taken.
        """
        ...

    def abandon(self) -> None:
        """Give up everything handed over and not yet acknowledged (each `done` gets an
        error, soon); the next `send` goes through a fresh client."""
        ...

    def flush(self, timeout_s: float) -> None:
        """Wait until what was handed over is acknowledged or `timeout_s` passes."""
        ...

    def close(self, timeout_s: float) -> None:
        """Flush for at most `timeout_s`, give up what is left, release connections; never
        raises for a broker that is away."""
        ...


@dataclass
class PublisherStats:
    """Counters for the agent's self-metrics."""

    sent: int = 0
    failed: int = 0
    """Lost: refused for good by the broker or the client (too large, invalid)."""
    blocked: int = 0
    """Times the client could not take a message (broker away)."""
    retried: int = 0
    """Messages put back in the outbox after the client gave them up, to be sent again."""
    abandoned: int = 0
    """Times the client was given up and replaced (no acknowledgement in time, or errors)."""
    undelivered: int = 0
    """Messages still held when the publisher stopped: never acknowledged, not sent."""


class Publisher:
    """Bounded, non-blocking, ordered, acknowledged publishing of one producer's messages.

    `on_acked(key, value)`, if given, is called once per acknowledged message, on the
    client's thread: it must be quick and must not publish.
    """

    RETRY_S = 0.5  # pause after the client refused a message; brokers come back in seconds
    IDLE_WAIT_S = 0.2  # the sender thread's longest sleep: how soon the stall check runs
    DROP_LOG_S = 30.0  # at most one drop warning per this many seconds

    def __init__(
        self,
        sender: MessageSender,
        max_buffer_bytes: int,
        in_flight_bytes: int = IN_FLIGHT_BYTES,
        *,
        on_acked: Acked | None = None,
    ) -> None:
        self.outbox = Outbox(max_buffer_bytes)
        self.stats = PublisherStats()
        self._sender = sender
        self._window = in_flight_bytes
        self._on_acked = on_acked
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_drop_log = 0.0
        self._given_up: list[Entry] = []
        """In flight, given up by the client: back to the outbox once nothing else is."""
        self._abandon = False
        self._progress_at = time.monotonic()
        """When something was last acknowledged, or the window last started to fill."""

    def publish(self, key: bytes, value: bytes) -> None:
        """Queue one message; never blocks. The oldest queued ones drop when full."""
        dropped = self.outbox.put(Entry(key, value))
        self._wake.set()
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
        return self.outbox.in_flight_bytes

    def start(self) -> None:
        """Start the sender thread."""
        self._thread = threading.Thread(target=self._run, name="gpuwatch-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Send what is held for at most `timeout_s`, then close the client (within the same
        time): whatever the broker does, this returns in about `timeout_s`. What was not
        acknowledged by then is counted (`undelivered`) and logged."""
        deadline = time.monotonic() + timeout_s
        while len(self.outbox) and time.monotonic() < deadline and self._thread is not None:
            time.sleep(0.01)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
        try:
            self._sender.close(max(0.0, deadline - time.monotonic()))
        except Exception:  # a client failing to close must not keep the process alive
            log.exception("closing the kafka client failed")
        self.stats.undelivered = len(self.outbox)
        if self.stats.undelivered:
            log.warning(
                "stopped with messages unsent unsent=%d bytes=%d",
                self.stats.undelivered,
                self.outbox.size_bytes,
            )

    def step(self) -> int:
        """Recover from a client that gave messages up, then hand over what the in-flight
        window allows; returns how many were handed over."""
        if not self._recovered():
            return 0
        room = self._window - self.outbox.in_flight_bytes
        if room <= 0:
            return 0
        entries = self.outbox.take(room)
        if entries and self.outbox.in_flight == len(entries):
            with self._lock:
                self._progress_at = time.monotonic()  # the stall clock starts now
        for index, entry in enumerate(entries):
            try:
                self._sender.send(entry.key, entry.value, self._on_done(entry))
            except SendBlocked:
                self.stats.blocked += 1
                self.outbox.give_back(entries[index:])
                return index
            except Exception:
                # The client refused this one message with an error (too large, closed):
                # it is lost and counted, the rest go back.
                self.outbox.ack(entry)
                with self._lock:
                    self.stats.failed += 1
                self.outbox.give_back(entries[index + 1 :])
                raise
        return len(entries)

    def _recovered(self) -> bool:
        """Abandon the client when it gave messages up or stalled; True once nothing given up
        waits for the rest of the window's answers (then the given-up are queued again)."""
        now = time.monotonic()
        with self._lock:
            stalled = (
                self.outbox.in_flight > len(self._given_up)
                and now - self._progress_at > self._sender.delivery_timeout_s
            )
            reason = "given_up" if self._abandon else "no_ack_in_time" if stalled else None
            self._abandon = False
            if reason is not None:
                self._progress_at = now
        if reason is not None:
            self.stats.abandoned += 1
            log.warning(
                "kafka client abandoned, what it held goes again through a fresh one "
                "reason=%s in_flight=%d waiting=%d",
                reason,
                self.outbox.in_flight,
                self.outbox.waiting,
            )
            self._sender.abandon()
        with self._lock:
            if not self._given_up:
                return True
            if self.outbox.in_flight > len(self._given_up):
                return False  # answers still to come: the given-up go back ahead of them all
            given_up, self._given_up = self._given_up, []
            self.stats.retried += len(given_up)
        self.outbox.give_back(given_up)
        return True

    def _on_done(self, entry: Entry) -> Done:
        def done(error: BaseException | None) -> None:
            if error is None or isinstance(error, Rejected):
                self.outbox.ack(entry)
                with self._lock:
                    if error is None:
                        self.stats.sent += 1
                        self._progress_at = time.monotonic()
                    else:
                        self.stats.failed += 1
                if error is None and self._on_acked is not None:
                    self._on_acked(entry.key, entry.value)
                if error is not None:
                    log.error("message rejected, not sent again error=%r", error)
            else:
                with self._lock:
                    self._given_up.append(entry)
                    # A client that gave one message up may send the next ones (of the same
                    # key) before it is sent again: stop it at once.
                    self._abandon = self._abandon or not isinstance(error, Abandoned)
            self._wake.set()

        return done

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            blocked = self.stats.blocked
            try:
                handed = self.step()
            except Exception:  # a client bug must not kill the sender thread
                log.exception("sender step failed")
                handed = 0
            if self.stats.blocked != blocked:
                self._stopping.wait(self.RETRY_S)
            elif handed == 0:
                self._wake.wait(self.IDLE_WAIT_S)
