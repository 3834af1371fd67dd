"""The Faust and aiokafka internals the worker relies on, each behind one named function.

Faust 0.15.3 and aiokafka 0.14.0 are pinned (pyproject.toml). Nowhere else does gpuwatch read
a private attribute of theirs or replace one of their classes; each function here says which
Faust behaviour it works around, and tests/unit/streams/test_faust_internals.py fails when
an upgrade changes what it relies on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import codec
from aiokafka.record._crecords import default_records as c_records
from faust.transport.consumer import CONSUMER_FETCHING
from faust.types import TP
from faust.types.tuples import ack_lock

__all__ = [
    "aiokafka_producer_of",
    "bound_signal_handlers",
    "committed_offset",
    "drain_messages",
    "getmany_leaving",
    "new_offset",
    "replace_read_offsets",
    "seek_to_beginning",
    "use_consumer_class",
    "use_fast_lz4",
]

LZ4_LEVEL = 1  # LZ4's fast mode: levels 3 and up are its high-compression mode

SignalHandler = Callable[[], None]


def aiokafka_producer_of(producer: Any) -> Any:
    """The aiokafka producer inside a started Faust producer (Faust's `NotReady` before).

    Faust sends message by message and has no public accessor for its client; `Batches`
    hands the client whole record batches (`create_batch`, `send_batch`) through
    `Producer._ensure_producer()`.
    """
    return producer._ensure_producer()


def committed_offset(consumer: Any, topic: str, partition: int) -> int | None:
    """The committed offset Faust's consumer sought to or last committed; None before either.

    Faust keeps it in `Consumer._committed_offset` (filled by `perform_seek` after each
    assignment and by each commit) and has no public accessor for it.
    """
    offset: int | None = consumer._committed_offset.get(TP(topic, partition))
    return offset


Deliver = Callable[[Any], bool]
"""Take a fetched record (True), or leave it to Faust's conductor (False); never waits."""
Backlogged = Callable[[Any], Awaitable[None] | None]
"""For a fetched record: None when it can be handed on now, else something to await first
(an agent's inbox full). A record no agent takes (a changelog's, read by Faust's table
recovery) is never held: the agents may wait for that recovery to empty their inboxes."""

YIELD_EVERY = 100  # records delivered between two returns to the event loop (Faust's)


async def drain_messages(
    consumer: Any, fetcher: Any, deliver: Deliver, backlogged: Backlogged
) -> None:
    """Faust's fetch loop (`Consumer._drain_messages`), records of the agents' own topics
    handed to `deliver` instead of Faust's conductor.

    Faust awaits `wait_first(callback(message), suspend_flow.wait())` for every record: two
    tasks and an `asyncio.wait` each (`streams.faust.inbox` says what that cost). The rest
    is Faust's loop as it is: records below the partition's read offset dropped and the
    offset set to each record delivered (`Consumer._read_offset`, our `ReadOffsets`), a gap
    in the offsets of an acknowledged topic recorded for the commit (`_add_gap`), a commit
    every `_commit_every` acknowledgements, the fetching flag of Faust's diagnostics; a
    record `deliver` leaves goes to the conductor as Faust sends it. Before each record the
    loop waits while `backlogged` says so for it (an agent's inbox full, for a record of the
    agents' topics).
    """
    callback = consumer.callback
    consumer_should_stop = consumer._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set
    get_read_offset = consumer._read_offset.__getitem__
    set_read_offset = consumer._read_offset.__setitem__
    set_flag = consumer.diag.set_flag
    unset_flag = consumer.diag.unset_flag
    commit_every = consumer._commit_every
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    since_yield = 0
    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(CONSUMER_FETCHING)
            records = consumer.getmany(timeout=1.0)
            await asyncio.sleep(0)  # Faust's: getmany may return at once, in a loop
            if consumer.should_stop:
                continue
            async for tp, message in records:
                since_yield += 1
                if since_yield > YIELD_EVERY:
                    await asyncio.sleep(0)
                    since_yield = 0
                offset = message.offset
                r_offset = get_read_offset(tp)
                if r_offset is not None and offset < r_offset:
                    continue  # Faust drops it too: read already
                if r_offset and offset - r_offset > 1 and acks_enabled_for(message.topic):
                    await consumer._add_gap(tp, r_offset + 1, offset)
                if commit_every is not None and consumer._n_acked >= commit_every:
                    consumer._n_acked = 0
                    await consumer.commit()
                wait = backlogged(message)
                while wait is not None and not consumer_should_stop():
                    await wait
                    wait = backlogged(message)
                if not deliver(message):
                    await consumer.wait_first(callback(message), consumer.suspend_flow.wait())
                set_read_offset(tp, offset)
            unset_flag(CONSUMER_FETCHING)
    except consumer.consumer_stopped_errors:
        if not consumer.transport.app.should_stop:
            raise
    except asyncio.CancelledError:
        if not consumer.transport.app.should_stop:
            raise
    finally:
        unset_flag(CONSUMER_FETCHING)


UNREAD_WAIT_S = 0.1  # every active partition left unread: look again this soon


async def getmany_leaving(
    getmany: Callable[[Any, float], Awaitable[Any]],
    active: Any,
    within: float,
    unread: frozenset[Any],
) -> Any:
    """Faust's `Consumer._getmany(active_partitions, timeout)`, the partitions of `unread`
    left out (watermark alignment, `streams.core.alignment`).

    Faust's fetch loop asks its consumer thread for the records of its active partitions
    (`ThreadDelegateConsumer._getmany`), and aiokafka hands over only those
    (`Fetcher.fetched_records`): the records of the others stay in its fetch buffer, one
    fetch per partition at most, and nothing more is fetched for them until they are read.
    Faust's own `pause_partitions` would do as much, but its table recovery resumes the
    partitions it paused, and it would resume ours with them. An empty set means every
    partition to aiokafka: when every active partition is left out, nothing is asked, and
    the loop looks again shortly, as Faust's does with no active partition.
    """
    if unread and active:
        wanted = set(active) - unread
        if not wanted:
            await asyncio.sleep(min(within, UNREAD_WAIT_S))
            return {}
        active = wanted
    return await getmany(active, within)


def new_offset(consumer: Any, tp: Any) -> int | None:
    """Faust's `Consumer._new_offset(tp)`: the offset to commit for `tp`, None for none yet,
    an offset acknowledged twice counted once.

    Faust keeps a partition's acknowledged offsets in a list (`_acked[tp]`, with a set
    `_acked_index[tp]` to refuse an offset twice) and commits up to the end of its first run
    of consecutive offsets. Its gaps (`_add_gap`: offsets the fetch loop jumped over, taken as
    never coming) go into the list but not the set, so when the agent loop reads such a gap
    again (`streams.runtime.rewinds`) its offsets are acknowledged a second time. Faust's
    runs then break at every duplicate (`consecutive_numbers` of 5 6 6 7 is 5 6 | 6 7), and
    each commit moved past one of them: every 2.8 s one offset, so a backlog's last few
    hundred records took their own quarter of an hour to commit (the group's lag stood still
    after everything was processed, and the stall alert could fire).

    The rules are Faust's otherwise: gaps up to the highest acknowledged offset count as
    acknowledged; offsets below the commit are forgotten (Faust left them to be passed over
    one run per commit); nothing is committable while the first acknowledged offset is more
    than one past the commit (Faust's own allowance of one missing offset is kept: the agent
    loop's stored positions cover it).
    """
    with ack_lock:  # what `Consumer.ack` holds while it adds to the list and the set
        acked: list[int] = consumer._acked[tp]
        if not acked:
            return None
        gaps = consumer._gap[tp]
        if gaps:
            highest = max(acked)
            spans = sorted(gaps.overlap(0, highest), key=lambda span: span.begin)
            if spans:
                filled = [offset for span in spans for offset in range(span.begin, span.end)]
                acked.extend(filled)
                gaps.chop(0, max(filled[-1], highest + 1))
        committed: int | None = consumer._committed_offset[tp]
        offsets = sorted(set(acked))
        if committed:
            offsets = [offset for offset in offsets if offset >= committed]
        index = consumer._acked_index[tp]
        if not offsets or (committed and offsets[0] - committed > 1):
            acked[:] = offsets
            index.intersection_update(offsets)
            return None
        end = 1
        while end < len(offsets) and offsets[end] == offsets[end - 1] + 1:
            end += 1
        acked[:] = offsets[end:]
        index.intersection_update(acked)
        return offsets[end - 1] + 1


def replace_read_offsets(consumer: Any, offsets: Any) -> None:
    """Make `offsets` (a mapping, empty) the consumer's offsets last read, before it starts.

    Faust keeps them in `Consumer._read_offset` (a defaultdict of None): its fetch loop
    (`_drain_messages`) binds the mapping's `__getitem__` and `__setitem__` when it starts,
    drops a record below the offset and sets it to each record it delivers; `seek` and
    `seek_wait` set it, revocation pops it.
    """
    consumer._read_offset = offsets


async def seek_to_beginning(consumer: Any, *partitions: Any) -> None:
    """Make Faust's consumer read `partitions` again from their log start.

    Faust's consumer seeks only to a given offset; the aiokafka consumer in its consumer
    thread (`Consumer._thread`) seeks to the log start as the broker has it.
    """
    await consumer._thread.seek_to_beginning(*partitions)


def use_consumer_class(app: Any, wrap: Callable[[type], type]) -> None:
    """Make the app's consumer an instance of `wrap(Faust's consumer class)`.

    Faust has no setting for the consumer class: the app's transport creates the consumer,
    when the app first needs one, from its `Consumer` attribute, so setting that attribute
    on the transport before the app starts replaces the class.
    """
    app.transport.Consumer = wrap(app.transport.Consumer)


def bound_signal_handlers(worker: Any, wrap: Callable[[SignalHandler], SignalHandler]) -> None:
    """Wrap what a Faust worker does on SIGTERM and on SIGINT (before it starts).

    mode's `Worker` has no hook for a stop signal: when it starts it installs its methods
    `_on_sigterm` and `_on_sigint`, looked up on the instance, as the loop's handlers.
    """
    worker._on_sigterm = wrap(worker._on_sigterm)
    worker._on_sigint = wrap(worker._on_sigint)


def use_fast_lz4() -> None:
    """Make aiokafka compress lz4 record batches in LZ4's fast mode (this process only).

    aiokafka 0.14 has no compression level option: its record batch builder (the C one,
    `aiokafka.record._crecords.default_records`) calls `aiokafka.codec.lz4_encode` at its
    default level 9, LZ4's high-compression mode: about 95 MB/s on the worker's outputs,
    5 % of its CPU under a backlog, against about 1 GB/s at level 1 for batches a fifth
    larger. The frames are the same format either way; consumers see no difference.
    """
    c_records.lz4_encode = functools.partial(codec.lz4_encode, level=LZ4_LEVEL)
