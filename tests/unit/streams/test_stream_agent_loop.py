"""The agent loop's order of effects, its dead letters and its ticks, with no Kafka."""

from __future__ import annotations

import asyncio

from streams.agent_loop import AgentLoop, Message
from streams.deadletters import Counters, Outputs, Record, Source
from streams.ticks import Tick, encode_tick
from streams.windows import Watermark

IN, TICKS = "t.in", "t.ticks"


class Stub:
    """A processor that echoes its input and stores it."""

    def __init__(self, partition: int, stored: list[tuple[bytes, bytes]]) -> None:
        self.partition = partition
        self.stored = stored
        self.stream_time: int | None = None
        self.ticks: list[int | None] = []
        self._writes: list[tuple[bytes, bytes | None]] = []

    def handle(self, source: Source, raw: bytes | None, out: Outputs) -> int | None:
        if raw == b"boom":
            raise RuntimeError("boom")
        out.records.append(Record("t.out", b"k", raw or b""))
        self._writes.append((str(source.offset).encode(), raw))
        return 1000 + source.offset

    def on_tick(self, tick: Tick, out: Outputs) -> None:
        self.ticks.append(tick.wm)

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


def loop(log: list[str], counters: Counters) -> tuple[AgentLoop, Table, dict[int, Stub]]:
    table, made = Table(log), {}

    def make(partition: int, stored: list[tuple[bytes, bytes]]) -> Stub:
        made[partition] = Stub(partition, stored)
        return made[partition]

    async def flush() -> None:
        log.append("flush")

    agent = AgentLoop(
        name="test",
        inputs=(IN,),
        tick_topic=TICKS,
        table=table,
        make=make,
        outputs=Outputs("t.", counters),
        watermark=Watermark(),
        committed=lambda topic, partition: None,
        send=lambda record: log.append(f"send {record.topic}"),
        flush=flush,
    )
    return agent, table, made


def test_outputs_are_acknowledged_before_the_state_that_made_them_is_written() -> None:
    log: list[str] = []
    agent, _, made = loop(log, Counters())
    asyncio.run(agent.process([Message(IN, 0, 0, None, b"a"), Message(IN, 1, 0, None, b"b")]))
    assert log == ["send t.out", "send t.out", "flush", "write 0/0", "write 1/0"]
    assert sorted(made) == [0, 1]
    assert agent.watermark.stream_time == 1000


def test_an_error_of_ours_becomes_a_dead_letter_and_the_batch_goes_on() -> None:
    log: list[str] = []
    counters = Counters()
    agent, table, _ = loop(log, counters)
    batch = [Message(IN, 0, 0, b"k", b"boom"), Message(IN, 0, 1, None, b"ok")]
    asyncio.run(agent.process(batch))
    assert log == ["send t.deadletter", "send t.out", "flush", "write 0/1"]
    assert (counters.events, counters.deadletter) == (2, 1)
    assert table.data == {(0, b"1"): b"ok"}


def test_a_tick_runs_once_the_data_sent_before_it_is_processed() -> None:
    log: list[str] = []
    agent, _, made = loop(log, Counters())
    tick = Tick(sender="w", wm=5000, claims={1: 7000}, ends={IN: 2}, starts={IN: 0})
    asyncio.run(agent.process([Message(TICKS, 0, 0, None, encode_tick(tick))]))
    assert made[0].ticks == []
    assert agent.watermark.stream_time == 7000  # other workers' progress counts as seen
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
    assert made[0].stored == [(b"0", b"a")]
