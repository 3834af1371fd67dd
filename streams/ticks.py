"""Stream-time ticks: watermarks carried through Kafka, applied once the data before them is in.

Time-driven work (closing windows, flushing usage, missing telemetry, stalls and queued
alerts when no data arrives) must run inside stream processing: the tables' changelogs
are written per partition, and the work must be ordered with the partition's data. A timer
of each worker sends one `Tick` per partition through an internal topic that the agents
consume together with their data topics.

A tick is not applied when it arrives but once the partition's inputs are processed up to
the end offsets they had when the tick was sent (`Tick.ends`): everything produced before
it is in. So a tick never closes a window before the data that was already waiting for it,
whether the worker is live, catching up after a restart or replaying a day of history.

- `wm`: the sending worker's watermark (the largest event time it has seen), sent to the
  partitions it owns. The node side advances the partition's stream time to it: a
  partition whose nodes are gone or silent still closes its windows and sees them missing.
- `claims`: the node-side stream time of each partition the sender owns, sent to every
  partition after the sender's outputs were flushed. Pod usage due by then has been sent.
  The pod side's watermark is the lowest claim over all partitions (`SourceWatermarks`),
  because any node partition may hold usage of any pod.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, Literal

import msgspec

__all__ = ["MAX_PENDING", "Progress", "SourceWatermarks", "Tick", "decode_tick", "encode_tick"]

MAX_PENDING: Final = 64  # ticks kept per partition while it catches up; newer ones supersede


class Tick(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One tick to one partition; internal to the worker, never read by anyone else."""

    schema: Literal["gpuwatch.worker.tick/v1"] = "gpuwatch.worker.tick/v1"
    sender: str
    """The sending worker (for logs)."""
    wm: int | None = None
    """The sender's watermark, for a partition it owns; None when it is not the owner."""
    claims: dict[int, int] = msgspec.field(default_factory=dict)
    """Node-side stream time by partition, for the partitions the sender owns."""
    ends: dict[str, int] = msgspec.field(default_factory=dict)
    """End offset of each input topic's partition when the tick was sent, by topic name."""
    starts: dict[str, int] = msgspec.field(default_factory=dict)
    """Log start offsets of the same partitions (an empty, never committed input is caught up)."""


_DECODER: Final = msgspec.json.Decoder(Tick)
_ENCODER: Final = msgspec.json.Encoder()


def encode_tick(tick: Tick) -> bytes:
    """A tick as compact JSON."""
    return _ENCODER.encode(tick)


def decode_tick(raw: bytes) -> Tick:
    """A tick back from JSON; raises `msgspec.DecodeError` (a ValueError) when it is not one."""
    return _DECODER.decode(raw)


Committed = Callable[[str, int], "int | None"]
"""The consumer group's committed offset of a topic partition, None when it has none."""


class Progress:
    """Which input offsets an agent has processed, and the ticks waiting for them.

    Before the first event of a partition is processed (after a start or a rebalance), the
    committed offset says where processing stands, and an input that was never committed
    is caught up only when it is empty (its end is its start).
    """

    def __init__(self, inputs: Iterable[str], committed: Committed) -> None:
        self.inputs = tuple(inputs)
        self._committed = committed
        self._done: dict[tuple[str, int], int] = {}
        self._pending: dict[int, deque[Tick]] = {}

    def processed(self, topic: str, partition: int, offset: int) -> None:
        """An event of an input was processed."""
        key = (topic, partition)
        if offset > self._done.get(key, -1):
            self._done[key] = offset

    def expected(self, topic: str, partition: int, start: int | None) -> int | None:
        """The offset the next event of an input should have; None when unknown.

        After the last processed one; before any, the committed offset, or the log start
        (`start`) for an input never committed (Faust's commit 0 means the same).
        """
        done = self._done.get((topic, partition))
        if done is not None:
            return done + 1
        committed = self._committed(topic, partition)
        return committed if committed else start

    def park(self, partition: int, tick: Tick) -> None:
        """Keep a tick until the partition's inputs reach its end offsets."""
        queue = self._pending.setdefault(partition, deque(maxlen=MAX_PENDING))
        queue.append(tick)

    def head(self, partition: int) -> Tick | None:
        """The oldest tick a partition waits with, if any."""
        queue = self._pending.get(partition)
        return queue[0] if queue else None

    def positions(self, partition: int) -> dict[str, int]:
        """The next offset of each input of a partition, by topic (those processed so far)."""
        return {
            topic: self._done[(topic, partition)] + 1
            for topic in self.inputs
            if (topic, partition) in self._done
        }

    def restore(self, partition: int, positions: dict[str, int]) -> None:
        """Take the positions stored with a partition's state as processed."""
        for topic, offset in positions.items():
            if offset > 0:
                self.processed(topic, partition, offset - 1)

    def has_pending(self) -> list[int]:
        """Partitions with ticks waiting."""
        return [p for p, queue in self._pending.items() if queue]

    def ready(self, partition: int) -> list[Tick]:
        """The ticks of a partition whose inputs are processed far enough, oldest first."""
        queue = self._pending.get(partition)
        out: list[Tick] = []
        while queue and self._reached(partition, queue[0]):
            out.append(queue.popleft())
        return out

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop what is known of partitions this worker no longer owns."""
        gone = set(partitions)
        for partition in gone:
            self._pending.pop(partition, None)
        for key in [key for key in self._done if key[1] in gone]:
            del self._done[key]

    def _reached(self, partition: int, tick: Tick) -> bool:
        for topic in self.inputs:
            end = tick.ends.get(topic)
            if end is None:
                return False  # a tick that does not say where the input ended proves nothing
            done = self._done.get((topic, partition))
            if done is not None:
                if done + 1 < end:
                    return False
                continue
            base = self._committed(topic, partition)
            if base is None:
                base = tick.starts.get(topic)
            if base is None or base < end:
                return False
        return True


class SourceWatermarks:
    """The pod side's watermark: the lowest node-side stream time over every partition.

    None until every partition has been claimed once; it never goes backwards.
    """

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._claims: dict[int, int] = {}
        self.value: int | None = None

    def update(self, claims: dict[int, int]) -> int | None:
        """Take a tick's claims in; return the watermark after them."""
        for partition, stream_time in claims.items():
            if 0 <= partition < self.partitions and stream_time > self._claims.get(partition, -1):
                self._claims[partition] = stream_time
        if len(self._claims) == self.partitions:
            low = min(self._claims.values())
            if self.value is None or low > self.value:
                self.value = low
        return self.value
