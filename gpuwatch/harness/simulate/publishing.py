"""The simulated nodes' publishing: one real Publisher per node, as each node's agent has,
sharing one Kafka client and one sender thread.

Each node keeps its own bounded buffer and counters (sent, dropped, lost, in flight), so the
agents' self-metrics read per node what a real node's agent would export, while a fleet of
hundreds of nodes still costs one client and one thread.
"""

from __future__ import annotations

import logging
import threading
import time

from producers.agent.loop import Publish
from producers.base.publisher import Done, MessageSender, Publisher

__all__ = ["NodePublishers"]

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.2  # the sender thread's longest sleep with nothing queued
BUSY_WAIT_S = 0.02  # pause while in-flight windows are full and acknowledgements come back


class _Shared:
    """The common client as each node's Publisher sees it: closing one closes nothing."""

    def __init__(self, sender: MessageSender) -> None:
        self._sender = sender

    @property
    def delivery_timeout_s(self) -> float:
        """The common client's."""
        return self._sender.delivery_timeout_s

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        """Hand one message to the common client."""
        self._sender.send(key, value, done)

    def abandon(self) -> None:
        """Abandon the common client: every node's messages in flight are sent again (each
        node's publisher gets them back `Abandoned`, and abandons nothing more)."""
        self._sender.abandon()

    def flush(self, timeout_s: float) -> None:
        """Wait for the common client's acknowledgements."""
        self._sender.flush(timeout_s)

    def close(self, timeout_s: float) -> None:
        """Nothing: `NodePublishers.stop` closes the common client once."""


class NodePublishers:
    """A Publisher per node over one sender, driven by one thread: `publish_for(node)` is the
    publish function of that node's agent.

    A node whose client gave messages up abandons the common client; the other nodes get
    theirs back too and send them again through the fresh one, each in its order.
    """

    def __init__(self, sender: MessageSender, max_buffer_bytes: int) -> None:
        self._sender = sender
        self._shared = _Shared(sender)
        self._max_buffer_bytes = max_buffer_bytes
        self.by_node: dict[str, Publisher] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def publish_for(self, node: str) -> Publish:
        """The publish function of `node`'s agent: its own buffer, then the sender thread
        (before `start`)."""
        publisher = self.by_node.get(node)
        if publisher is None:
            publisher = self.by_node[node] = Publisher(self._shared, self._max_buffer_bytes)
        wake = self._wake.set

        def publish(key: bytes, value: bytes) -> None:
            publisher.publish(key, value)
            wake()

        return publish

    @property
    def sent(self) -> int:
        """Messages acknowledged, every node together."""
        return sum(p.stats.sent for p in self.by_node.values())

    @property
    def dropped(self) -> int:
        """Messages dropped from full buffers, every node together."""
        return sum(p.outbox.dropped for p in self.by_node.values())

    @property
    def failed(self) -> int:
        """Messages lost, every node together."""
        return sum(p.stats.failed for p in self.by_node.values())

    def queued(self) -> int:
        """Messages waiting in the nodes' buffers."""
        return sum(len(p.outbox) for p in self.by_node.values())

    def start(self) -> None:
        """Start the sender thread."""
        self._thread = threading.Thread(
            target=self._run, name="gpuwatch-simulate-samples", daemon=True
        )
        self._thread.start()

    def step(self) -> float | None:
        """Hand over what every node's window allows; the pause before the next round, None
        when nothing is left queued.

        A node whose message the client refuses (no broker) ends the round: the client is
        common, so the other nodes would be refused too.
        """
        pending = False
        for node, publisher in self.by_node.items():
            if not len(publisher.outbox):
                continue
            blocked = publisher.stats.blocked
            try:
                publisher.step()
            except Exception:  # one refused message must not stop every node's publishing
                log.exception("sender step failed node=%s", node)
            if publisher.stats.blocked != blocked:
                return Publisher.RETRY_S
            if publisher.outbox.waiting:
                pending = True
        return BUSY_WAIT_S if pending else None

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(IDLE_WAIT_S)
            self._wake.clear()
            pause = self.step()
            if pause is not None:
                self._stopping.wait(pause)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (for at most `timeout_s`), then close the client."""
        deadline = time.monotonic() + timeout_s
        while self.queued() and time.monotonic() < deadline and self._thread is not None:
            time.sleep(0.01)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
        self._sender.close(max(0.1, deadline - time.monotonic()))
        for publisher in self.by_node.values():
            publisher.stop(timeout_s=0.0)  # counts and logs what was not acknowledged
