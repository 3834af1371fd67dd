"""A seek back by the agent loop survives the records Faust fetched before it (`ReadOffsets`).

Faust's fetch loop (`Consumer._drain_messages`, 0.15.3) delivers a record when its offset is
at or past the partition's read offset, and then sets the read offset to it; `drain` below
is that rule, and the last test checks that Faust still has it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, MutableMapping
from typing import Any

from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from streams.faust.consumer import ReadOffsets

SAMPLES = TP("t.nvml.samples", 3)


def drain(
    read: MutableMapping[Any, int | None], offsets: Iterable[int], gaps: list[range] | None = None
) -> list[int]:
    """The offsets Faust delivers to the agents, in order; `gaps` gets the offsets the loop
    jumped over, which Faust counts as acknowledged (`_add_gap`)."""
    delivered = []
    for offset in offsets:
        r_offset = read[SAMPLES]
        if r_offset is None or offset >= r_offset:
            if gaps is not None and r_offset and offset - r_offset > 1:
                gaps.append(range(r_offset + 1, offset))
            delivered.append(offset)
            read[SAMPLES] = offset
    return delivered


def seek(read: ReadOffsets, offset: int) -> None:
    """The consumer's `rewind`: hold, Faust's `_seek_wait` (which writes the target into
    the mapping from the consumer's thread), done."""
    read.hold(SAMPLES, offset)
    read[SAMPLES] = offset
    read.sought(SAMPLES)


def test_records_read_again_after_a_seek_are_delivered_behind_the_old_fetch() -> None:
    read = ReadOffsets()
    assert drain(read, [40, 41]) == [40, 41]
    # The agent loop finds 10..39 missing (Faust committed past them) and seeks back to 10
    # while records 42..44 of the fetch in hand are still to be delivered.
    seek(read, 10)
    assert drain(read, [42, 43, 44]) == [42, 43, 44]  # the agent loop skips them: past 10
    assert drain(read, range(10, 46)) == list(range(10, 46))
    assert read[SAMPLES] == 45


def test_faust_own_mapping_drops_what_is_read_again() -> None:
    """What happened before: the old fetch moved the offset past the seek, so the records
    read again were dropped, the seek repeated and the gap (usage) taken as lost."""
    read: dict[Any, int | None] = {SAMPLES: None}
    drain(read, [40, 41])
    read[SAMPLES] = 10  # Faust's `seek`
    drain(read, [42, 43, 44])
    assert drain(read, range(10, 46)) == [44, 45]


def test_a_target_gone_from_the_log_ends_the_hold_at_the_log_start() -> None:
    read = ReadOffsets()
    drain(read, [40, 41])
    seek(read, 10)
    drain(read, [42])
    assert drain(read, [20, 21, 43]) == [20, 21, 43]  # 10..19 deleted: read from 20
    assert drain(read, [42]) == []  # a record read already is dropped again


def test_a_seek_with_nothing_fetched_before_it_and_revocation() -> None:
    read = ReadOffsets()
    drain(read, [5])
    seek(read, 3)
    assert drain(read, [3, 4, 5, 6]) == [3, 4, 5, 6]
    read.hold(SAMPLES, 0)
    assert read[SAMPLES] is None  # Faust's own `seek` to 0 reads from anywhere
    read.pop(SAMPLES, None)
    assert drain(read, [9, 8]) == [9]  # no hold left behind by the revoked partition


def test_records_fetched_while_the_seek_waits_are_no_gap() -> None:
    # Faust's seek writes the target (10), then waits for the broker; the fetch loop goes on
    # with the fetch in hand (42, 43). Held from before the seek, they are delivered and the
    # offset stays at 10: no jump from 10 to 42 is recorded as a gap (it was, when the hold
    # came after the seek: Faust counted 11..41 acknowledged, and the agent loop's read
    # again acknowledged them a second time).
    read = ReadOffsets()
    gaps: list[range] = []
    drain(read, [40, 41], gaps)
    read.hold(SAMPLES, 10)
    read[SAMPLES] = 10  # Faust's `_seek_wait`, from the consumer's thread
    assert drain(read, [42, 43], gaps) == [42, 43]  # while the seek waits for the broker
    read.sought(SAMPLES)
    assert drain(read, [44, *range(10, 46)], gaps) == [44, *range(10, 46)]
    assert gaps == []
    assert read[SAMPLES] == 45


def test_a_hold_without_its_seek_ends() -> None:
    read = ReadOffsets()
    drain(read, [40, 41])
    read.hold(SAMPLES, 10)
    read.release(SAMPLES)  # the seek failed: the partition was revoked
    assert drain(read, [42, 10]) == [42]


def test_faust_seek_writes_the_target_from_its_thread() -> None:
    source = inspect.getsource(AIOKafkaConsumerThread._seek_wait)
    assert "consumer.seek(tp, offset)" in source
    assert "self.consumer._read_offset[tp] = offset" in source


def test_faust_fetch_loop_binds_the_mapping_and_keeps_its_rule() -> None:
    source = inspect.getsource(Consumer._drain_messages)
    assert "set_read_offset = self._read_offset.__setitem__" in source
    assert "if r_offset is None or offset >= r_offset:" in source
    assert "set_read_offset(tp, offset)" in source
