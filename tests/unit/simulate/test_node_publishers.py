"""Each simulated node's own Publisher over one common sender: per-node buffers and counters,
a refusing client ends the round."""

from __future__ import annotations

from support.publishing import SharedSender

from producers.agent.publisher import Publisher
from producers.simulate.publishing import NodePublishers


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
