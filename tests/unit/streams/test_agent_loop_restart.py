"""After a restart the agent loop reads its inputs again from the positions stored with it."""

from __future__ import annotations

import asyncio
import json

from test_stream_agent_loop import IN, Seeks, Stub, loop

from streams.processors.outputs import Counters
from streams.runtime.agent_loop import CHECKPOINT, POSITIONS, AgentLoop, Message


def restarted(stored: bytes, committed: int) -> tuple[AgentLoop, Seeks, dict[int, Stub]]:
    """A loop whose table holds partition 0's positions and whose group committed `committed`."""
    seeks = Seeks()
    agent, table, made = loop([], Counters(), seek=seeks, committed=lambda t, p: committed)
    table.data[(0, POSITIONS)] = stored
    return agent, seeks, made


def test_a_stored_position_of_0_reads_the_partition_again_from_its_first_offset() -> None:
    # The state was written while the input at offset 0 was still held in memory (the pod
    # side ahead of its watermark, a backlog's first minutes), and Faust committed 5.
    agent, seeks, made = restarted(b'{"t.in": 0}', committed=5)
    asyncio.run(agent.process([Message(IN, 0, 5, None, b"f")]))
    assert seeks.offsets == [0]
    assert made[0].handled == []
    asyncio.run(agent.process([Message(IN, 0, n, None, bytes([97 + n])) for n in range(6)]))
    assert made[0].handled == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_a_stored_position_behind_the_commit_reads_again_from_it() -> None:
    agent, seeks, made = restarted(b'{"t.in": 3}', committed=5)
    asyncio.run(agent.process([Message(IN, 0, 5, None, b"f")]))
    assert seeks.offsets == [3]
    asyncio.run(agent.process([Message(IN, 0, n, None, bytes([97 + n])) for n in (3, 4, 5)]))
    assert made[0].handled == [b"d", b"e", b"f"]


IN2 = "t.in2"


def test_an_input_not_processed_when_the_state_was_written_is_read_again_from_where_it_began() -> (
    None
):
    # The first batch has only the first input; the state is written with its position.
    # The second input's first five events are processed in memory, Faust acknowledges them
    # and commits 5, and the worker dies before the next state write.
    committed: dict[str, int] = {}
    first, table, _ = loop(
        [],
        Counters(),
        state_every_s=100.0,
        committed=lambda t, p: committed.get(t),
        inputs=(IN, IN2),
    )
    asyncio.run(first.process([Message(IN, 0, n, None, b"x") for n in range(3)]))
    asyncio.run(first.process([Message(IN2, 0, n, None, b"y") for n in range(5)]))
    committed.update({IN: 3, IN2: 5})
    assert json.loads(table.data[(0, POSITIONS)]) == {IN: 3, IN2: 0}

    seeks = Seeks()
    second, _, made = loop(
        [],
        Counters(),
        seek=seeks,
        committed=lambda t, p: committed.get(t),
        inputs=(IN, IN2),
        table=table,  # the changelog the first one wrote
    )
    asyncio.run(second.process([Message(IN2, 0, 5, None, b"f")]))
    assert seeks.sought == [(IN2, 0, 0)]
    assert made[0].handled == []
    asyncio.run(second.process([Message(IN2, 0, n, None, bytes([97 + n])) for n in range(6)]))
    assert made[0].handled == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_where_an_input_began_is_kept_while_the_commit_moves_on() -> None:
    # Nothing of the input is processed yet (its events skipped as past a gap are still
    # acknowledged): the commit that moves on is not where the state's inputs begin.
    committed = {IN: 2}
    agent, _, _ = loop([], Counters(), committed=lambda t, p: committed.get(t))
    assert agent.rewinds.expected(IN, 0) == 2
    committed[IN] = 9
    assert agent.rewinds.expected(IN, 0) == 2
    agent.forget([0])
    assert agent.rewinds.expected(IN, 0) == 9


def test_a_checkpoint_goes_in_the_positions_record_and_wins_over_a_newer_key_on_load() -> None:
    first, table, made = loop([], Counters())
    asyncio.run(first.process([Message(IN, 0, 0, None, b"a")]))  # made[0] exists now
    made[0].checkpoint = lambda: (b"", b"meta-1")  # type: ignore[attr-defined]
    asyncio.run(first.process([Message(IN, 0, 1, None, b"b")]))
    assert json.loads(table.data[(0, POSITIONS)]) == {IN: 2, CHECKPOINT: ["", "meta-1"]}
    # A crash while a later write was sent stored a newer value under the same key only.
    table.data[(0, b"")] = b"meta-2"
    second, _, remade = loop([], Counters(), table=table)
    asyncio.run(second.process([Message(IN, 0, 2, None, b"c")]))
    assert (b"", b"meta-1") in remade[0].stored
    assert (b"", b"meta-2") not in remade[0].stored
    assert (POSITIONS, table.data[(0, POSITIONS)]) not in remade[0].stored
