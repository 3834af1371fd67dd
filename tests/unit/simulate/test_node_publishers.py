"""Each simulated node's own Publisher over one common sender: per-node buffers and counters,
one thread, a refusing client ends the round, the common client closed once."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from support import wait_until

from producers.agent.publisher import Done, Publisher, SendBlocked
from producers.simulate.publishing import NodePublishers


@dataclass
class Sender:
    """Acknowledges at once, or refuses (no broker) while `refuse` is set."""

    refuse: bool = False
    got: list[tuple[bytes, bytes]] = field(default_factory=list)
    closed: int = 0

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        if self.refuse:
            raise SendBlocked("no broker")
        self.got.append((key, value))
        done(None)

    def flush(self, timeout_s: float) -> None:
        """Nothing is held."""

    def close(self, timeout_s: float) -> None:
        self.closed += 1


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


def test_each_node_counts_its_own_messages_and_the_client_closes_once() -> None:
    sender = Sender()
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


def test_a_full_buffer_drops_that_nodes_oldest_only() -> None:
    sender = Sender(refuse=True)
    publishers = NodePublishers(sender, max_buffer_bytes=10)
    a, b = publishers.publish_for("a"), publishers.publish_for("b")
    for i in range(4):
        a(b"a", b"1234%d" % i)  # 6 bytes each: the buffer holds one
    b(b"b", b"12345")

    assert {n: p.outbox.dropped for n, p in publishers.by_node.items()} == {"a": 3, "b": 0}
    assert publishers.dropped == 3
    assert publishers.queued() == 2


def test_a_refusing_client_ends_the_round_and_asks_for_the_retry_pause() -> None:
    sender = Sender(refuse=True)
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
