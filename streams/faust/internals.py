"""The Faust and aiokafka internals the worker relies on, each behind one named function.

Faust 0.15.3 and aiokafka 0.14.0 are pinned (pyproject.toml). Nowhere else does gpuwatch read
a private attribute of theirs or replace one of their classes; each function here says which
Faust behaviour it works around, and tests/unit/streams/test_faust_internals.py fails when
an upgrade changes what it relies on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from aiokafka import codec
from aiokafka.record._crecords import default_records as c_records
from faust.types import TP

__all__ = [
    "aiokafka_producer_of",
    "bound_signal_handlers",
    "committed_offset",
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
