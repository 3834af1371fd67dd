"""The agent loop's order of effects, its dead letters and its ticks, with no Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from streams.core.ticks import Tick, encode_tick
from streams.faust.batches import DeliveryFailedError
from streams.processors.outputs import Counters, Outputs, Record, Source
from streams.runtime.agent_loop import POSITIONS, AgentLoop, Message
from streams.runtime.rewinds import MAX_REWINDS, REWIND_AGAIN_S, STALL_S

IN, TICKS = "t.in", "t.ticks"


class Stub:
    """A processor that echoes its input and stores it."""

    def __init__(self, partition: int, stored: list[tuple[bytes, bytes]]) -> None:
        self.partition = partition
        self.stored = stored
        self.stream_time: int | None = None
        self.ticks: list[int | None] = []
        self.handled: list[bytes | None] = []
        self._writes: list[tuple[bytes, bytes | None]] = []

    def handle(self, source: Source, raw: bytes | None, out: Outputs) -> int | None:
        if raw == b"boom":
            raise RuntimeError("boom")
        self.handled.append(raw)
        out.records.append(Record("t.out", b"k", raw or b""))
        self._writes.append((str(source.offset).encode(), raw))
        return 1000 + source.offset

    def on_tick(self, tick: Tick, out: Outputs) -> None:
        self.ticks.append(tick.claims.get(0))

    def take_writes(self) -> list[tuple[bytes, bytes | None]]:
        writes, self._writes = self._writes, []
        return writes


class Table:
    def __init__(self, log: list[str]) -> None:
        self.data: dict[tuple[int, bytes], bytes] = {}
        self.log = log

    def load(self, partition: int) -> list[tuple[bytes, bytes]]:
        return [(k, v) for (p, k), v in self.data.items() if p == partition]

    def write(self, partition: int, key: bytes, value: bytes | None) -> None:
        self.log.append(f"write {partition}/{key.decode()}")
        if value is not None:
            self.data[(partition, key)] = value


class Seeks:
    """A loop's `seek`: records what it was asked to read again."""

    def __init__(self) -> None:
        self.sought: list[tuple[str, int, int]] = []

    async def __call__(self, topic: str, partition: int, offset: int) -> None:
        self.sought.append((topic, partition, offset))

    @property
    def offsets(self) -> list[int]:
        """The offsets sought, in order."""
        return [offset for _, _, offset in self.sought]


def loop(
    log: list[str],
    counters: Counters,
    *,
    seek: Any = None,
    now: Callable[[], float] = lambda: 0.0,
    state_every_s: float = 0.0,
    start_of: Callable[[str, int], int | None] = lambda topic, partition: 0,
    load_starts: Any = None,
    committed: Callable[[str, int], int | None] = lambda topic, partition: None,
    inputs: tuple[str, ...] = (IN,),
    table: Table | None = None,
    refused: frozenset[int] = frozenset(),
    state_every_event_ms: int | None = None,
    paused: Callable[[str, int], bool] = lambda topic, partition: False,
) -> tuple[AgentLoop, Table, dict[int, Stub]]:
    """The loop on a `Stub` per partition; the flushes numbered in `refused` (from 1) raise
    as the producer's does when the broker did not take a record."""
    table, made = table or Table(log), {}

    def make(partition: int, stored: list[tuple[bytes, bytes]]) -> Stub:
        made[partition] = Stub(partition, stored)
        return made[partition]

    async def flush() -> None:
        log.append("flush")
        if log.count("flush") in refused:
            raise DeliveryFailedError("t.out", 0, "MessageSizeTooLargeError", "refused")

    agent = AgentLoop(
        name="test",
        inputs=inputs,
        tick_topic=TICKS,
        table=table,
        make=make,
        outputs=Outputs("t.", counters),
        committed=committed,
        send=lambda record: log.append(f"send {record.topic}"),
        flush=flush,
        seek=seek,
        start_of=start_of,
        load_starts=load_starts,
        monotonic=now,
        state_every_s=state_every_s,
        state_every_event_ms=state_every_event_ms,
        paused=paused,
    )
    return agent, table, made


def test_outputs_are_acknowledged_before_the_state_that_made_them_is_written() -> None:
    log: list[str] = []
    agent, _, made = loop(log, Counters())
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a"), Message(IN, 1, 0, None, b"b")]))
    assert log == [
        "send t.out",
        "send t.out",
        "flush",
        "write 0/0",
        "write 1/0",
        "write 0/@positions",
        "write 1/@positions",
        "flush",  # the state is taken by the broker before the batch is acknowledged
    ]
    assert sorted(made) == [0, 1]


def test_outputs_the_broker_did_not_take_end_the_loop_before_any_state_is_written() -> None:
    log: list[str] = []
    agent, table, _ = loop(log, Counters(), refused=frozenset({1}))
    asked: list[int] = []

    async def batches() -> AsyncIterator[Sequence[Message]]:
        for offset in range(3):
            asked.append(offset)  # the inbox acknowledges a batch when the next is asked for
            yield [Message(IN, 0, offset, None, b"a")]

    with pytest.raises(DeliveryFailedError, match="MessageSizeTooLargeError"):
        asyncio.run(agent.run(batches()))
    assert log == ["send t.out", "flush"]
    assert table.data == {}
    assert asked == [0]


def test_a_state_write_the_broker_did_not_take_ends_the_batch_unacknowledged() -> None:
    log: list[str] = []
    agent, _, _ = loop(log, Counters(), refused=frozenset({2}))
    with pytest.raises(DeliveryFailedError):
        asyncio.run(agent.process([Message(IN, 0, 0, None, b"a")]))
    assert log == ["send t.out", "flush", "write 0/0", "write 0/@positions", "flush"]


def test_state_is_written_at_most_every_state_interval_with_the_positions_it_holds() -> None:
    log: list[str] = []
    clock = {"t": 100.0}
    agent, table, _ = loop(log, Counters(), now=lambda: clock["t"], state_every_s=5.0)
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a")]))
    assert log[-3:] == ["write 0/0", "write 0/@positions", "flush"]
    log.clear()
    clock["t"] += 4.9
    asyncio.run(agent.process([Message(IN, 0, 1, None, b"b"), Message(IN, 1, 0, None, b"c")]))
    assert log == ["send t.out", "send t.out", "flush"]  # outputs go, state waits
    assert table.data[(0, b"@positions")] == b'{"t.in": 1}'
    clock["t"] += 0.1
    asyncio.run(agent.process([Message(IN, 1, 1, None, b"d")]))
    assert log[3:] == [
        "send t.out",
        "flush",
        "write 0/1",
        "write 1/0",
        "write 1/1",
        "write 0/@positions",
        "write 1/@positions",
        "flush",
    ]
    assert table.data[(0, b"@positions")] == b'{"t.in": 2}'
    assert table.data[(1, b"@positions")] == b'{"t.in": 2}'


def test_state_is_also_written_once_a_partitions_stream_time_moved_an_hour() -> None:
    """A backlog goes through hours of event time between two state writes by the wall
    clock; a restart would then send hours of usage again. A partition whose stream time
    moved an hour has its state written whatever the clock says."""
    log: list[str] = []
    hour = 3_600_000
    agent, table, made = loop(
        log, Counters(), now=lambda: 100.0, state_every_s=5.0, state_every_event_ms=hour
    )
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a")]))  # the first write is due
    made[0].stream_time = 0
    asyncio.run(agent.process([Message(IN, 0, 1, None, b"b")]))
    log.clear()
    made[0].stream_time = hour - 1
    asyncio.run(agent.process([Message(IN, 0, 2, None, b"c")]))
    assert log == ["send t.out", "flush"]  # not an hour yet, and the clock stands still
    made[0].stream_time = hour
    asyncio.run(agent.process([Message(IN, 0, 3, None, b"d")]))
    assert "write 0/@positions" in log
    assert table.data[(0, b"@positions")] == b'{"t.in": 4}'


def test_an_error_of_ours_becomes_a_dead_letter_and_the_batch_goes_on() -> None:
    log: list[str] = []
    counters = Counters()
    agent, table, _ = loop(log, counters)
    batch = [Message(IN, 0, 0, b"k", b"boom"), Message(IN, 0, 1, None, b"ok")]
    asyncio.run(agent.process(batch))
    assert log == [
        "send t.deadletter",
        "send t.out",
        "flush",
        "write 0/1",
        "write 0/@positions",
        "flush",
    ]
    assert (counters.events, counters.deadletter) == (2, 1)
    assert table.data == {(0, b"1"): b"ok", (0, b"@positions"): b'{"t.in": 2}'}


def test_a_tick_runs_once_the_data_sent_before_it_is_processed() -> None:
    log: list[str] = []
    agent, _, made = loop(log, Counters())
    tick = Tick(sender="w", claims={0: 5000, 1: 7000}, ends={IN: 2}, starts={IN: 0})
    asyncio.run(agent.process([Message(TICKS, 0, 0, None, encode_tick(tick))]))
    assert made[0].ticks == []
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a")]))
    assert made[0].ticks == []
    asyncio.run(agent.process([Message(IN, 0, 1, None, b"b")]))
    assert made[0].ticks == [5000]


def test_a_bad_tick_is_a_dead_letter_and_a_revoked_partition_reloads_from_the_table() -> None:
    log: list[str] = []
    counters = Counters()
    agent, _, made = loop(log, counters)
    asyncio.run(agent.process([Message(TICKS, 0, 0, None, b"{}"), Message(IN, 0, 0, None, b"a")]))
    assert counters.deadletter == 1
    agent.forget([0])
    asyncio.run(agent.process([Message(IN, 0, 1, None, b"b")]))
    assert made[0].stored == [(b"0", b"a")]  # the stored positions are the loop's own


def test_events_after_a_gap_wait_while_the_partition_is_read_again() -> None:
    log: list[str] = []
    seeks = Seeks()
    agent, _, made = loop(log, Counters(), seek=seeks)
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a")]))
    # Offset 1 was dropped by Faust: 2 waits, the partition is read again from 1.
    asyncio.run(agent.process([Message(IN, 0, 2, None, b"c")]))
    assert seeks.sought == [(IN, 0, 1)]
    asyncio.run(agent.process([Message(IN, 0, 2, None, b"c")]))  # fetched before the seek
    assert seeks.sought == [(IN, 0, 1)]  # not again so soon
    asyncio.run(agent.process([Message(IN, 0, 1, None, b"b"), Message(IN, 0, 2, None, b"c")]))
    assert made[0].handled == [b"a", b"b", b"c"]


def test_a_gap_is_read_again_less_often_until_the_log_no_longer_holds_it() -> None:
    seeks = Seeks()
    clock, start = [0.0], [0]
    agent, _, made = loop(
        [], Counters(), seek=seeks, now=lambda: clock[0], start_of=lambda t, p: start[0]
    )
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a")]))
    for _ in range(8):  # a backlog's records fetched before the seeks still coming
        asyncio.run(agent.process([Message(IN, 0, 5, None, b"f")]))
        clock[0] += REWIND_AGAIN_S
    assert seeks.offsets == [1] * 4  # at 0, 1, 3 and 7 s: each wait twice the last
    assert made[0].handled == [b"a"]  # 1..4 are in the log: never taken as lost
    start[0] = 5  # deleted (retention): the gap is real
    asyncio.run(agent.process([Message(IN, 0, 5, None, b"f")]))
    assert made[0].handled == [b"a", b"f"]
    assert MAX_REWINDS <= 4


def test_a_tick_waiting_on_a_quiet_input_reads_it_again_from_the_stored_position() -> None:
    seeks = Seeks()
    clock = [0.0]
    agent, table, made = loop([], Counters(), seek=seeks, now=lambda: clock[0])
    table.data[(0, POSITIONS)] = b'{"t.in": 4}'  # a restart: the state ends at offset 3
    tick = Tick(
        sender="w", claims={0: 1}, ends={IN: 9}
    )  # Faust committed 9 without delivering 4..8
    asyncio.run(agent.process([Message(TICKS, 0, 0, None, encode_tick(tick))]))
    clock[0] += STALL_S
    asyncio.run(agent.process([Message(TICKS, 0, 1, None, encode_tick(tick))]))
    assert seeks.offsets == [4]
    assert made[0].ticks == []


def test_a_partition_left_unread_by_alignment_is_not_taken_for_a_quiet_one() -> None:
    # Alignment leaves partition 0 out of the fetches: its tick waits on offsets 4..8, and
    # nothing of it arrives because it is not read. It was sought back to 4 at every pause
    # (its fetched records dropped and fetched again), every 1, 2 and 4 s while paused.
    seeks = Seeks()
    clock = [0.0]
    unread = {(IN, 0)}
    agent, table, _ = loop(
        [], Counters(), seek=seeks, now=lambda: clock[0], paused=lambda t, p: (t, p) in unread
    )
    table.data[(0, POSITIONS)] = b'{"t.in": 4}'
    tick = Tick(sender="w", claims={0: 1}, ends={IN: 9})
    for offset in range(4):
        asyncio.run(agent.process([Message(TICKS, 0, offset, None, encode_tick(tick))]))
        clock[0] += STALL_S
        asyncio.run(agent.process([]))
    assert seeks.offsets == []
    unread.clear()  # read again: quiet from now on is quiet
    clock[0] += STALL_S / 2
    asyncio.run(agent.process([Message(TICKS, 0, 4, None, encode_tick(tick))]))
    assert seeks.offsets == []
    clock[0] += STALL_S / 2
    asyncio.run(agent.process([Message(TICKS, 0, 5, None, encode_tick(tick))]))
    assert seeks.offsets == [4]


def test_a_gap_is_not_sought_again_while_its_partition_is_unread() -> None:
    seeks = Seeks()
    clock = [0.0]
    unread: set[tuple[str, int]] = set()
    agent, table, _ = loop(
        [], Counters(), seek=seeks, now=lambda: clock[0], paused=lambda t, p: (t, p) in unread
    )
    table.data[(0, POSITIONS)] = b'{"t.in": 4}'
    asyncio.run(agent.process([Message(IN, 0, 6, None, b"g")]))  # 4 and 5 missing
    assert seeks.offsets == [4]
    unread.add((IN, 0))
    for _ in range(5):
        clock[0] += REWIND_AGAIN_S * 4
        asyncio.run(agent.process([]))
    assert seeks.offsets == [4]  # the seek could not be read while the partition is unread
    unread.clear()
    asyncio.run(agent.process([]))
    assert seeks.offsets == [4]  # its wait starts anew when it is read again
    clock[0] += REWIND_AGAIN_S
    asyncio.run(agent.process([]))
    assert seeks.offsets == [4, 4]


def test_a_first_event_past_the_log_start_waits_until_the_start_is_learnt() -> None:
    # A partition just assigned, never committed, with no stored state: Faust dropped its
    # offset 0 while assigning it, and the offset probe has not run yet.
    seeks = Seeks()
    starts: dict[tuple[str, int], int] = {}
    asked: list[list[tuple[str, int]]] = []

    async def load_starts(tps: list[tuple[str, int]]) -> None:
        asked.append(tps)
        starts.update(dict.fromkeys(tps, 0))

    agent, _, made = loop(
        [],
        Counters(),
        seek=seeks,
        start_of=lambda t, p: starts.get((t, p)),
        load_starts=load_starts,
    )
    asyncio.run(agent.process([Message(IN, 0, 1, None, b"b")]))
    assert asked == [[(IN, 0)]]
    assert seeks.offsets == [0]  # read again from the log start
    assert made[0].handled == []
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a"), Message(IN, 0, 1, None, b"b")]))
    assert made[0].handled == [b"a", b"b"]
    assert asked == [[(IN, 0)]]  # learnt once


def test_events_of_a_partition_nothing_places_wait_while_the_broker_does_not_answer() -> None:
    seeks = Seeks()
    clock = [0.0]
    answers = [False, True]
    starts: dict[tuple[str, int], int] = {}

    async def load_starts(tps: list[tuple[str, int]]) -> None:
        if not answers.pop(0):
            raise TimeoutError("no answer")
        starts.update(dict.fromkeys(tps, 3))

    agent, _, made = loop(
        [],
        Counters(),
        seek=seeks,
        now=lambda: clock[0],
        start_of=lambda t, p: starts.get((t, p)),
        load_starts=load_starts,
    )
    asyncio.run(agent.process([Message(IN, 0, 4, None, b"e"), Message(IN, 0, 5, None, b"f")]))
    assert made[0].handled == []
    assert seeks.offsets == [4]
    clock[0] += REWIND_AGAIN_S
    asyncio.run(agent.process([Message(IN, 0, 4, None, b"e"), Message(IN, 0, 5, None, b"f")]))
    assert seeks.offsets == [4, 3]  # the start is known now: 3 was dropped too
    asyncio.run(agent.process([Message(IN, 0, n, None, bytes([97 + n])) for n in (3, 4, 5)]))
    assert made[0].handled == [b"d", b"e", b"f"]
