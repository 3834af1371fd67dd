"""What a batch of stream processing publishes: typed records, dead letters and the counters.

Processors never touch Kafka: they append to an `Outputs` and the agent loop sends what it
holds once the batch is done. A message nobody can process (not JSON, another schema, an
unknown major version, values that cannot be true, or an error of our own while handling
it) becomes a `deadletter` record with its source topic, partition, offset and the original
bytes, is counted, and processing goes on: bad data never stops a worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec

from schemas.codec import MalformedJSON, SchemaError, TopicSpec, UnknownSchemaVersion
from schemas.deadletter import NOT_FROM_KAFKA, DeadLetter
from schemas.topics import DEADLETTER
from streams.core.sanity import MAX_CLOCK_SKEW_MS, check_size, wrong_key

__all__ = [
    "MAX_LETTER_BYTES",
    "MAX_RECORD_BYTES",
    "Counters",
    "DeadKind",
    "Outputs",
    "Record",
    "Source",
    "dead_kind",
]

log = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)

LOG_EVERY_S = 10.0  # one dead-letter warning per this many seconds: a flood must not flood logs
# The largest dead letter sent: a bigger one would be refused by the producer (Faust's
# producer_max_request_size is 1,000,000 bytes) and stop the worker, for good, since the
# same input comes again after the restart. A letter of an input near the broker's 1 MB
# limit exceeds it (JSON escapes, base64), so its raw is cut (`DeadLetter.fitted`).
MAX_LETTER_BYTES = 900_000
MAX_RECORD_BYTES = MAX_LETTER_BYTES  # of any record, key included; the same reason

DeadKind = Literal["json", "schema", "version", "values", "key", "tombstone", "tick", "internal"]
"""Why a message was dead-lettered, as a bounded word for metrics (the record has the text)."""


def dead_kind(exc: SchemaError) -> DeadKind:
    """The kind of a codec error: not JSON, an unknown major version, or any other violation."""
    if isinstance(exc, MalformedJSON):
        return "json"
    if isinstance(exc, UnknownSchemaVersion):
        return "version"
    return "schema"  # WrongSchema, a missing field, a wrong type or range


@dataclass
class Counters:
    """What the worker has done, for its metrics (wired by the sinks' metrics module)."""

    events: int = 0
    """Input messages processed (ticks not included)."""
    deadletter: int = 0
    """Messages sent to the deadletter topic."""
    late: int = 0
    """Node samples or pod usage with a part for a window closed longer ago than the
    revision horizon (left out)."""
    applied_late: int = 0
    """Inputs behind the watermark by their own time that were applied when they came (pod
    and workload events, changes of the fleet's capacity): late, but nothing is lost."""
    revisions: int = 0
    """Records of closed windows emitted for data that came after they closed, within the
    revision horizon: again, revised, or first (a window nothing had come for)."""
    duplicates: int = 0
    """Redelivered inputs that changed nothing (samples older than the node's newest)."""
    samples_missing: int = 0
    """Node samples lost between two received ones, by `seq`."""
    unknown_devices: int = 0
    """Allocated device ids that no GPU of the sample reports (warnings, not errors)."""
    units_dropped: int = 0
    """Pods' units of work of a sample left out: the sample has no usage of the pod, or the
    part of it they belong to (its start) was late."""
    ticks: int = 0
    """Ticks applied."""
    by_topic: dict[str, int] = field(default_factory=dict)
    """Input messages processed, by topic (the metric `gpuwatch_events_total`)."""
    dead_by: dict[tuple[str, str], int] = field(default_factory=dict)
    """Dead letters by (source topic, kind) (the metric `gpuwatch_deadletter_total`)."""
    delivery_failures: dict[tuple[str, str], int] = field(default_factory=dict)
    """Record batches the broker did not take, by (topic, error class) (the metric
    `gpuwatch_delivery_failures_total`): the worker stops after the first."""
    aligned_paused: int = 0
    """Node partitions not read now, ahead of the slowest (`streams.core.alignment`)."""
    alignment_pauses: int = 0
    """Times a node partition was paused for running ahead of the slowest."""
    alignment_released: int = 0
    """Times the paused partitions were read again because the slowest stood still."""


class Source(NamedTuple):
    """Where an input message came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None


class Record(NamedTuple):
    """One message to publish: full topic name, key and value bytes, and the partition
    where it must go (None: where its key hashes to)."""

    topic: str
    key: bytes
    value: bytes
    partition: int | None = None


class Outputs:
    """Records of one batch, in the order they were made."""

    def __init__(
        self,
        prefix: str,
        counters: Counters,
        now_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        observe: Callable[[Any], None] | None = None,
    ) -> None:
        self.prefix = prefix
        self._observe = observe
        self.counters = counters
        self.records: list[Record] = []
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._monotonic = monotonic
        self._next_log = 0.0
        self._unlogged = 0

    def emit(self, spec: TopicSpec[Any], value: Any) -> None:
        """Publish a typed value on its topic, keyed as the topic says.

        A record too large for Kafka is dead-lettered instead (its own topic as the source):
        sending it would stop the worker, again after every restart.
        """
        key = spec.key_of(value).encode("utf-8")
        topic, data = spec.full_name(self.prefix), spec.encode(value)
        if len(key) + len(data) > MAX_RECORD_BYTES and spec is not DEADLETTER:
            error = (
                f"record of {len(key) + len(data)} bytes is over the limit of {MAX_RECORD_BYTES}"
            )
            self.dead(Source(topic, NOT_FROM_KAFKA, NOT_FROM_KAFKA, key), data, error, "internal")
            return
        self.records.append(Record(topic, key, data))
        if self._observe is not None:
            self._observe(value)

    def emit_raw(self, topic: str, key: bytes, value: bytes, partition: int) -> None:
        """Publish bytes of an internal topic to one partition (the fleet topic's)."""
        self.records.append(Record(topic, key, value, partition))

    def emit_all(self, spec: TopicSpec[Any], values: list[Any]) -> None:
        """Publish several values on one topic."""
        for value in values:
            self.emit(spec, value)

    def admit(self, source: Source, raw: bytes | None) -> bytes | None:
        """An input's bytes if it can be decoded at all; a tombstone or one too large to
        forward is dead-lettered (None)."""
        if raw is None:
            self.dead(source, raw, "no value (a tombstone)", "tombstone")
            return None
        too_large = check_size(raw)
        if too_large is not None:
            self.dead(source, raw, too_large)
            return None
        return raw

    def decode(
        self,
        spec: TopicSpec[T],
        source: Source,
        raw: bytes,
        check: Callable[[T, int | None, int], list[str]] | None = None,
        *,
        now_ms: Callable[[], int] | None = None,
        max_ahead_ms: int = MAX_CLOCK_SKEW_MS,
        keyed: bool = False,
    ) -> T | None:
        """An input decoded and, with `check`, checked against the wall clock `now_ms`
        (event times at most `max_ahead_ms` ahead of it); `keyed`: its key must be its
        value's identity (`spec.key_of`). None once it is dead-lettered: the codec's
        reason, or the check's errors and the key's."""
        try:
            value = spec.decode(raw)
        except SchemaError as exc:
            self.rejected(source, raw, exc)
            return None
        wall = None if now_ms is None else now_ms()
        errors = [] if check is None else check(value, wall, max_ahead_ms)
        kind: DeadKind = "values"
        if keyed and source.key != (identity := spec.key_of(value)).encode():
            # Keyed otherwise, the value is on another partition than the rest of its node's
            # or pod's data, and would start a second state of it there.
            kind = "values" if errors else "key"
            errors.append(wrong_key(source.key, identity, spec.key))
        if errors:
            self.dead(source, raw, "; ".join(errors), kind)
            return None
        return value

    def rejected(self, source: Source, raw: bytes | None, exc: SchemaError) -> None:
        """Dead-letter an input the codec refused, with the codec's reason."""
        self.dead(source, raw, str(exc), dead_kind(exc))

    def dead(
        self, source: Source, raw: bytes | None, error: str, kind: DeadKind = "values"
    ) -> None:
        """Send an input nobody can process to the deadletter topic, with the reason."""
        letter = DeadLetter.from_bytes(
            source_topic=source.topic,
            ts=self._now_ms(),
            error=error,
            raw=raw if raw is not None else b"",
            key=source.key,
            partition=source.partition,
            offset=source.offset,
        ).fitted(MAX_LETTER_BYTES)
        self.emit(DEADLETTER, letter)
        counters = self.counters
        counters.deadletter += 1
        by = (source.topic, kind)
        counters.dead_by[by] = counters.dead_by.get(by, 0) + 1
        now = self._monotonic()
        if now < self._next_log:
            self._unlogged += 1
            return
        self._next_log = now + LOG_EVERY_S
        more = f" (and {self._unlogged} more since the last warning)" if self._unlogged else ""
        self._unlogged = 0
        log.warning(
            "dead letter topic=%s partition=%d offset=%d error=%r%s",
            source.topic,
            source.partition,
            source.offset,
            error[:200],
            more,
        )

    def take(self) -> list[Record]:
        """The records so far, leaving none."""
        records, self.records = self.records, []
        return records
