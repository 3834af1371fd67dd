"""Publisher: ordered, windowed hand-over to a sender that may ack, hold, refuse or fail."""

from __future__ import annotations

import pytest
from support.publishing import SIZE, AckingSender, RefusingSender, keys, message

from producers.base.publisher import Abandoned, Done, MessageSender, Publisher, Rejected


def loaded(sender: MessageSender, count: int, in_flight_bytes: int = 1 << 20) -> Publisher:
    """A publisher of `sender` holding messages 0 to `count` - 1, none handed over yet."""
    publisher = Publisher(sender, max_buffer_bytes=10_000, in_flight_bytes=in_flight_bytes)
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

    def abandon(self) -> None:
        """As the Kafka client does: everything held is answered `Abandoned`."""
        super().abandon()
        self.ack(len(self.pending), Abandoned("abandoned"))


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
    assert (publisher.outbox.waiting, len(publisher.outbox)) == (3, 6)

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


def test_an_acknowledgement_is_what_removes_a_message_from_the_outbox() -> None:
    acked: list[bytes] = []
    sender = HoldingSender()
    publisher = Publisher(
        sender, max_buffer_bytes=10_000, on_acked=lambda key, _value: acked.append(key)
    )
    for n in range(3):
        publisher.publish(*message(n))
    assert publisher.step() == 3

    assert (len(publisher.outbox), publisher.outbox.size_bytes) == (3, 3 * SIZE)
    sender.ack(2)
    assert (len(publisher.outbox), publisher.outbox.size_bytes) == (1, SIZE)
    assert keys([(k, b"") for k in acked]) == [0, 1]
    assert publisher.stats.sent == 2


def test_a_given_up_message_goes_back_ahead_of_newer_ones_and_is_sent_again() -> None:
    sender = HoldingSender()
    publisher = loaded(sender, 5, in_flight_bytes=3 * SIZE)
    assert publisher.step() == 3  # 0, 1, 2 in flight; 3, 4 wait

    sender.ack(1)  # 0 acknowledged
    sender.ack(1, error=TimeoutError("delivery timeout"))  # 1 given up by the client
    # The client is abandoned before anything more goes: its answer for 2 (a forced close's
    # `Abandoned`) comes first, then 1 and 2 go back ahead of 3 and 4.
    assert publisher.step() == 3
    assert sender.abandoned == 1
    assert keys(sender.sent) == [0, 1, 2, 1, 2, 3]
    assert (publisher.stats.retried, publisher.stats.failed) == (2, 0)

    sender.ack(3)
    assert publisher.step() == 1
    sender.ack(1)
    assert keys(sender.sent)[-1] == 4
    assert publisher.stats.sent == 5
    assert len(publisher.outbox) == 0
    assert sender.abandoned == 1  # `Abandoned` answers abandon nothing more


def test_given_up_messages_wait_for_every_answer_of_the_window_before_going_again() -> None:
    sender = HoldingSender()
    sender.abandon = lambda: None  # type: ignore[method-assign] # a client slow to close
    publisher = loaded(sender, 4, in_flight_bytes=3 * SIZE)
    assert publisher.step() == 3

    sender.pending[1](TimeoutError("delivery timeout"))  # 1 given up; 0 and 2 unanswered
    assert publisher.step() == 0  # 0 or 2 may still be written: nothing goes before they answer
    sender.pending[0](None)
    sender.pending[2](Abandoned("closed"))
    assert publisher.step() == 3
    assert keys(sender.sent) == [0, 1, 2, 1, 2, 3]
    assert publisher.stats.retried == 2


def test_a_client_that_acknowledges_nothing_for_its_delivery_timeout_is_abandoned() -> None:
    sender = HoldingSender()
    sender.delivery_timeout_s = 0.0
    publisher = loaded(sender, 2)
    assert publisher.step() == 2
    assert sender.abandoned == 0

    assert publisher.step() == 2  # stalled: abandoned, and both sent again through a fresh one
    assert sender.abandoned == 1
    assert keys(sender.sent) == [0, 1, 0, 1]
    assert publisher.stats.retried == 2


def test_a_rejected_message_is_lost_and_counted_not_sent_again() -> None:
    sender = HoldingSender()
    publisher = loaded(sender, 2)
    assert publisher.step() == 2

    sender.ack(1, error=Rejected("message too large"))
    sender.ack(1)

    assert (publisher.stats.sent, publisher.stats.failed, publisher.stats.retried) == (1, 1, 0)
    assert len(publisher.outbox) == 0
    assert publisher.step() == 0
    assert sender.abandoned == 0


def test_a_full_outbox_drops_the_oldest_waiting_and_keeps_what_is_in_flight() -> None:
    sender = HoldingSender()
    publisher = Publisher(sender, max_buffer_bytes=5 * SIZE, in_flight_bytes=2 * SIZE)
    for n in range(5):
        publisher.publish(*message(n))
    assert publisher.step() == 2

    for n in range(5, 8):
        publisher.publish(*message(n))  # 2, 3, 4 go: 0 and 1 are in the client's hands

    assert publisher.outbox.dropped == 3
    sender.ack(2, error=TimeoutError("broker away"))
    assert publisher.step() == 2
    sender.ack(2)
    assert publisher.step() == 2
    sender.ack(2)
    assert publisher.step() == 1
    sender.ack(1)
    assert keys(sender.sent) == [0, 1, 0, 1, 5, 6, 7]
    assert publisher.stats.sent == 5 == 8 - publisher.outbox.dropped


def test_stop_counts_what_was_never_acknowledged() -> None:
    sender = HoldingSender()
    publisher = loaded(sender, 5, in_flight_bytes=2 * SIZE)
    assert publisher.step() == 2
    sender.ack(1)

    publisher.stop(timeout_s=0.0)

    assert publisher.stats.undelivered == 4  # one in flight, three waiting
    assert sender.closed_with == 0.0


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
