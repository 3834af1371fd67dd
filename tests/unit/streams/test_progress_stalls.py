"""`Stalls`: how long records have waited in a partition while its consumer did not move."""

from __future__ import annotations

from streams.core.progress import Stalls

P = ("t.nvml.samples", 0)
Q = ("t.ticks", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def held(limit_s: float = 20.0) -> tuple[Stalls, Clock]:
    clock = Clock()
    stalls = Stalls(limit_s, clock)
    stalls.hold([P, Q])
    return stalls, clock


def test_the_stall_grows_with_the_clock_while_records_wait_and_nothing_moves() -> None:
    stalls, clock = held()
    stalls.positions({P: 10, Q: 5})
    stalls.ends({P: 10, Q: 5})
    clock.now += 60  # caught up a minute: no stall, however long the quiet
    assert stalls.stalled() == {P: 0.0, Q: 0.0}
    stalls.ends({P: 12, Q: 5})  # records arrive at 160 s
    clock.now += 15
    assert stalls.stalled() == {P: 15.0, Q: 0.0}
    assert stalls.stuck() == []
    clock.now += 10  # no observation comes any more (the consumer is stuck): it still grows
    assert stalls.stalled()[P] == 25.0
    assert stalls.stuck() == [(P, 25.0)]


def test_progress_restarts_the_stall_and_a_caught_up_partition_has_none() -> None:
    stalls, clock = held()
    stalls.positions({P: 10})
    stalls.ends({P: 30})
    clock.now += 8
    stalls.positions({P: 20})  # moved, records still wait
    clock.now += 5
    assert stalls.stalled()[P] == 5.0
    stalls.positions({P: 30})
    assert stalls.stalled()[P] == 0.0


def test_reading_again_after_a_seek_back_is_not_progress() -> None:
    stalls, clock = held()
    stalls.positions({P: 50})
    stalls.ends({P: 60})
    clock.now += 10
    stalls.positions({P: 40})  # a seek back, then forward again to where it was
    stalls.positions({P: 50})
    assert stalls.stalled()[P] == 10.0


def test_a_partition_without_a_position_is_not_stalled_and_revoked_ones_go() -> None:
    stalls, clock = held()
    stalls.ends({P: 10})
    clock.now += 30
    assert stalls.stalled()[P] == 0.0
    assert not stalls.positioned(P)
    stalls.positions({P: 0})
    assert stalls.positioned(P)
    clock.now += 30
    assert stalls.stalled()[P] == 30.0
    stalls.hold([Q])  # P revoked, R assigned
    assert stalls.stalled() == {Q: 0.0}
    stalls.hold([P, Q])  # P back: it starts afresh
    assert not stalls.positioned(P)
    stalls.positions({("other", 0): 3})  # not held: ignored
    assert set(stalls.stalled()) == {P, Q}
