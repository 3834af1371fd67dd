"""A stalled worker or sink made visible: its stall gauges, its /livez, a sink's positions.

A process whose processing stopped still answers /metrics, and its lag gauge (set when a
record is processed) freezes: nothing looked wrong. Each process keeps a `Stalls`
(streams/core/progress.py) of the partitions it holds, exports it as
`<prefix>stalled_seconds{topic,partition}` with its limit as `<prefix>stall_limit_seconds`
(the rules GpuwatchWorkerStalled and GpuwatchSinkStalled compare the two), and /livez
answers 503 while a partition is stalled past the limit, so Kubernetes restarts it.

The worker reads its positions and ends from a timer of its own (streams/faust/progress.py).
A sink's consumer loop runs kafka-python in one thread and is not ours to change: its
consumer is wrapped (`TrackedConsumer`) so that each poll, which comes once the records of
the last one are written, records the positions reached, and, every few seconds, the ends.
A sink stuck inside a write polls no more: its last reading stands and its stall grows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from schemas.settings import KafkaSettings
from sinks.consumer import Consumer, KafkaClient
from streams.core.progress import Stalls

__all__ = ["ENDS_EVERY_S", "StallCollector", "TrackedConsumer", "stuck", "tracked"]

log = logging.getLogger(__name__)

ENDS_EVERY_S = 2.0  # a sink's end offsets at most this often: stall limits are minutes


class StallCollector(Collector):
    """`<prefix>stalled_seconds{topic,partition}` and `<prefix>stall_limit_seconds`."""

    def __init__(self, stalls: Stalls, prefix: str, what: str) -> None:
        self._stalls = stalls
        self._prefix = prefix
        self._what = what

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The stall of each partition held (0 while nothing waits) and the limit."""
        stalled = GaugeMetricFamily(
            self._prefix + "stalled_seconds",
            f"Seconds records have waited in the partition while the {self._what} made no "
            "progress on it (0 while none wait)",
            labels=["topic", "partition"],
        )
        for (topic, partition), seconds in sorted(self._stalls.stalled().items()):
            stalled.add_metric([topic, str(partition)], seconds)
        yield stalled
        yield GaugeMetricFamily(
            self._prefix + "stall_limit_seconds",
            f"A stall past this makes the {self._what} not live (/livez answers 503)",
            value=self._stalls.limit_s,
        )


def stuck(stalls: Stalls, what: str) -> Callable[[], str | None]:
    """What /livez asks: a reason while a partition is stalled past the limit, else None."""

    def reason() -> str | None:
        over = stalls.stuck()
        if not over:
            return None
        listed = " ".join(f"{t}:{p}={s:.0f}s" for (t, p), s in over[:10])
        return f"{what} stalled past {stalls.limit_s:g} s: {listed}"

    return reason


class TrackedConsumer:
    """A sink's kafka-python consumer that tells `stalls` its positions at each poll."""

    def __init__(
        self,
        consumer: Consumer,
        stalls: Stalls,
        clock: Callable[[], float] = time.monotonic,
        ends_every_s: float = ENDS_EVERY_S,
    ) -> None:
        self._consumer = consumer
        self._stalls = stalls
        self._clock = clock
        self._ends_every_s = ends_every_s
        self._ends_read = float("-inf")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def poll(self, timeout_ms: int) -> Any:
        """The records of one poll; first, the positions the records before reached."""
        self._observe()
        return self._consumer.poll(timeout_ms)

    def _observe(self) -> None:
        consumer, stalls = self._consumer, self._stalls
        assigned = list(consumer.assignment())
        stalls.hold((tp.topic, tp.partition) for tp in assigned)
        if not assigned:
            return
        # The positions before the ends: a record past a position read is waiting.
        stalls.positions({(tp.topic, tp.partition): self._done(tp) for tp in assigned})
        now = self._clock()
        if now - self._ends_read >= self._ends_every_s:
            self._ends_read = now
            ends = consumer.end_offsets(assigned)
            stalls.ends({(tp.topic, tp.partition): int(end) for tp, end in ends.items()})

    def _done(self, tp: Any) -> int | None:
        """The offset up to which `tp`'s records are taken in, if this poll tells.

        A paused partition is one whose batch the sink holds unwritten (Redis away), its
        position past it: it tells nothing. A partition seen for the first time starts at
        the group's commit (the records before it were written), or, never committed, its
        position, or its log start while its first batch is held.
        """
        paused = tp in self._consumer.paused()
        if self._stalls.positioned((tp.topic, tp.partition)):
            return None if paused else self._consumer.position(tp)
        committed = self._consumer.committed(tp)
        if committed is not None:
            return committed
        if paused:  # never committed, nothing written yet
            return int(self._consumer.beginning_offsets([tp])[tp])
        return self._consumer.position(tp)


def tracked(client: KafkaClient, stalls: Stalls) -> KafkaClient:
    """`client` whose consumers are `TrackedConsumer`s feeding `stalls`."""
    make = client.consumer

    def consumer(kafka: KafkaSettings, /, **options: Any) -> Consumer:
        return TrackedConsumer(make(kafka, **options), stalls)

    return replace(client, consumer=consumer)
