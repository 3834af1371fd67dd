"""Publisher: ordered, windowed hand-over to a sender that may ack, hold, refuse or fail."""

from __future__ import annotations

import pytest
from support.publishing import SIZE, AckingSender, RefusingSender, keys, message

from producers.agent.publisher import Done, MessageSender, Publisher


def loaded(sender: MessageSender, count: int, **window: int) -> Publisher:
    """A publisher of `sender` holding messages 0 to `count` - 1, none handed over yet."""
    publisher = Publisher(sender, max_buffer_bytes=10_000, **window)
    for n in range(count):
        publisher.publish(*message(n))
    return publisher


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


def test_step_hands_everything_over_in_order() -> None:
    sender = AckingSender()
    publisher = loaded(sender, 100)

    assert publisher.step() == 100

    assert keys(sender.sent) == list(range(100))
    assert publisher.stats.sent == 100
    assert publisher.in_flight_bytes == 0
    assert len(publisher.outbox) == 0
    assert publisher.step() == 0


def test_the_in_flight_window_limits_what_is_handed_over() -> None:
    sender = HoldingSender()
    publisher = loaded(sender, 6, in_flight_bytes=3 * SIZE)

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
    publisher = loaded(sender, 4, in_flight_bytes=25)

    assert publisher.step() == 2  # 20 of 25 bytes
    assert publisher.step() == 1  # 5 bytes of room: one 10-byte message still goes
    assert publisher.in_flight_bytes == 30
    assert publisher.step() == 0
    assert keys(sender.sent) == [0, 1, 2]


def test_send_blocked_puts_the_rest_back_at_the_head_in_order() -> None:
    sender = RefusingSender(accept=2)
    publisher = loaded(sender, 5)

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
    publisher = loaded(sender, 3, in_flight_bytes=2 * SIZE)
    assert publisher.step() == 2

    sender.ack(1, error=TimeoutError("delivery timeout"))
    sender.ack(1)

    assert (publisher.stats.sent, publisher.stats.failed) == (1, 1)
    assert publisher.in_flight_bytes == 0
    assert publisher.step() == 1


def test_an_unexpected_send_error_loses_one_message_counted_and_keeps_the_rest() -> None:
    sender = BrokenSender(bad={2})
    publisher = loaded(sender, 6, in_flight_bytes=3 * SIZE)

    with pytest.raises(RuntimeError, match="client bug"):
        publisher.step()

    # The bad message is lost and counted; the window does not leak its bytes.
    assert publisher.stats.failed == 1
    assert publisher.in_flight_bytes == 0
    assert len(publisher.outbox) == 3
    assert publisher.step() == 3
    assert keys(sender.sent) == [0, 1, 3, 4, 5]
    assert publisher.stats.sent == 5
