"""The agents' inboxes and the fetch loop that fills them, without Kafka.

Faust's own message class is used, with a consumer that records its acknowledgements: what
Faust commits is what the inboxes acknowledge.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from faust.types.tuples import ConsumerMessage

from streams.faust.consumer import ReadOffsets
from streams.faust.inbox import Inbox, Inboxes
from streams.faust.internals import drain_messages

TICKS = "ticks"


def message(topic: str, offset: int, partition: int = 0, generation: int = 1) -> Any:
    return ConsumerMessage(
        topic, partition, offset, 0.0, 0, None, b"k", b"v", None, generation_id=generation
    )


class FakeConsumer:
    """What the inboxes use of Faust's consumer: its unacknowledged set and `ack`."""

    def __init__(self) -> None:
        self.unacked: set[Any] = set()
        self.acked: list[tuple[str, int]] = []

    def ack(self, msg: Any) -> bool:
        self.unacked.discard(msg)
        self.acked.append((msg.topic, msg.offset))
        return True


def fake_app() -> Any:
    app = SimpleNamespace(consumer=FakeConsumer(), consumer_generation_id=1, active=True)
    app.monitor = SimpleNamespace(stream_inbound_time={})
    app.flow_control = SimpleNamespace(is_active=lambda: app.active)
    return app


def two_inboxes(app: Any) -> tuple[Inboxes, Inbox, Inbox]:
    node = Inbox("node", ("samples", TICKS), limit=8)
    pod = Inbox("pod", ("usage", TICKS), limit=8)
    return Inboxes(app, (node, pod)), node, pod


def test_take_returns_at_once_when_full_and_after_the_wait_with_fewer() -> None:
    async def scenario() -> None:
        inbox = Inbox("node", ("samples",))
        for offset in range(5):
            inbox.put(message("samples", offset))
        loop = asyncio.get_running_loop()
        started = loop.time()
        batch = await inbox.take(3, within=5.0)
        assert [m.offset for m in batch] == [0, 1, 2]
        assert loop.time() - started < 1.0  # three were there: no wait
        started = loop.time()
        batch = await inbox.take(3, within=0.05)
        assert [m.offset for m in batch] == [3, 4]
        assert loop.time() - started >= 0.04  # fewer than asked: waited for more first

    asyncio.run(scenario())


def test_take_waits_for_the_first_record_past_its_wait() -> None:
    async def scenario() -> None:
        inbox = Inbox("node", ("samples",))
        later = asyncio.get_running_loop().call_later(0.1, inbox.put, message("samples", 7))
        batch = await inbox.take(10, within=0.02)
        later.cancel()
        assert [m.offset for m in batch] == [7]

    asyncio.run(scenario())


def test_take_wakes_when_the_batch_fills_before_its_wait_ends() -> None:
    async def scenario() -> None:
        inbox = Inbox("node", ("samples",))
        inbox.put(message("samples", 0))
        loop = asyncio.get_running_loop()
        for offset in (1, 2):
            loop.call_later(0.05, inbox.put, message("samples", offset))
        started = loop.time()
        batch = await inbox.take(3, within=10.0)
        assert [m.offset for m in batch] == [0, 1, 2]
        assert loop.time() - started < 5.0

    asyncio.run(scenario())


def test_a_full_inbox_has_space_again_once_half_is_taken() -> None:
    async def scenario() -> None:
        inbox = Inbox("node", ("samples",), limit=4)
        full: list[bool] = []
        for offset in range(4):
            inbox.put(message("samples", offset))
        full.append(inbox.full)
        await inbox.take(1, within=0.0)
        full.append(inbox.full)  # three left: over half
        await inbox.take(1, within=0.0)
        full.append(inbox.full)
        for offset in range(4, 6):
            inbox.put(message("samples", offset))
        full.append(inbox.full)
        inbox.clear()
        full.append(inbox.full)
        assert full == [True, True, False, True, False]
        assert len(inbox) == 0

    asyncio.run(scenario())


def test_records_go_to_the_inboxes_of_their_topic() -> None:
    inboxes, node, pod = two_inboxes(fake_app())
    assert inboxes.deliver(message("samples", 0))
    assert inboxes.deliver(message("usage", 0))
    assert inboxes.deliver(message(TICKS, 0))
    assert not inboxes.deliver(message("a-changelog", 0))  # Faust's conductor takes it
    assert len(node) == 2
    assert len(pod) == 2
    assert inboxes.full() is None
    for offset in range(1, 8):
        inboxes.deliver(message("usage", offset))
    assert inboxes.full() is pod


async def _next(batches: AsyncGenerator[list[Any], None]) -> list[Any]:
    return await asyncio.wait_for(batches.__anext__(), 5.0)


def test_a_batch_is_tracked_when_taken_and_acked_when_the_next_is_asked_for() -> None:
    async def scenario() -> None:
        app = fake_app()
        inboxes, node, _ = two_inboxes(app)
        for offset in range(3):
            inboxes.deliver(message("samples", offset))
        batches = inboxes.batches(node, 10, 0.01)
        first = await _next(batches)
        assert [m.offset for m in first] == [0, 1, 2]
        assert app.consumer.unacked == set(first)
        # Faust's monitor is told the partition's records are being taken.
        assert set(app.monitor.stream_inbound_time) == {TP("samples", 0)}
        assert app.consumer.acked == []  # being processed: not acknowledged
        inboxes.deliver(message("samples", 3))
        second = await _next(batches)
        assert app.consumer.acked == [("samples", 0), ("samples", 1), ("samples", 2)]
        assert app.consumer.unacked == set(second)
        await batches.aclose()
        # Closed inside a batch: not done, so not acknowledged, and not waited for.
        assert app.consumer.acked == [("samples", 0), ("samples", 1), ("samples", 2)]
        assert app.consumer.unacked == set()

    asyncio.run(scenario())


def test_records_of_an_earlier_generation_or_taken_in_a_rebalance_are_dropped() -> None:
    async def scenario() -> None:
        app = fake_app()
        inboxes, node, _ = two_inboxes(app)
        inboxes.deliver(message("samples", 0, generation=1))
        app.consumer_generation_id = 2
        inboxes.deliver(message("samples", 1, generation=2))
        batches = inboxes.batches(node, 10, 0.01)
        batch = await _next(batches)
        assert [m.offset for m in batch] == [1]
        app.active = False  # Faust's flow suspended: a rebalance under way
        inboxes.deliver(message("samples", 2, generation=2))
        task = asyncio.ensure_future(_next(batches))
        await asyncio.sleep(0.1)
        assert not task.done()  # dropped: nothing to yield
        app.active = True
        inboxes.deliver(message("samples", 3, generation=2))
        batch = await task
        assert [m.offset for m in batch] == [3]
        # Dropped records are neither acknowledged nor tracked: they come again.
        assert app.consumer.acked == [("samples", 1)]
        assert {m.offset for m in app.consumer.unacked} == {3}

    asyncio.run(scenario())


def test_a_record_for_both_agents_is_acked_once_both_have_done_it() -> None:
    async def scenario() -> None:
        app = fake_app()
        inboxes, node, pod = two_inboxes(app)
        inboxes.deliver(message(TICKS, 5))
        node_batches = inboxes.batches(node, 10, 0.01)
        pod_batches = inboxes.batches(pod, 10, 0.01)
        (tick,) = await _next(node_batches)
        assert (await _next(pod_batches)) == [tick]
        inboxes.deliver(message("samples", 0))
        await _next(node_batches)  # the node agent is done with the tick
        assert app.consumer.acked == []
        inboxes.deliver(message("usage", 0))
        await _next(pod_batches)  # and now the pod agent
        assert app.consumer.acked == [(TICKS, 5)]

    asyncio.run(scenario())


class FakeFetchingConsumer:
    """What Faust's fetch loop reads of its consumer, with records fetched in two polls."""

    def __init__(self, polls: list[list[Any]], fetcher: Any) -> None:
        self._polls = list(polls)
        self._fetcher = fetcher
        self._stopped = asyncio.Event()
        self._read_offset = ReadOffsets()
        self._commit_every = None
        self._n_acked = 0
        self.gaps: list[tuple[TP, int, int]] = []
        self.conducted: list[int] = []
        self.should_stop = False
        self.diag = SimpleNamespace(set_flag=lambda flag: None, unset_flag=lambda flag: None)
        self.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda t: True))
        self.transport = SimpleNamespace(app=SimpleNamespace(should_stop=False))
        self.consumer_stopped_errors = ()
        self.suspend_flow = asyncio.Event()

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Any]]:  # noqa: ASYNC109 (Faust's)
        if not self._polls:
            self._fetcher._stopped.set()
            return
        for record in self._polls.pop(0):
            yield record.tp, record

    async def _add_gap(self, tp: TP, start: int, end: int) -> None:
        self.gaps.append((tp, start, end))

    async def callback(self, record: Any) -> None:
        self.conducted.append(record.offset)

    async def wait_first(self, *coroutines: Any) -> None:
        first, *rest = coroutines
        for other in rest:
            other.close()
        await first


def test_the_fetch_loop_delivers_agent_records_and_conducts_the_others() -> None:
    async def scenario() -> None:
        fetcher = SimpleNamespace(_stopped=asyncio.Event())
        samples = [message("samples", o) for o in (0, 1, 4)]
        polls = [[samples[0], message("a-changelog", 0), samples[1]], [samples[0], samples[2]]]
        consumer = FakeFetchingConsumer(polls, fetcher)
        delivered: list[int] = []
        waits: list[int] = []

        def deliver(record: Any) -> bool:
            if record.topic != "samples":
                return False
            delivered.append(record.offset)
            return True

        def backlogged(record: Any) -> Any:
            if len(delivered) == 2 and len(waits) < 2:
                waits.append(len(delivered))
                return asyncio.sleep(0)
            return None

        await asyncio.wait_for(drain_messages(consumer, fetcher, deliver, backlogged), 5.0)
        # Offset 0 again (read already) is dropped; 2 and 3 are a gap for the commit.
        assert delivered == [0, 1, 4]
        assert consumer.conducted == [0]
        assert consumer._read_offset[TP("samples", 0)] == 4
        assert consumer.gaps == [(TP("samples", 0), 2, 4)]
        assert waits == [2, 2]  # waited twice before the record after the second

    asyncio.run(scenario())


def test_a_changelog_record_is_handed_to_faust_while_an_inbox_stays_full() -> None:
    """Faust's table recovery reads the changelogs through the same fetch loop. A changelog
    record held behind a full inbox whose agent waits for that recovery held both for good
    ("No event received for active tp ... since recovery start")."""

    async def scenario() -> None:
        app = fake_app()
        inboxes, node, _ = two_inboxes(app)
        for offset in range(node.limit):
            inboxes.deliver(message("samples", offset))
        assert node.full  # and nobody takes from it
        held = inboxes.hold(message("samples", 99))
        assert held is not None
        await held  # the space waited for, at most SPACE_WAIT_S: still full
        assert node.full
        assert inboxes.hold(message("a-changelog", 0)) is None
        fetcher = SimpleNamespace(_stopped=asyncio.Event())
        changelog = [message("a-changelog", o) for o in range(3)]
        consumer = FakeFetchingConsumer([changelog], fetcher)
        await asyncio.wait_for(
            drain_messages(consumer, fetcher, inboxes.deliver, inboxes.hold), 5.0
        )
        assert consumer.conducted == [0, 1, 2]

    asyncio.run(scenario())


@pytest.mark.parametrize("limit", [1, 3])
def test_put_past_the_limit_is_kept_and_reported_full(limit: int) -> None:
    inbox = Inbox("node", ("samples",), limit=limit)
    for offset in range(limit + 2):
        inbox.put(message("samples", offset))
    assert len(inbox) == limit + 2  # the fetch loop waits; nothing fetched is lost
    assert inbox.full


def test_a_tick_one_agent_did_is_not_waited_for_once_the_other_drops_or_stops() -> None:
    async def scenario() -> None:
        app = fake_app()
        inboxes, node, pod = two_inboxes(app)
        for offset in (1, 2):
            inboxes.deliver(message(TICKS, offset))
        node_batches = inboxes.batches(node, 10, 0.01)
        pod_batches = inboxes.batches(pod, 10, 0.01)
        ticks = await _next(node_batches)
        inboxes.deliver(message("samples", 0))
        await _next(node_batches)  # the node agent has done both ticks
        assert app.consumer.unacked >= set(ticks)
        app.active = False  # a rebalance: the pod agent drops them, so no one waits
        pending = asyncio.ensure_future(_next(pod_batches))
        await asyncio.sleep(0.05)
        assert app.consumer.unacked.isdisjoint(ticks)
        assert app.consumer.acked == []  # not done by both: not committed
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        # An agent stopping leaves nothing of its inbox waited for either.
        app.active = True
        pod_batches = inboxes.batches(pod, 10, 10.0)
        blocked = asyncio.ensure_future(pod_batches.__anext__())
        await asyncio.sleep(0.01)  # the pod agent waits for a batch to fill
        inboxes.deliver(message(TICKS, 3))
        (tick,) = await _next(node_batches)
        assert tick in app.consumer.unacked
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert tick not in app.consumer.unacked  # in the pod inbox still: not waited for
        assert app.consumer.acked == [("samples", 0)]  # no tick: none done by both agents

    asyncio.run(scenario())
