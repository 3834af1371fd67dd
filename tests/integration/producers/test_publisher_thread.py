"""Publisher's thread: it sends what is published, resumes after refusals, stops in its
time, and a publish never waits for a client that refuses or hangs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from support import holds_within
from support.publishing import SIZE, AckingSender, RefusingSender, keys, message

from producers.base.publisher import Done, Publisher, SendBlocked

# 10,000 publishes take ~0.3 s here, ~3 s on a starved CPU. A publish that waited for the
# sender would not return at all (nothing drains), or take RETRY_S each: hours.
FAST_S = 10.0


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


@pytest.fixture
def publishers() -> Iterator[list[Publisher]]:
    """Publishers whose threads a test started; stopped afterwards so no thread outlives it."""
    started: list[Publisher] = []
    yield started
    for publisher in started:
        publisher.stop(timeout_s=0.1)


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
    with caplog.at_level(logging.WARNING, logger="producers.base.publisher"):
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
        # Message 0 is in the hanging client's hands: held, never dropped; the 49 newest wait.
        assert (len(publisher.outbox), publisher.outbox.in_flight) == (50, 1)
        assert publisher.outbox.dropped == 10_000 - 49
    finally:
        sender.release.set()
        publisher.stop(timeout_s=0.1)
    assert not any(t.name == "gpuwatch-publisher" for t in threading.enumerate())
