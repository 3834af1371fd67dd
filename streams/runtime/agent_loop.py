"""The loop of one Faust agent: batches of events to per-partition processors, outputs, state.

One agent reads a channel of co-partitioned topics (its data topics and the tick topic),
so the events of a partition reach it in order. Per batch:

1. each event goes to its partition's processor (created from the table on first use);
   ticks wait in `Progress` until the data before them is processed, then run;
2. the records the batch made are sent, and `flush` waits until the broker has taken
   every one: outputs are acknowledged before the state that says they were made is
   written;
3. every `state_every_s` (not every batch: a node's document is twice its sample's bytes,
   and writing it once a second per node was a tenth of the worker's CPU), and whenever a
   partition's stream time moved `state_every_event_ms` since its last write (a backlog
   goes through hours of event time in seconds), the state
   changed since the last write is written to the table's changelog, with the partition
   explicitly: Faust's `table[key] = value` takes the partition from the current event,
   which a batch of several partitions does not have; `flush` then waits until the broker
   has taken it too;
4. the batch's records are acknowledged to Faust when the loop asks for the next batch
   (`streams.faust.inbox`), and Faust commits the acknowledged offsets later (its default
   at-least-once).

`flush` raises when the broker did not take a record (`streams.faust.batches.DeliveryFailedError`:
refused, or expired after the producer's retries); the batch then goes no further: no
state is written after the records lost, its inputs are not acknowledged, so not
committed, and the loop ends with the error, which stops the worker. A restart reads the
inputs again from the positions stored before.

A crash loses at most the work after the last state write: the inputs come again from
the positions stored with it, replays that the state already holds are skipped, and the
rest gives records equal to the ones already sent (at-least-once, same identities).

With the state, each partition stores the next offset of each input it has processed, or
of the oldest one its processor still holds in memory (`POSITIONS`), so that after a
restart or a rebalance the loop knows where its state ends even where Faust committed
past records it never delivered (`streams.runtime.rewinds`). A write of several keys is
not atomic: a crash while the producer sends it can leave a prefix of it in the
changelog, keys newer than the positions (the positions go last, so never older).
Per key that is harmless (a replay the key's state holds is skipped), but a value of
the whole partition (its stream time) must match the positions: a processor's
`checkpoint()` is stored inside the positions record, and given back, on load, under
its own key in place of any value the table holds for it. An input partition with neither
stored positions nor a commit starts at its log start: before its first event is taken,
the loop learns that offset (`load_starts`), so a first event past it (the ones before
dropped by Faust while the partition was being assigned) is a gap like any other.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

import msgspec

from streams.core.ticks import Committed, Progress, Tick, decode_tick
from streams.processors.outputs import Counters, Outputs, Record, Source
from streams.runtime.rewinds import Paused, Rewinds, Seek, StartOf

__all__ = [
    "BATCH_MAX",
    "BATCH_WITHIN_S",
    "CHECKPOINT",
    "POSITIONS",
    "STATE_EVERY_EVENT_MS",
    "STATE_EVERY_S",
    "AgentLoop",
    "Message",
    "Processor",
    "Received",
    "StateTable",
]

log = logging.getLogger(__name__)

BATCH_MAX = 1000  # events per batch: a node sample is ~3 KB, so ~3 MB of input at most
BATCH_WITHIN_S = 0.2  # wait this long for a batch to fill: latency is seconds anyway
STATE_EVERY_S = 5.0  # state writes at most this often: what a crash has to read again
STATE_EVERY_EVENT_MS = 3_600_000
"""And at least this often in a partition's stream time: a backlog worked off at hours of
event time a second would otherwise store a state hours of stream time behind the claims
its ticks sent, and a restart would send that much usage again (`SENT_AGAIN_KEEP_MS`)."""
POSITIONS = b"@positions"  # no processor key starts with "@" (node names, pod uids, b"")
CHECKPOINT = "@checkpoint"  # in the positions record: no topic name has an "@"


class Message(NamedTuple):
    """The parts of a Kafka message the loop uses (a test's messages)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class Received(Protocol):
    """What the loop reads of a message: a `Message`, or Faust's own message of an event,
    taken as it is (a tuple made per event was 2 % of the worker's CPU)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


class Processor(Protocol):
    """One partition's side of the pipeline (`NodePartition`, `PodPartition`)."""

    @property
    def stream_time(self) -> int | None:
        """The partition's stream time, None before any."""
        ...

    def handle(self, source: Source, raw: bytes | None, out: Outputs) -> int | None:
        """Process one input; its event time, None when rejected."""
        ...

    def on_tick(self, tick: Tick, out: Outputs) -> None:
        """Apply a tick whose data is in."""
        ...

    def take_writes(self) -> list[tuple[bytes, bytes | None]]:
        """Changed state since the last call, by key (None: delete)."""
        ...

    # Optional, looked up with getattr: `resume_offsets() -> dict[str, int]` (inputs held
    # in memory, read again after a restart) and `checkpoint() -> (key, value) | None`
    # (the value of the whole partition, stored atomically with the positions).


class StateTable(Protocol):
    """A changelog-backed key/value table whose keys are grouped by partition."""

    def load(self, partition: int) -> list[tuple[bytes, bytes]]:
        """Every key and value of a partition."""
        ...

    def write(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Set (None: delete) a key of a partition, locally and in the changelog."""
        ...


Make = Callable[[int, list[tuple[bytes, bytes]]], Processor]
LoadStarts = Callable[[list[tuple[str, int]]], Awaitable[None]]
"""Learn the log start offsets of input partitions (afterwards `start_of` knows them)."""


class AgentLoop:
    """Runs batches through the processors of the partitions this worker owns."""

    def __init__(
        self,
        *,
        name: str,
        inputs: Iterable[str],
        tick_topic: str,
        table: StateTable,
        make: Make,
        outputs: Outputs,
        committed: Committed,
        send: Callable[[Record], None],
        flush: Callable[[], Awaitable[None]],
        seek: Seek | None = None,
        start_of: StartOf = lambda topic, partition: None,
        load_starts: LoadStarts | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        state_every_s: float = 0.0,
        ticked: Iterable[str] | None = None,
        state_every_event_ms: int | None = None,
        paused: Paused = lambda topic, partition: False,
    ) -> None:
        self.name = name
        self.tick_topic = tick_topic
        self.partitions: dict[int, Processor] = {}
        self.progress = Progress(inputs, committed, ticked)
        self.outputs = outputs
        self._table = table
        self._make = make
        self._send = send
        self._flush = flush
        self.rewinds = Rewinds(self.progress, seek, start_of, monotonic, paused)
        self._load_starts = load_starts
        self._monotonic = monotonic
        self._state_every_s = state_every_s
        self._state_due = 0.0
        self._state_every_event_ms = state_every_event_ms
        self._written_time: dict[int, int] = {}
        """Each partition's stream time when its state was last written."""
        self._unwritten: set[int] = set()
        """Partitions with inputs processed since their positions were last written."""
        self._checkpoints: dict[int, tuple[bytes, bytes]] = {}
        """Each partition's checkpoint as last written with its positions."""

    @property
    def counters(self) -> Counters:
        """The worker's counters."""
        return self.outputs.counters

    async def run(self, batches: AsyncIterable[Sequence[Received]]) -> None:
        """The agent body: batches of messages until they end (`streams.faust.inbox`)."""
        async for messages in batches:
            await self.process(messages)

    async def process(self, messages: Sequence[Received]) -> None:
        """One batch: process, send and flush the outputs, then store the state; what
        `flush` raises (records the broker did not take) ends the batch there."""
        out = self.outputs
        await self._learn_starts(messages)
        for m in messages:
            processor = self._processor(m.partition)
            source = Source(m.topic, m.partition, m.offset, m.key)
            if m.topic == self.tick_topic:
                try:
                    tick = decode_tick(m.value or b"")
                except msgspec.DecodeError as exc:
                    out.dead(source, m.value, f"not a worker tick: {exc}", "tick")
                    continue
                self.progress.park(m.partition, tick)
                continue
            if self.rewinds.gap(m.topic, m.partition, m.offset):
                continue
            counters = self.counters
            counters.events += 1
            counters.by_topic[m.topic] = counters.by_topic.get(m.topic, 0) + 1
            try:
                processor.handle(source, m.value, out)
            except Exception as exc:  # a bug of ours must not stop the partition for good
                log.exception("processing failed topic=%s offset=%d", m.topic, m.offset)
                out.dead(source, m.value, f"internal error: {exc!r}", "internal")
            self.progress.processed(m.topic, m.partition, m.offset)
            self._unwritten.add(m.partition)
        for partition in self.progress.has_pending():
            processor = self._processor(partition)
            for tick in self.progress.ready(partition):
                processor.on_tick(tick, out)
            self.rewinds.watch(partition, self.progress.head(partition))
        records = out.take()
        for record in records:
            self._send(record)
        if records:
            await self._flush()
        now = self._monotonic()
        if now >= self._state_due or self._state_behind():
            self._state_due = now + self._state_every_s
            if self._write_state():
                await self._flush()  # the state is taken by the broker before the batch is acked
        await self.rewinds.seek()

    async def _learn_starts(self, messages: Sequence[Received]) -> None:
        """The log starts of the batch's input partitions that nothing else places.

        A partition just assigned, with no stored positions and no commit, is read from its
        log start; until the offset probe has run once the loop does not know that start,
        and would take a first event past it (the earlier ones dropped by Faust while the
        partition was being assigned) as where the input begins.
        """
        if self._load_starts is None:
            return
        inputs = {(m.topic, m.partition) for m in messages}  # a few keys: one look-up each
        unknown = sorted(
            key
            for key in inputs
            if key[0] != self.tick_topic and self.rewinds.expected(*key) is None
        )
        if not unknown:
            return
        try:
            await self._load_starts(unknown)
        except Exception as exc:  # the broker away: the events wait, the partitions are read again
            log.warning(
                "%s log start offsets unknown partitions=%s error=%r", self.name, unknown, exc
            )
        for topic, partition in unknown:
            if self.rewinds.expected(topic, partition) is None:
                first = min(
                    m.offset for m in messages if (m.topic, m.partition) == (topic, partition)
                )
                self.rewinds.unplaced(topic, partition, first)

    def _state_behind(self) -> bool:
        """Whether a partition's stream time moved `state_every_event_ms` or more since its
        state was last written."""
        every = self._state_every_event_ms
        if every is None:
            return False
        written = self._written_time
        for partition, processor in self.partitions.items():
            now = processor.stream_time
            if now is None:
                continue
            if now - written.setdefault(partition, now) >= every:  # first seen: from then
                return True
        return False

    def _write_state(self) -> bool:
        """The state changed since the last write, and each partition's input positions;
        whether anything was written."""
        written = False
        for partition, processor in self.partitions.items():
            if processor.stream_time is not None:
                self._written_time[partition] = processor.stream_time
            writes = processor.take_writes()
            for key, value in writes:
                self._table.write(partition, key, value)
                written = True
            if writes:
                # Where a restart reads again moves with the state too (the pod side's
                # oldest held input, released by ticks), not only with new inputs: a state
                # written with older positions would read again what it has forgotten.
                self._unwritten.add(partition)
            checkpoint = getattr(processor, "checkpoint", None)
            if checkpoint is not None:
                current = checkpoint()
                if current is not None and current != self._checkpoints.get(partition):
                    self._checkpoints[partition] = current
                    self._unwritten.add(partition)
        for partition in sorted(self._unwritten):
            owner = self.partitions.get(partition)
            if owner is not None:
                # Every input gets a position, those with nothing processed yet where their
                # reading began: the commit moves past what this worker holds only in
                # memory, and a restart must not take it for stored (0 when that is not
                # known yet: the log start, read again from its first offset).
                positions = {
                    topic: self.rewinds.expected(topic, partition) or 0
                    for topic in self.progress.inputs
                }
                # Inputs a processor holds in memory (the pod side's, ahead of its
                # watermark) are read again after a restart: the position stays at them.
                resume = getattr(owner, "resume_offsets", None)
                for topic, offset in (resume() if resume is not None else {}).items():
                    if topic in positions:
                        positions[topic] = min(positions[topic], offset)
                record: dict[str, object] = dict(positions)
                kept = self._checkpoints.get(partition)
                if kept is not None:
                    # Atomic with the positions: a single record (see the module's doc).
                    record[CHECKPOINT] = [kept[0].decode(), kept[1].decode()]
                self._table.write(partition, POSITIONS, json.dumps(record).encode())
                written = True
        self._unwritten.clear()
        return written

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the processors of revoked partitions; they reload from the table if they return."""
        gone = set(partitions)
        for partition in gone:
            self.partitions.pop(partition, None)
            self._unwritten.discard(partition)
            self._checkpoints.pop(partition, None)
        self.progress.forget(gone)
        self.rewinds.forget(gone)

    def _processor(self, partition: int) -> Processor:
        processor = self.partitions.get(partition)
        if processor is None:
            stored = self._table.load(partition)
            checkpoint: tuple[bytes, bytes] | None = None
            for key, value in stored:
                if key == POSITIONS:
                    record = json.loads(value)
                    kept = record.pop(CHECKPOINT, None)
                    if kept is not None:
                        checkpoint = (kept[0].encode(), kept[1].encode())
                        self._checkpoints[partition] = checkpoint
                    self.progress.restore(partition, record)
            stored = [(key, value) for key, value in stored if key != POSITIONS]
            if checkpoint is not None:
                # What the positions were written with, not a newer write of the same key.
                stored = [(k, v) for k, v in stored if k != checkpoint[0]] + [checkpoint]
            processor = self.partitions[partition] = self._make(partition, stored)
            log.info("%s partition=%d loaded keys=%d", self.name, partition, len(stored))
        return processor
