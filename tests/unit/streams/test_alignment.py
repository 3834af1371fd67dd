"""Watermark alignment: which node partitions are left unread while they run ahead."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.alignment import Alignment
from streams.faust.internals import getmany_leaving

AHEAD = 600_000  # ms


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _alignment(partitions: int = 3, clock: Clock | None = None) -> Alignment:
    return Alignment(partitions, AHEAD, stuck_s=30.0, monotonic=clock or Clock())


def test_nothing_is_paused_until_every_partition_has_claimed() -> None:
    a = _alignment()
    assert a.decide({0: (10_000_000, False), 1: (0, False)}) == frozenset()
    a.heard({2: 0})
    assert a.decide({0: (10_000_000, False), 1: (0, False)}) == {0}
    assert a.pauses == 1


def test_a_partition_ahead_pauses_and_resumes_at_half_the_bound() -> None:
    a = _alignment()
    a.heard({2: 1_000_000})
    local: dict[int, tuple[int, bool] | None] = {0: (1_000_000, False), 1: (1_000_000, False)}
    local[0] = (1_000_000 + AHEAD, False)
    assert a.decide(local) == frozenset()  # at the bound, not past it
    local[0] = (1_000_000 + AHEAD + 1, False)
    assert a.decide(local) == {0}
    # the others move: partition 0 stays paused until within half the bound
    a.heard({2: 1_000_000 + AHEAD // 2})
    local[1] = (1_000_000 + AHEAD // 2, False)
    assert a.decide(local) == {0}
    a.heard({2: 1_000_000 + AHEAD // 2 + 1})
    local[1] = (1_000_000 + AHEAD // 2 + 1, False)
    assert a.decide(local) == frozenset()
    assert a.pauses == 1


def test_idle_partitions_do_not_hold_the_others_back() -> None:
    a = _alignment()
    a.heard({2: 0}, idle=[2])  # a partition with no nodes: idle, claims the lowest of the others
    assert a.decide({0: (5_000_000, False), 1: (4_000_000, False)}) == {0}
    assert a.lowest == 4_000_000


def test_a_claim_never_goes_backwards() -> None:
    a = _alignment()
    a.heard({2: 5_000_000})
    a.heard({2: 1_000_000})  # an older tick read after a newer one
    assert a.decide({0: (5_000_000, False), 1: (5_000_000, False)}) == frozenset()


def test_a_lowest_that_stands_still_releases_the_pauses_until_it_moves() -> None:
    clock = Clock()
    a = _alignment(clock=clock)
    a.heard({2: 0})
    local = {0: (10_000_000, False), 1: (0, False)}
    clock.now = 1000.0  # long after the lowest last moved: the stuck time counts from the pause
    assert a.decide(local) == {0}
    clock.now += 29.0
    assert a.decide(local) == {0}
    clock.now += 1.0
    assert a.decide(local) == frozenset()
    assert a.released == 1
    clock.now += 100.0
    assert a.decide(local) == frozenset()  # still stuck
    assert a.released == 1
    a.heard({2: 1})
    local[1] = (1, False)
    assert a.decide(local) == {0}  # it moved: aligned again


def test_off_pauses_nothing() -> None:
    a = Alignment(2, 0, 30.0)
    assert a.decide({0: (10**12, False), 1: (0, False)}) == frozenset()


@settings(max_examples=300, deadline=None)
@given(
    claims=st.lists(st.tuples(st.integers(0, 10**9), st.booleans()), min_size=2, max_size=8).filter(
        lambda cs: not all(idle for _, idle in cs)
    )
)
def test_the_slowest_partition_is_never_paused_and_none_paused_is_within_the_bound(
    claims: list[tuple[int, bool]],
) -> None:
    a = _alignment(partitions=len(claims))
    local = dict(enumerate(claims))
    paused = a.decide(local)
    lowest = min(st_ for st_, idle in claims if not idle)
    for partition, (stream_time, idle) in local.items():
        if partition in paused:
            assert not idle
            assert stream_time > lowest + AHEAD
        else:
            assert idle or stream_time <= lowest + AHEAD


def test_the_fetch_leaves_the_unread_partitions_out() -> None:
    asked: list[Any] = []

    async def getmany(active: Any, within: float) -> Any:
        asked.append(active)
        return {"records": active}

    async def run() -> None:
        assert await getmany_leaving(getmany, {"a", "b"}, 1.0, frozenset({"a"})) == {
            "records": {"b"}
        }
        # every active one unread: nothing asked (an empty set would mean every partition)
        assert await getmany_leaving(getmany, {"a"}, 1.0, frozenset({"a"})) == {}
        assert await getmany_leaving(getmany, {"a"}, 1.0, frozenset()) == {"records": {"a"}}

    asyncio.run(run())
    assert asked == [{"b"}, {"a"}]
