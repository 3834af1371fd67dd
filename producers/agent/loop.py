"""The node agent's loop: read GPUs, resolve PIDs, assemble, publish, on a drift-free schedule."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from producers.agent.assemble import SharingConfig, assemble_sample
from producers.base.ports import AllocationSource, GpuReader, PodResolver
from schemas.fields import DEFAULT_CLUSTER
from schemas.nvml_sample import NvmlSample, PodWork
from schemas.topics import NVML_SAMPLES

log = logging.getLogger(__name__)

Publish = Callable[[bytes, bytes], None]


class Clock(Protocol):
    """Wall time for `ts`, monotonic time for the schedule."""

    def time(self) -> float:
        """Seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """Monotonic seconds."""
        return time.monotonic()


@dataclass
class AgentStats:
    """What the loop has done, for the agent's self-metrics."""

    ticks: int = 0
    skipped_ticks: int = 0
    """Ticks not taken because a tick overran the schedule."""
    read_errors: int = 0
    """Device reads that failed (one device, one tick)."""
    last_read_s: float = 0.0
    """Seconds the last tick spent reading NVML, PIDs and allocations."""
    last_sample_bytes: int = 0
    gpus: int = 0


class NodeAgent:
    """One node's sampler. `tick` is one step; `run` repeats it on the schedule.

    A sample covers the interval since the previous tick: `ts` is that tick's wall time
    and `interval_ms` the time since, so consecutive samples tile time without gaps or
    overlaps. After a stall longer than two intervals the sample claims only the
    nominal interval before now, not the whole gap. Every sample names `cluster` (the
    default cluster's leave the field out on the wire).
    """

    def __init__(
        self,
        *,
        node: str,
        reader: GpuReader,
        resolver: PodResolver,
        allocations: AllocationSource,
        publish: Publish,
        interval_s: float,
        sharing: SharingConfig | None = None,
        clock: Clock | None = None,
        cluster: str = DEFAULT_CLUSTER,
        work: Callable[[], tuple[PodWork, ...]] | None = None,
    ) -> None:
        """`work`, when given, is asked every tick for the units of work its scrapes found
        since the last tick (`producers.work`); they go on the sample (`work`)."""
        self.node = node
        self._work = work
        self.cluster = cluster
        self.interval_s = interval_s
        self.stats = AgentStats()
        self._reader = reader
        self._resolver = resolver
        self._allocations = allocations
        self._publish = publish
        self._sharing = sharing
        self._clock = clock or SystemClock()
        self._key = node.encode()
        self._seq = 0
        self._failing: frozenset[str] = frozenset()
        """The read errors of the last tick: each is logged when it starts and when it ends."""
        self._last_wall_ms: int | None = None

    @property
    def seq(self) -> int:
        """The `seq` of the next sample."""
        return self._seq

    def _interval(self, now_ms: int) -> tuple[int, int]:
        nominal = max(1, round(self.interval_s * 1000))
        last = self._last_wall_ms
        self._last_wall_ms = now_ms
        if last is None or not 0 < now_ms - last <= 2 * nominal:
            # First tick, a clock step backwards, or a stall: claim the nominal interval.
            return now_ms - nominal, nominal
        return last, now_ms - last

    def tick(self) -> NvmlSample:
        """Take one sample and hand it to the publisher."""
        started = self._clock.monotonic()
        now_ms = int(self._clock.time() * 1000)
        read = self._reader.read()
        allocations = self._allocations.list_allocations()
        ts_ms, interval_ms = self._interval(now_ms)
        sample = assemble_sample(
            node=self.node,
            ts_ms=ts_ms,
            interval_ms=interval_ms,
            seq=self._seq,
            read=read,
            resolve=self._resolver.resolve,
            allocations=allocations,
            sharing=self._sharing,
            cluster=self.cluster,
        )
        if self._work is not None:
            done = self._work()
            if done:
                sample = msgspec.structs.replace(sample, work=done)
        value = NVML_SAMPLES.encode(sample)
        self._publish(self._key, value)
        self._seq += 1
        stats = self.stats
        stats.ticks += 1
        stats.gpus = len(sample.gpus)
        stats.last_sample_bytes = len(value)
        stats.last_read_s = self._clock.monotonic() - started
        if read.errors or self._failing:
            stats.read_errors += len(read.errors)
            now_failing = frozenset(read.errors)
            # Once per spell: a lost GPU fails every tick, and the counter counts each.
            for error in sorted(now_failing - self._failing):
                log.warning("gpu read failed node=%s error=%r", self.node, error)
            for error in sorted(self._failing - now_failing):
                log.info("gpu read recovered node=%s error=%r", self.node, error)
            self._failing = now_failing
        return sample

    def run(self, stop: threading.Event) -> None:
        """Tick every `interval_s` on a fixed grid until `stop` is set."""
        next_at = self._clock.monotonic()
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # one bad tick (a driver hiccup) must not end sampling
                log.exception("tick failed node=%s seq=%d", self.node, self._seq)
            next_at += self.interval_s
            now = self._clock.monotonic()
            if now > next_at:
                # The tick overran its slot: keep the grid, skip to the next point ahead.
                missed = int((now - next_at) // self.interval_s) + 1
                self.stats.skipped_ticks += missed
                next_at += missed * self.interval_s
            stop.wait(next_at - now)
