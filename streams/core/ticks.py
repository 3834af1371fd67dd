"""Stream-time ticks: progress carried through Kafka, applied once the data before them is in.

Time-driven work (closing windows, flushing usage, missing telemetry, queued alerts when no
data arrives) must run inside stream processing: the tables' changelogs are written per
partition, and the work must be ordered with the partition's data. A timer of each worker
sends one `Tick` per partition through an internal topic that the agents consume together
with their data topics.

A tick is not applied when it arrives but once the partition's inputs are processed up to
the end offsets they had when the tick was sent (`Tick.ends`): everything produced before
it is in. So a tick never closes a window before the data that was already waiting for it,
whether the worker is live, catching up after a restart or replaying a day of history.

- `claims`: the node-side stream time of each partition the sender owns (the largest
  sample `ts` it processed, raised while it is idle), taken before the sender's outputs
  were flushed: the pod usage it promises is in Kafka before the tick is.
- `idle`: those of the sender's partitions that are idle (SEMANTICS.md, Time): caught up,
  and left behind by the others' progress. An idle partition is raised to the lowest
  stream time of the partitions that are not, and claims that.

The pod side's watermark is the lowest usage frontier over every partition
(`SourceWatermarks`), because any node partition may hold usage of any pod.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

import msgspec

__all__ = [
    "MAX_PENDING",
    "Progress",
    "SourceWatermarks",
    "Tick",
    "claims_of",
    "decode_tick",
    "encode_tick",
    "usage_frontier",
]

MAX_PENDING: Final = 64  # ticks kept per partition while it catches up; newer ones supersede


class Tick(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One tick to one partition; internal to the worker, never read by anyone else."""

    schema: Literal["gpuwatch.run.worker.tick/v1"] = "gpuwatch.run.worker.tick/v1"
    sender: str
    """The sending worker (for logs)."""
    claims: dict[int, int] = msgspec.field(default_factory=dict)
    """Node-side stream time by partition, for the partitions the sender owns."""
    idle: list[int] = msgspec.field(default_factory=list)
    """Those of the claimed partitions that are idle (claiming the time they were raised
    to; one with no sample yet claims -1 until it is raised)."""
    ends: dict[str, int] = msgspec.field(default_factory=dict)
    """End offset of each input topic's partition when the tick was sent, by topic name."""
    starts: dict[str, int] = msgspec.field(default_factory=dict)
    """Log start offsets of the same partitions (an empty, never committed input is caught up)."""
    now: int | None = None
    """The sender's wall clock (epoch ms) just before it took `ends`: a partition the tick
    finds caught up had in Kafka everything sent before then (SEMANTICS.md, Time: quiet
    partitions move with the wall clock)."""


_DECODER: Final = msgspec.json.Decoder(Tick)
_ENCODER: Final = msgspec.json.Encoder()


def encode_tick(tick: Tick) -> bytes:
    """A tick as compact JSON."""
    return _ENCODER.encode(tick)


def decode_tick(raw: bytes) -> Tick:
    """A tick back from JSON; raises `msgspec.DecodeError` (a ValueError) when it is not one."""
    return _DECODER.decode(raw)


def claims_of(
    partitions: Mapping[int, Any], owned: Iterable[int]
) -> tuple[dict[int, int], list[int]]:
    """The claims and idle partitions of a sender's node partitions (`NodePartition.claim`)."""
    owned = set(owned)
    claims: dict[int, int] = {}
    idle: list[int] = []
    for partition, processor in sorted(partitions.items()):
        claim = processor.claim() if partition in owned else None
        if claim is not None:
            claims[partition] = claim[0]
            if claim[1]:
                idle.append(partition)
    return claims, idle


Committed = Callable[[str, int], "int | None"]
"""The consumer group's committed offset of a topic partition, None when it has none."""


class Progress:
    """Which input offsets an agent has processed, and the ticks waiting for them.

    Before the first event of a partition is processed (after a start or a rebalance), the
    committed offset says where processing stands, and an input that was never committed
    is caught up only when it is empty (its end is its start).

    That base is taken once, when it is first asked for (`expected`), and kept until the
    partition is revoked: the group's commit moves on with what this worker acknowledges,
    including what it holds only in memory, and a base read later would take those for
    stored (the agent loop stores it with the state, so a restart reads from it again).
    """

    def __init__(
        self, inputs: Iterable[str], committed: Committed, ticked: Iterable[str] | None = None
    ) -> None:
        self.inputs = tuple(inputs)
        self.ticked = self.inputs if ticked is None else tuple(ticked)
        """The inputs a tick waits for (the others, the fleet topic, go by their own marks)."""
        self._committed = committed
        self._done: dict[tuple[str, int], int] = {}
        self._base: dict[tuple[str, int], int] = {}
        """(topic, partition) -> where reading began, for inputs none processed of yet."""
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
        key = (topic, partition)
        done = self._done.get(key)
        if done is not None:
            return done + 1
        base = self._base.get(key)
        if base is None:
            committed = self._committed(topic, partition)
            base = committed if committed else start
            if base is not None:
                self._base[key] = base
        return base

    def park(self, partition: int, tick: Tick) -> None:
        """Keep a tick until the partition's inputs reach its end offsets."""
        queue = self._pending.setdefault(partition, deque(maxlen=MAX_PENDING))
        queue.append(tick)

    def head(self, partition: int) -> Tick | None:
        """The oldest tick a partition waits with, if any."""
        queue = self._pending.get(partition)
        return queue[0] if queue else None

    def restore(self, partition: int, positions: dict[str, int]) -> None:
        """Take the positions stored with a partition's state as processed.

        A position of 0 (an input held since the partition's first offset) is read from 0,
        not from the committed offset.
        """
        for topic, offset in positions.items():
            key = (topic, partition)
            self._done[key] = max(self._done.get(key, -1), offset - 1)

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
        for mapping in (self._done, self._base):
            for key in [key for key in mapping if key[1] in gone]:
                del mapping[key]

    def _reached(self, partition: int, tick: Tick) -> bool:
        for topic in self.ticked:
            end = tick.ends.get(topic)
            if end is None:
                return False  # a tick that does not say where the input ended proves nothing
            done = self._done.get((topic, partition))
            if done is not None:
                if done + 1 < end:
                    return False
                continue
            base = self._base.get((topic, partition))
            if base is None:
                base = self._committed(topic, partition)
            if base is None:
                base = tick.starts.get(topic)
            if base is None or base < end:
                return False
        return True


def usage_frontier(stream_time: int, lateness_ms: int, flush_ms: int, window_ms: int) -> int:
    """The event time up to which a node partition at `stream_time` has sent all pod usage.

    A pod's pending usage goes out when stream time passes the next flush boundary or
    window end after its start, and the part of a sample that would end at or before the
    frontier is late (dropped and counted on the node side), so nothing ending at or
    before it comes later: `stream_time - lateness`, or the last flush boundary or window
    end passed when the lateness is shorter than a flush period.
    """
    passed = max(stream_time - stream_time % flush_ms, stream_time - stream_time % window_ms)
    return min(stream_time - lateness_ms, passed)


class SourceWatermarks:
    """The pod side's watermark: the lowest usage frontier over every node partition.

    Each partition's latest claim and idle flag are kept (its owner is the only one to
    claim it, and its claims never go backwards). An idle partition claims the stream
    time it was raised to, the lowest of the others' when it applied a tick, after
    flushing the usage that raise let go: so it holds the minimum back by no more than a
    tick, and never pushes it past usage it still had to send. The watermark is None until
    every partition has been claimed once, and never goes backwards.
    """

    def __init__(self, partitions: int, frontier: Callable[[int], int] = lambda st: st) -> None:
        self.partitions = partitions
        self._frontier = frontier
        self._claims: dict[int, int] = {}
        self._idle: dict[int, bool] = {}
        self.value: int | None = None

    def update(self, claims: dict[int, int], idle: Iterable[int] = ()) -> int | None:
        """Take a tick's claims in; return the watermark after them."""
        idle = set(idle)
        for partition, stream_time in claims.items():
            if 0 <= partition < self.partitions and stream_time >= self._claims.get(partition, -1):
                self._claims[partition] = stream_time
                self._idle[partition] = partition in idle
        if len(self._claims) == self.partitions:
            low = self._frontier(min(self._claims.values()))
            if self.value is None or low > self.value:
                self.value = low
        return self.value

    @property
    def highest(self) -> int | None:
        """The highest stream time claimed so far (None before any claim)."""
        return max(self._claims.values(), default=None)

    def lowest_active(self, but: int) -> int | None:
        """The lowest stream time of the partitions not idle, other than `but`; when every
        other one is idle, the lowest of theirs that has a sample (a fleet gone quiet, its
        partitions moved by the wall clock); None: none."""
        active = [st for p, st in self._claims.items() if p != but and not self._idle[p]]
        if active:
            return min(active)
        quiet = (st for p, st in self._claims.items() if p != but and st >= 0)
        return min(quiet, default=None)
