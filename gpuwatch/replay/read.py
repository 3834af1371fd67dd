"""Reads gpuwatch topics over an event-time range: offsets for times, a margin, progress
(drawn by `gpuwatch/replay/progress.py`).

Kafka indexes records by their record timestamp (when the producer sent them), while a
range is asked in event time (the `ts` in the value). The two differ: a window record is
written `allowed_lateness` after its `ts`, a worker catching up after an outage writes an
hour late, and a simulation run faster than real time writes event times ahead of the wall
clock. So each partition is read

- from `offsets_for_times(start - SKEW_MS)`: records written more than a minute before the
  range cannot hold its events, unless event time runs ahead of the writes. That is checked
  on the record just before the start: if its `ts` is already in the range, the start
  gallops back until a record's `ts` is before the range;
- until its end offset, or the first record whose write time and `ts` are both past
  `end + margin`: later records are past the range, unless written more than the margin
  after their event time (the margin, `--margin`, is printed with the story).

Values are only probed for `ts` here (a msgspec struct of one field); the caller decodes
what it keeps. This is the kafka-python adapter of `gpuwatch replay`, and of
`gpuwatch report`, which reads the derived topics over a period the same way.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gpuwatch.kafka import KafkaError, TopicPartition, consumer
from gpuwatch.replay.progress import Progress
from gpuwatch.timerange import TimeRange
from schemas.settings import KafkaSettings

__all__ = ["SKEW_MS", "Hit", "PartitionPlan", "Plan", "Progress", "RangeReader", "ReadError"]

SKEW_MS = (
    60_000  # producer clocks and 1 s Kubernetes timestamps: the minute streams.core.sanity allows
)
STALL_S = 30.0  # a local broker answers in milliseconds; 30 s of silence is a broker gone
POLL_MS = 200
MAX_RECORDS = 5000


class ReadError(Exception):
    """Kafka could not be read; the message says what and where."""


class _Ts(msgspec.Struct, gc=False):
    ts: int


_TS = msgspec.json.Decoder(_Ts)


def value_ts(raw: bytes | None) -> int | None:
    """The `ts` of a raw value, None when it has none (a bad record: the deadletter's job)."""
    if raw is None:
        return None
    try:
        return _TS.decode(raw).ts
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


@dataclass(frozen=True)
class Hit:
    """One record read: topic, partition, key, raw value, the value's event time and when
    the record was written (its record timestamp)."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    ts: int
    written_ms: int = 0


@dataclass
class PartitionPlan:
    """Where one partition is read: `[start, end)`, and what retention left of it."""

    topic: str
    partition: int
    begin: int
    start: int
    end: int
    earliest_ms: int | None = None
    """Time of the oldest record kept, probed only when older records were deleted."""


@dataclass
class Plan:
    """Every partition to read, and the topics that do not exist."""

    parts: list[PartitionPlan]
    missing: list[str]
    scanned: dict[str, int] = field(default_factory=dict)
    """Records read per topic (filled while reading)."""
    in_range: dict[str, int] = field(default_factory=dict)
    """Records whose `ts` lies in the range, per topic (filled while reading)."""

    def total(self, topics: Sequence[str]) -> int:
        """Records between the start and end offsets of these topics (an upper bound)."""
        return sum(p.end - p.start for p in self.parts if p.topic in topics)

    def emptied(self) -> list[str]:
        """Topics with a partition whose every record retention deleted (no time is left)."""
        return sorted({p.topic for p in self.parts if 0 < p.begin == p.end})

    def retained_from(self) -> dict[str, int]:
        """Per topic that lost records to retention: the time from which it is complete."""
        out: dict[str, int] = {}
        for p in self.parts:
            if p.begin > 0 and p.earliest_ms is not None:
                out[p.topic] = max(out.get(p.topic, 0), p.earliest_ms)
        return out


class RangeReader:
    """Plans and reads partitions by event time through one consumer without a group."""

    def __init__(
        self,
        kafka: KafkaSettings,
        progress: Progress | None = None,
        *,
        client_id: str = "gpuwatch-replay",
    ) -> None:
        self.progress = progress or Progress()
        try:
            self._consumer: Any = consumer(
                kafka,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                client_id=client_id,
            )
            self._existing: set[str] = set(self._consumer.topics())
        except KafkaError as exc:
            raise ReadError(f"cannot reach Kafka at {kafka.bootstrap}: {exc!r}") from exc

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection."""
        self._consumer.close()

    def partitions(self, topic: str) -> list[TopicPartition]:
        """The partitions of a topic; empty when it does not exist."""
        if topic not in self._existing:
            self._existing = set(self._consumer.topics())  # created since we last looked?
        if topic not in self._existing:
            return []
        ids = self._consumer.partitions_for_topic(topic) or set()
        return [TopicPartition(topic, p) for p in sorted(ids)]

    def plan(self, topics: Sequence[str], span: TimeRange, *, from_beginning: bool = False) -> Plan:
        """Start and end offsets of every partition of `topics` for the range.

        `from_beginning` starts at the oldest record kept, whatever the range says.
        """
        tps = [tp for topic in topics for tp in self.partitions(topic)]
        missing = [t for t in topics if not any(tp.topic == t for tp in tps)]
        if not tps:
            return Plan([], missing)
        try:
            begins = self._consumer.beginning_offsets(tps)
            ends = self._consumer.end_offsets(tps)
            found = (
                {tp: None for tp in tps}
                if from_beginning
                else self._consumer.offsets_for_times(
                    {tp: max(0, span.start_ms - SKEW_MS) for tp in tps}
                )
            )
        except KafkaError as exc:
            raise ReadError(f"Kafka refused an offsets request: {exc!r}") from exc

        def start(tp: TopicPartition) -> int:
            if from_beginning:
                return int(begins[tp])
            at = found.get(tp)  # None: every record was written before the range
            return int(ends[tp] if at is None else max(begins[tp], at.offset))

        parts = {
            tp: PartitionPlan(tp.topic, tp.partition, begins[tp], start(tp), ends[tp]) for tp in tps
        }
        if not from_beginning:
            self._gallop(parts, span.start_ms)
        truncated = {tp: p.begin for tp, p in parts.items() if 0 < p.begin < p.end}
        for tp, record in self._first_records(truncated).items():
            ts = value_ts(record.value)
            parts[tp].earliest_ms = record.timestamp if ts is None else min(ts, record.timestamp)
        return Plan(list(parts.values()), missing)

    def newest_write_ms(self, topic: str) -> int | None:
        """When the newest record of a topic was written (record timestamp); None: empty."""
        tps = self.partitions(topic)
        try:
            begins = self._consumer.beginning_offsets(tps) if tps else {}
            ends = self._consumer.end_offsets(tps) if tps else {}
        except KafkaError as exc:
            raise ReadError(f"Kafka refused an offsets request: {exc!r}") from exc
        last = self._first_records({tp: ends[tp] - 1 for tp in tps if ends[tp] > begins[tp]})
        return max((int(record.timestamp) for record in last.values()), default=None)

    def _gallop(self, parts: dict[TopicPartition, PartitionPlan], start_ms: int) -> None:
        """Move starts back where event time runs ahead of the writes (see the module doc)."""
        step = 1
        todo = {tp: p for tp, p in parts.items() if p.start > p.begin}
        while todo:
            wanted = {tp: max(p.begin, p.start - step) for tp, p in todo.items()}
            records = self._first_records(wanted)
            for tp, offset in wanted.items():
                ts = value_ts(records[tp].value) if tp in records else None
                if ts is not None and ts >= start_ms:
                    todo[tp].start = offset
                    if offset > todo[tp].begin:
                        continue
                del todo[tp]
            step *= 2

    def _first_records(self, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        """The record at each offset (or the first after it), one fetch for all."""
        if not wanted:
            return {}
        consumer = self._consumer
        consumer.assign(list(wanted))
        for tp, offset in wanted.items():
            consumer.seek(tp, offset)
        got: dict[TopicPartition, Any] = {}
        deadline = time.monotonic() + STALL_S
        while len(got) < len(wanted):
            if time.monotonic() > deadline:
                raise ReadError(f"Kafka sent no record of {sorted(set(wanted) - set(got))}")
            for tp, records in consumer.poll(timeout_ms=POLL_MS).items():
                if tp not in got and records:
                    got[tp] = records[0]  # no pause(): kafka-python 3.0 then never fetches it again
        return got

    def read(
        self, plan: Plan, topics: Sequence[str], span: TimeRange, margin_ms: int
    ) -> Iterator[Hit]:
        """The records of `topics` that the plan and the stop rule let through, any order."""
        parts = {TopicPartition(p.topic, p.partition): p for p in plan.parts if p.topic in topics}
        active = {tp: p for tp, p in parts.items() if p.start < p.end}
        self.progress.begin(", ".join(sorted({tp.topic for tp in parts})), plan.total(topics))
        if not active:
            self.progress.finish()
            return
        consumer = self._consumer
        at = {tp: p.start for tp, p in active.items()}
        self._assign(at)
        stop_ms = span.end_ms + margin_ms
        last_data = time.monotonic()
        try:
            while active:
                batches = consumer.poll(timeout_ms=POLL_MS, max_records=MAX_RECORDS)
                if batches:
                    last_data = time.monotonic()
                elif time.monotonic() - last_data > STALL_S:
                    raise ReadError(f"Kafka stopped sending records of {sorted(active)}")
                finished = False
                for tp, records in batches.items():
                    part = active.get(tp)
                    if part is None:
                        continue
                    past = yield from self._take(plan, part, records, span, stop_ms)
                    at[tp] = max(at[tp], records[-1].offset + 1) if records else at[tp]
                    if past or at[tp] >= part.end:
                        del active[tp], at[tp]
                        finished = True
                if finished and active:
                    # The finished ones are no longer fetched. Only once the whole poll is
                    # taken: a seek to a partition's offset before its batch of this poll
                    # was taken would fetch that batch again (each record read twice).
                    self._assign(at)
        except KafkaError as exc:
            raise ReadError(f"reading {sorted(active)} failed: {exc!r}") from exc
        finally:
            self.progress.finish()

    def _assign(self, at: dict[TopicPartition, int]) -> None:
        """Read these partitions from these offsets (and no other)."""
        self._consumer.assign(list(at))
        for tp, offset in at.items():
            self._consumer.seek(tp, offset)

    def _take(
        self, plan: Plan, part: PartitionPlan, records: list[Any], span: TimeRange, stop_ms: int
    ) -> Generator[Hit, None, bool]:
        """The records of one batch; returns True once a record is past the range."""
        topic = part.topic
        for record in records:
            if record.offset >= part.end:
                break
            ts = value_ts(record.value)
            if min(record.timestamp, record.timestamp if ts is None else ts) > stop_ms:
                self.progress.advance(part.end - record.offset)
                return True  # past the range: the rest of the partition is too
            self.progress.advance()
            plan.scanned[topic] = plan.scanned.get(topic, 0) + 1
            if ts is None:
                continue
            if span.holds(ts):
                plan.in_range[topic] = plan.in_range.get(topic, 0) + 1
            yield Hit(topic, record.partition, record.key, record.value, ts, record.timestamp)
        return False
