"""Outbox: a FIFO bounded by bytes that drops (and counts) the oldest entries first."""

from __future__ import annotations

import pytest
from support.publishing import entry, names

from producers.base.outbox import Entry, Outbox


def test_entry_size_counts_key_and_value() -> None:
    assert Entry(b"node-1", b"0123456789").size == 16
    assert entry(3, size=25).size == 25


def test_a_non_positive_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        Outbox(0)


def test_entries_come_out_in_the_order_they_went_in_and_leave_on_ack() -> None:
    box = Outbox(1000)
    for n in range(5):
        assert box.put(entry(n)) == 0

    assert len(box) == 5
    assert box.size_bytes == 50
    taken = box.take(1000)
    assert names(taken) == [0, 1, 2, 3, 4]
    # Taken is in flight, still held: only an acknowledgement lets an entry go.
    assert (len(box), box.waiting, box.in_flight) == (5, 0, 5)
    assert (box.size_bytes, box.in_flight_bytes) == (50, 50)
    assert box.take(1000) == []
    for e in taken:
        assert box.ack(e) is True
    assert len(box) == 0
    assert box.size_bytes == 0
    assert box.ack(taken[0]) is False  # twice: nothing more leaves


def test_when_full_the_oldest_are_dropped_and_counted() -> None:
    box = Outbox(35)  # room for three 10-byte entries
    assert [box.put(entry(n)) for n in range(3)] == [0, 0, 0]

    assert box.put(entry(3)) == 1
    assert (box.dropped, box.dropped_bytes) == (1, 10)
    # A 20-byte entry needs two of the oldest to go.
    assert box.put(entry(4, size=20)) == 2
    assert (box.dropped, box.dropped_bytes) == (3, 30)
    assert box.size_bytes == 30
    assert box.size_bytes <= box.max_bytes
    assert names(box.take(100)) == [3, 4]


def test_an_entry_larger_than_the_bound_is_dropped_itself() -> None:
    box = Outbox(30)
    box.put(entry(0))
    box.put(entry(1))

    assert box.put(entry(2, size=31)) == 1

    assert (box.dropped, box.dropped_bytes) == (1, 31)
    # What was waiting is untouched: the oversized one did not evict it.
    assert names(box.take(100)) == [0, 1]


def test_an_entry_exactly_the_bound_fits_after_evicting_all() -> None:
    box = Outbox(30)
    box.put(entry(0))
    box.put(entry(1))

    assert box.put(entry(2, size=30)) == 2

    assert box.dropped == 2
    assert names(box.take(100)) == [2]


def test_take_stops_at_max_bytes_but_returns_at_least_one() -> None:
    box = Outbox(1000)
    for n in range(4):
        box.put(entry(n))

    assert names(box.take(25)) == [0, 1]  # a third would make 30 > 25
    assert names(box.take(5)) == [2]  # smaller than one entry: still one
    assert names(box.take(0)) == [3]
    assert (box.waiting, box.in_flight_bytes) == (0, 40)


def test_take_stops_before_an_entry_that_does_not_fit_even_if_later_ones_would() -> None:
    box = Outbox(1000)
    box.put(entry(0, size=10))
    box.put(entry(1, size=50))
    box.put(entry(2, size=10))

    assert names(box.take(30)) == [0]  # FIFO: entry 2 must not jump over entry 1
    assert names(box.take(100)) == [1, 2]


def test_give_back_puts_entries_back_at_the_head_in_the_order_handed_over() -> None:
    box = Outbox(1000)
    for n in range(5):
        box.put(entry(n))
    taken = box.take(30)
    assert names(taken) == [0, 1, 2]
    box.put(entry(5))
    box.ack(taken[0])

    box.give_back([taken[2], taken[1]])  # in any order: they go back as handed over

    assert (box.size_bytes, box.in_flight) == (50, 0)
    assert names(box.take(1000)) == [1, 2, 3, 4, 5]


def test_what_is_in_flight_is_never_dropped_the_oldest_waiting_are() -> None:
    box = Outbox(40)
    for n in range(4):
        box.put(entry(n))
    assert names(box.take(20)) == [0, 1]  # in the client's hands

    assert box.put(entry(4)) == 1  # 2, the oldest waiting, goes; 0 and 1 stay
    assert box.put(entry(5, size=30)) == 2  # 3 and 4: in flight still is not dropped

    assert (box.dropped, box.dropped_bytes) == (3, 30)
    assert (box.size_bytes, box.waiting, box.in_flight) == (50, 1, 2)
    # Nothing waits to drop: the newest still waits, over the bound by what is in flight.
    assert box.put(entry(6, size=30)) == 1
    assert names(box.take(100)) == [6]


def test_give_back_may_overfill_and_the_next_put_drops_the_oldest() -> None:
    box = Outbox(30)
    for n in range(3):
        box.put(entry(n))
    taken = box.take(20)
    assert names(taken) == [0, 1]
    box.put(entry(3))  # 2, the oldest waiting, goes: 0 and 1 are in flight
    assert box.dropped == 1

    box.give_back(taken)
    assert (box.size_bytes, box.waiting) == (30, 3)

    assert box.put(entry(4)) == 1  # 0, the oldest, goes to make room
    assert (box.dropped, box.dropped_bytes) == (2, 20)
    assert names(box.take(100)) == [1, 3, 4]


def test_wait_reports_whether_an_entry_is_waiting() -> None:
    box = Outbox(100)
    assert box.wait(timeout=0.0) is False
    box.put(entry(0))
    assert box.wait(timeout=0.0) is True
