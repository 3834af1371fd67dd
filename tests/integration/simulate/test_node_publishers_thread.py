"""Simulated nodes' Publishers on their one thread: each node counts its own messages, the
common client is closed once."""

from __future__ import annotations

from support import wait_until
from support.publishing import SharedSender

from gpuwatch.harness.simulate.publishing import NodePublishers


def test_each_node_counts_its_own_messages_and_the_client_closes_once() -> None:
    sender = SharedSender()
    publishers = NodePublishers(sender, max_buffer_bytes=1 << 20)
    a, b = publishers.publish_for("a"), publishers.publish_for("b")
    publishers.start()
    for i in range(3):
        a(b"a", b"a%d" % i)
    b(b"b", b"b0")
    b(b"b", b"b1")

    wait_until(lambda: publishers.sent >= 5, timeout_s=10, what="5 messages sent", interval_s=0.01)
    publishers.stop(timeout_s=5)

    assert {n: p.stats.sent for n, p in publishers.by_node.items()} == {"a": 3, "b": 2}
    # Each node's messages in the order published.
    assert [v for k, v in sender.got if k == b"a"] == [b"a0", b"a1", b"a2"]
    assert [v for k, v in sender.got if k == b"b"] == [b"b0", b"b1"]
    assert sender.closed == 1
