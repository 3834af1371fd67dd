"""Publisher: ordered, windowed hand-over to a sender that may ack, hold, refuse or hang."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from support import holds_within

from producers.agent.outbox import Entry
from producers.agent.publisher import Done, Publisher, SendBlocked

SIZE = 10  # every test message is 10 bytes: 5-byte key, 5-byte value
# 10,000 publishes take ~0.3 s here, ~3 s on a starved CPU. A publish that waited for the
# sender would not return at all (nothing drains), or take RETRY_S each: hours.
FAST_S = 10.0


def message(n: int) -> tuple[bytes, bytes]:
    return f"{n:05d}".encode(), b"v" * (SIZE - 5)


def keys(sent: Sequence[tuple[bytes, bytes] | Entry]) -> list[int]:
    return [int(item.key if isinstance(item, Entry) else item[0]) for item in sent]


class AckingSender:
    """Acknowledges every message inside `send`, as a client with a broker next door might."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.closed_with: float | None = None

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.sent.append((key, value))
        done(None)

    def flush(self, timeout_s: float) -> None:
        return None

    def close(self, timeout_s: float) -> None:
        self.closed_with = timeout_s


class HoldingSender(AckingSender):
    """Takes messages and holds their callbacks until the test acknowledges them."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[Done] = []

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.sent.append((key, value))
        self.pending.append(done)

    def ack(self, count: int, error: BaseException | None = None) -> None:
        for done in self.pending[:count]:
            done(error)
        del self.pending[:count]


class RefusingSender(AckingSender):
    """Takes `accept` messages, then raises SendBlocked (no broker) until opened."""

    def __init__(self, accept: int = 0) -> None:
        super().__init__()
        self.accept = accept
        self.refusals = 0

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        if len(self.sent) >= self.accept:
            self.refusals += 1
            raise SendBlocked("no broker")
        super().send(key, value, done)


class HangingSender(AckingSender):
    """A client whose `send` never returns until released (a client bug, a dead lock)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.entered.set()
        self.release.wait()
        raise SendBlocked("released")


class BrokenSender(AckingSender):
    """Raises an unexpected error for the messages named in `bad`; acks the others."""

    def __init__(self, bad: set[int]) -> None:
        super().__init__()
        self.bad = bad

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        if int(key) in self.bad:
            self.bad.discard(int(key))
            raise RuntimeError("client bug")
        super().send(key, value, done)


@pytest.fixture
def publishers() -> Iterator[list[Publisher]]:
    """Publishers whose threads a test started; stopped afterwards so no thread outlives it."""
    started: list[Publisher] = []
    yield started
    for publisher in started:
        publisher.stop(timeout_s=0.1)


def test_step_hands_everything_over_in_order() -> None:
    sender = AckingSender()
    publisher = Publisher(sender, max_buffer_bytes=10_000)
    for n in range(100):
        publisher.publish(*message(n))

    assert publisher.step() == 100

    assert keys(sender.sent) == list(range(100))
    assert publisher.stats.sent == 100
    assert publisher.in_flight_bytes == 0
    assert len(publisher.outbox) == 0
    assert publisher.step() == 0


def test_the_in_flight_window_limits_what_is_handed_over() -> None:
    sender = HoldingSender()
    publisher = Publisher(sender, max_buffer_bytes=10_000, in_flight_bytes=3 * SIZE)
    for n in range(6):
        publisher.publish(*message(n))

    assert publisher.step() == 3
    assert publisher.in_flight_bytes == 3 * SIZE
    assert publisher.step() == 0  # the window is full until something is acknowledged
    assert len(publisher.outbox) == 3

    sender.ack(1)
    assert publisher.stats.sent == 1
    assert publisher.in_flight_bytes == 2 * SIZE
    assert publisher.step() == 1

    sender.ack(4)
    assert publisher.step() == 2
    sender.ack(2)
    assert keys(sender.sent) == [0, 1, 2, 3, 4, 5]
    assert publisher.stats.sent == 6
    assert publisher.in_flight_bytes == 0


def test_one_message_goes_even_when_it_is_larger_than_the_room_left() -> None:
    sender = HoldingSender()
    publisher = Publisher(sender, max_buffer_bytes=10_000, in_flight_bytes=25)
    for n in range(4):
        publisher.publish(*message(n))

    assert publisher.step() == 2  # 20 of 25 bytes
    assert publisher.step() == 1  # 5 bytes of room: one 10-byte message still goes
    assert publisher.in_flight_bytes == 30
    assert publisher.step() == 0
    assert keys(sender.sent) == [0, 1, 2]


def test_send_blocked_puts_the_rest_back_at_the_head_in_order() -> None:
    sender = RefusingSender(accept=2)
    publisher = Publisher(sender, max_buffer_bytes=10_000)
    for n in range(5):
        publisher.publish(*message(n))

    assert publisher.step() == 2

    assert publisher.stats.blocked == 1
    assert publisher.in_flight_bytes == 0  # the refused message is not in flight
    assert len(publisher.outbox) == 3
    publisher.publish(*message(5))  # arrives while the client refuses

    assert publisher.step() == 0
    assert publisher.stats.blocked == 2
    sender.accept = 100
    assert publisher.step() == 4
    assert keys(sender.sent) == [0, 1, 2, 3, 4, 5]
    assert publisher.stats.sent == 6


def test_a_failed_delivery_is_counted_and_frees_the_window() -> None:
    sender = HoldingSender()
    publisher = Publisher(sender, max_buffer_bytes=10_000, in_flight_bytes=2 * SIZE)
    for n in range(3):
        publisher.publish(*message(n))
    assert publisher.step() == 2

    sender.ack(1, error=TimeoutError("delivery timeout"))
    sender.ack(1)

    assert (publisher.stats.sent, publisher.stats.failed) == (1, 1)
    assert publisher.in_flight_bytes == 0
    assert publisher.step() == 1


def test_an_unexpected_send_error_loses_one_message_counted_and_keeps_the_rest() -> None:
    sender = BrokenSender(bad={2})
    publisher = Publisher(sender, max_buffer_bytes=10_000, in_flight_bytes=3 * SIZE)
    for n in range(6):
        publisher.publish(*message(n))

    with pytest.raises(RuntimeError, match="client bug"):
        publisher.step()

    # The bad message is lost and counted; the window does not leak its bytes.
    assert publisher.stats.failed == 1
    assert publisher.in_flight_bytes == 0
    assert len(publisher.outbox) == 3
    assert publisher.step() == 3
    assert keys(sender.sent) == [0, 1, 3, 4, 5]
    assert publisher.stats.sent == 5


def test_the_thread_sends_what_is_published_and_stop_closes_the_sender(
    publishers: list[Publisher],
) -> None:
    sender = AckingSender()
    publisher = Publisher(sender, max_buffer_bytes=10_000, in_flight_bytes=5 * SIZE)
    publishers.append(publisher)
    publisher.start()

    for n in range(200):
        publisher.publish(*message(n))
    publisher.stop(timeout_s=10.0)

    assert keys(sender.sent) == list(range(200))
    assert publisher.stats.sent == 200
    assert sender.closed_with is not None
    assert sender.closed_with > 0
    assert not any(t.name == "gpuwatch-publisher" for t in threading.enumerate())


def test_the_thread_resumes_after_the_client_refused(publishers: list[Publisher]) -> None:
    sender = RefusingSender(accept=0)
    publisher = Publisher(sender, max_buffer_bytes=10_000)
    publisher.RETRY_S = 0.01
    publishers.append(publisher)
    publisher.start()
    for n in range(10):
        publisher.publish(*message(n))
    assert holds_within(lambda: sender.refusals >= 3, timeout_s=10.0, interval_s=0.001)
    assert sender.sent == []

    sender.accept = 1000
    assert holds_within(lambda: publisher.stats.sent == 10, timeout_s=10.0, interval_s=0.001)
    assert keys(sender.sent) == list(range(10))
    assert publisher.stats.blocked == sender.refusals


def test_stop_gives_up_after_its_timeout_and_still_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender = RefusingSender(accept=0)
    publisher = Publisher(sender, max_buffer_bytes=10_000)
    publisher.start()
    for n in range(5):
        publisher.publish(*message(n))

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="producers.agent.publisher"):
        publisher.stop(timeout_s=0.3)
    took = time.monotonic() - started

    assert 0.3 <= took < 3.0
    assert sender.closed_with is not None
    assert len(publisher.outbox) == 5  # kept, in order, for nobody: counted in the log
    assert "stopped with messages unsent unsent=5" in caplog.text
    assert not any(t.name == "gpuwatch-publisher" for t in threading.enumerate())


def test_publish_never_blocks_while_the_client_refuses(publishers: list[Publisher]) -> None:
    sender = RefusingSender(accept=0)
    publisher = Publisher(sender, max_buffer_bytes=100 * SIZE)
    publishers.append(publisher)
    publisher.start()

    started = time.monotonic()
    for n in range(10_000):
        publisher.publish(*message(n))
    took = time.monotonic() - started

    assert took < FAST_S, f"publishing 10,000 messages took {took:.2f} s"
    assert publisher.outbox.size_bytes <= publisher.outbox.max_bytes
    assert len(publisher.outbox) == 100
    assert publisher.outbox.dropped == 10_000 - 100
    assert publisher.outbox.dropped_bytes == (10_000 - 100) * SIZE
    assert sender.sent == []
    # The newest survive: the oldest were dropped first.
    assert keys(publisher.outbox.take(10_000)) == list(range(9_900, 10_000))


def test_publish_never_blocks_while_the_client_hangs() -> None:
    sender = HangingSender()
    publisher = Publisher(sender, max_buffer_bytes=50 * SIZE)
    publisher.start()
    try:
        publisher.publish(*message(0))
        assert sender.entered.wait(timeout=10)

        started = time.monotonic()
        for n in range(1, 10_001):
            publisher.publish(*message(n))
        took = time.monotonic() - started

        assert took < FAST_S, f"publishing 10,000 messages took {took:.2f} s"
        assert len(publisher.outbox) == 50
        assert publisher.outbox.dropped == 10_000 - 50
    finally:
        sender.release.set()
        publisher.stop(timeout_s=0.1)
    assert not any(t.name == "gpuwatch-publisher" for t in threading.enumerate())
