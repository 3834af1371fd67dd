"""After a restart the agent loop reads its inputs again from the positions stored with it."""

from __future__ import annotations

import asyncio

from test_stream_agent_loop import IN, Seeks, Stub, loop

from streams.processors.outputs import Counters
from streams.runtime.agent_loop import POSITIONS, AgentLoop, Message


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
