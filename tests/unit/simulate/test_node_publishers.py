"""Each simulated node's own Publisher over one common sender: per-node buffers and counters,
a refusing client ends the round."""

from __future__ import annotations

from support.publishing import SharedSender

from gpuwatch.harness.simulate.publishing import NodePublishers
from producers.base.publisher import Abandoned, Done, Publisher


def test_a_full_buffer_drops_that_nodes_oldest_only() -> None:
    sender = SharedSender(refuse=True)
    publishers = NodePublishers(sender, max_buffer_bytes=10)
    a, b = publishers.publish_for("a"), publishers.publish_for("b")
    for i in range(4):
        a(b"a", b"1234%d" % i)  # 6 bytes each: the buffer holds one
    b(b"b", b"12345")

    assert {n: p.outbox.dropped for n, p in publishers.by_node.items()} == {"a": 3, "b": 0}
    assert publishers.dropped == 3
    assert publishers.queued() == 2


def test_a_refusing_client_ends_the_round_and_asks_for_the_retry_pause() -> None:
    sender = SharedSender(refuse=True)
    publishers = NodePublishers(sender, max_buffer_bytes=1 << 20)
    publishers.publish_for("a")(b"a", b"1")
    publishers.publish_for("b")(b"b", b"2")

    assert publishers.step() == Publisher.RETRY_S
    # The client is common: b was not tried after a was refused.
    assert {n: p.stats.blocked for n, p in publishers.by_node.items()} == {"a": 1, "b": 0}
    assert publishers.queued() == 2

    sender.refuse = False
    assert publishers.step() is None  # everything handed over, nothing left
    assert sender.got == [(b"a", b"1"), (b"b", b"2")]
    assert publishers.sent == 2


class HoldingSharedSender(SharedSender):
    """The common client holding every message until the test answers it; abandoning it
    answers everything it holds `Abandoned`, as the Kafka client's forced close does."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[tuple[bytes, Done]] = []

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.got.append((key, value))
        self.pending.append((value, done))

    def answer(self, value: bytes, error: BaseException | None) -> None:
        for index, (held, done) in enumerate(self.pending):
            if held == value:
                del self.pending[index]
                done(error)
                return
        raise AssertionError(f"{value!r} is not held")

    def abandon(self) -> None:
        super().abandon()
        held, self.pending = self.pending, []
        for _value, done in held:
            done(Abandoned("abandoned"))


def test_one_node_given_up_abandons_the_common_client_once_and_every_node_sends_again() -> None:
    sender = HoldingSharedSender()
    publishers = NodePublishers(sender, max_buffer_bytes=1 << 20)
    a, b = publishers.publish_for("a"), publishers.publish_for("b")
    a(b"a", b"a0")
    a(b"a", b"a1")
    b(b"b", b"b0")
    publishers.step()
    assert [v for _k, v in sender.got] == [b"a0", b"a1", b"b0"]

    sender.answer(b"a0", None)
    sender.answer(b"a1", TimeoutError("expired in the client"))  # a's client gave it up
    a(b"a", b"a2")
    publishers.step()  # a abandons the common client: b's b0 comes back too

    assert sender.abandoned == 1
    assert [v for _k, v in sender.got][3:] == [b"a1", b"a2", b"b0"]
    for value in (b"a1", b"a2", b"b0"):
        sender.answer(value, None)
    assert publishers.step() is None
    assert sender.abandoned == 1  # b's `Abandoned` answers abandon nothing more
    assert {n: p.stats.sent for n, p in publishers.by_node.items()} == {"a": 3, "b": 1}
    assert {n: p.stats.retried for n, p in publishers.by_node.items()} == {"a": 1, "b": 1}
    assert publishers.failed == publishers.dropped == publishers.queued() == 0
