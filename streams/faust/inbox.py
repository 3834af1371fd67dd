"""The agents' inboxes: messages handed from the consumer's fetch loop to an agent in bulk.

Faust delivers a fetched record to an agent through its conductor, a channel queue and
the agent's stream, awaiting each step: in the fetch loop alone two tasks and an
`asyncio.wait` per record (mode's `wait_first`), then an event object, a queue put and get
and a context variable per record in the stream. That was about 110 µs of CPU per record
under a backlog, against 20 µs for a bare aiokafka consumer reading and decoding the same
(BENCHMARKS.md, worker): half the worker's CPU, with a node sample and a pod usage record
per node per second.

Here the worker's consumer (`streams.faust.consumer`) puts each fetched record of an
agent's topics into that agent's `Inbox`, a deque, with no await; the agent takes them in
batches as it took them from its stream. What Faust's stream did for a record is kept:

- a record is tracked as unacknowledged when the agent takes it (Faust's rebalance waits
  for those to be acknowledged before it commits), and acknowledged once the agent has
  processed its batch, when it asks for the next (as `take_events` did);
- a record fetched before the current rebalance generation, or taken while Faust's flow is
  suspended (a rebalance under way), is dropped unprocessed and unacknowledged: Faust seeks
  each assigned partition back to its commit, so it comes again;
- a record for two agents (the tick topic) is acknowledged when both have processed it;
- the fetch loop waits while an inbox holds `limit` records (Faust's stream buffer did the
  same), so memory stays bounded under a backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Iterable
from typing import Any

from streams.runtime.agent_loop import BATCH_MAX

__all__ = ["INBOX_LIMIT", "Inbox", "Inboxes"]

INBOX_LIMIT = 2 * BATCH_MAX
"""Records waiting for one agent: a batch being taken and the next one fetched (Faust's
stream buffer held 4,096: 23 MB of node samples, most of it never needed)."""


SPACE_WAIT_S = 0.5  # a full inbox is looked at again at least this often (a stop)


class Inbox:
    """The records of one agent's topics, fetched and not yet taken."""

    def __init__(self, name: str, topics: Iterable[str], limit: int = INBOX_LIMIT) -> None:
        self.name = name
        self.topics = frozenset(topics)
        self.limit = limit
        self._records: deque[Any] = deque()
        self._arrived = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._want = 1

    def __len__(self) -> int:
        return len(self._records)

    def put(self, message: Any) -> None:
        """A fetched record (the fetch loop's; never waits)."""
        records = self._records
        records.append(message)
        if len(records) >= self._want:
            self._arrived.set()
        if len(records) >= self.limit:
            self._space.clear()

    @property
    def full(self) -> bool:
        """Whether the fetch loop should wait before it puts more."""
        return not self._space.is_set()

    async def space(self, within: float) -> None:
        """Wait until the inbox is half empty, at most `within` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._space.wait(), within)

    def waiting(self) -> list[Any]:
        """The records not taken yet."""
        return list(self._records)

    def clear(self) -> list[Any]:
        """Forget every record not taken yet (a rebalance: they come again from commits)."""
        records = list(self._records)
        self._records.clear()
        self._space.set()
        return records

    async def take(self, max_: int, within: float) -> list[Any]:
        """Up to `max_` records: as soon as there are that many, or after `within` seconds
        with at least one."""
        records = self._records
        while len(records) < max_:
            self._want = max_
            self._arrived.clear()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), within)
            finally:
                self._want = 1
            if records:
                break
        n = min(max_, len(records))
        batch = [records.popleft() for _ in range(n)]
        if len(records) <= self.limit // 2:
            self._space.set()
        return batch


class Inboxes:
    """Every agent's inbox, by topic, and what the agents' batches do with Faust's acks."""

    def __init__(self, app: Any, inboxes: Iterable[Inbox]) -> None:
        self.app = app
        self.inboxes = tuple(inboxes)
        by_topic: dict[str, list[Inbox]] = {}
        for inbox in self.inboxes:
            for topic in inbox.topics:
                by_topic.setdefault(topic, []).append(inbox)
        self.by_topic: dict[str, tuple[Inbox, ...]] = {t: tuple(b) for t, b in by_topic.items()}

    def deliver(self, message: Any) -> bool:
        """Put a fetched record into the inboxes of its topic; False: not an agent's topic."""
        inboxes = self.by_topic.get(message.topic)
        if inboxes is None:
            return False
        if len(inboxes) > 1:
            message.incref(len(inboxes))  # acknowledged when the last agent has it done
        for inbox in inboxes:
            inbox.put(message)
        return True

    def full(self) -> Inbox | None:
        """An inbox the fetch loop must wait for, if any."""
        for inbox in self.inboxes:
            if inbox.full:
                return inbox
        return None

    def hold(self, message: Any) -> Awaitable[None] | None:
        """What the fetch loop awaits before it hands `message` on: a full inbox's space
        (at most `SPACE_WAIT_S`, then it looks again), or None to hand it on now.

        Only records the agents take wait. Another topic's record goes to Faust's conductor:
        a changelog's, read by Faust's table recovery after a rebalance. Holding that one
        behind a full inbox can hold the recovery for good (the agents wait for it before
        they take more), and Faust then logs "No event received for active tp ... since
        recovery start"."""
        if message.topic not in self.by_topic:
            return None
        full = self.full()
        return None if full is None else full.space(SPACE_WAIT_S)

    def clear(self) -> None:
        """Forget every record not taken yet (partitions revoked)."""
        unacked = self.app.consumer.unacked
        for inbox in self.inboxes:
            unacked.difference_update(inbox.clear())

    async def batches(
        self, inbox: Inbox, max_: int, within: float
    ) -> AsyncGenerator[list[Any], None]:
        """Batches of `inbox`'s current records; each acknowledged when the next is asked for."""
        app = self.app
        consumer = app.consumer
        unacked = consumer.unacked
        flow_active = app.flow_control.is_active
        # What Faust's stream tells its monitor per event, per batch here: the consumer
        # thread logs a partition whose records are fetched but not taken for 5 minutes.
        monitor = getattr(app, "monitor", None)
        inbound = None if monitor is None else monitor.stream_inbound_time
        taken: list[Any] = []
        try:
            while True:
                for message in taken:
                    message.ack(consumer)
                taken = []
                records = await inbox.take(max_, within)
                generation = app.consumer_generation_id
                if not flow_active():
                    # A rebalance: the records come again from the commits. A tick the
                    # other agent took is not waited for any more either.
                    unacked.difference_update(records)
                    continue
                for message in records:
                    if message.generation_id != generation:
                        unacked.discard(message)  # fetched before the rebalance: likewise
                        continue
                    unacked.add(message)
                    taken.append(message)
                if taken:
                    if inbound is not None:
                        now = time.monotonic()
                        for tp in {message.tp for message in taken}:
                            inbound[tp] = now
                    yield taken
        finally:
            # The agent stopped (or failed) inside a batch: its records are not done, so
            # not acknowledged, and no longer waited for by a rebalance or a stop; nor are
            # the ones it did not take (a tick the other agent has done).
            unacked.difference_update(taken)
            unacked.difference_update(inbox.waiting())
