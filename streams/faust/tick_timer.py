"""The tick timer: each interval, one tick to each partition, carrying watermarks and end offsets.

Order matters. The timer takes the node side's claims (stream time, idle) first, then
hands every record made so far to the client and flushes it (so the pod usage those stream
times promise is in Kafka), then reads the inputs' end offsets, then sends: a tick is
applied only once its partition's inputs are processed up to those offsets
(`streams.core.ticks.Progress`).

End offsets come from a consumer of our own without a group: Faust's consumer shares its
connection with the long-polling fetch and answers only when that returns (about a second).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from schemas.settings import KafkaSettings, Settings
from schemas.topics import NVML_SAMPLES
from streams.core.ticks import Tick, claims_of, encode_tick
from streams.faust.clients import TopicPartition, aiokafka_consumer
from streams.runtime.agent_loop import AgentLoop

__all__ = ["OffsetProbe", "TickSender", "fleet_topic_name", "tick_topic_name"]

log = logging.getLogger(__name__)

OFFSETS_TIMEOUT_S = 10.0  # a healthy broker answers in milliseconds; the next tick retries


def tick_topic_name(settings: Settings) -> str:
    """The worker's internal tick topic (one per app id, so two apps never mix ticks)."""
    return f"{settings.kafka.topic_prefix}{settings.kafka.app_id}.ticks"


def fleet_topic_name(settings: Settings) -> str:
    """The worker's internal fleet topic (`streams.processors.fleet`), one per app id."""
    return f"{settings.kafka.topic_prefix}{settings.kafka.app_id}.fleet"


class OffsetProbe:
    """Beginning and end offsets of topic partitions, through a client of its own."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka
        self._consumer: Any = None
        self._starting = asyncio.Lock()
        self.starts: dict[tuple[str, int], int] = {}
        """The log start offsets learnt so far (each call refreshes those it asks for)."""

    async def offsets(
        self, tps: list[tuple[str, int]]
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """(ends, starts) by (topic, partition)."""
        consumer = await self._client()
        wanted = [TopicPartition(topic, partition) for topic, partition in tps]
        # aiokafka waits for ever on a partition that does not exist (a topic deleted).
        ends = await asyncio.wait_for(consumer.end_offsets(wanted), OFFSETS_TIMEOUT_S)
        starts = await self._starts(consumer, wanted)
        return {(tp.topic, tp.partition): int(o) for tp, o in ends.items()}, starts

    async def load_starts(self, tps: list[tuple[str, int]]) -> None:
        """Learn the log start offsets of `tps` now (`starts` holds them afterwards)."""
        await self._starts(
            await self._client(), [TopicPartition(topic, partition) for topic, partition in tps]
        )

    async def _starts(
        self, consumer: Any, wanted: list[TopicPartition]
    ) -> dict[tuple[str, int], int]:
        starts = await asyncio.wait_for(consumer.beginning_offsets(wanted), OFFSETS_TIMEOUT_S)
        found = {(tp.topic, tp.partition): int(o) for tp, o in starts.items()}
        self.starts.update(found)
        return found

    async def _client(self) -> Any:
        async with self._starting:  # the tick timer and both agent loops share one client
            if self._consumer is None:
                consumer = aiokafka_consumer(self._kafka, enable_auto_commit=False)
                await consumer.start()
                self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        """Release the connection."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


class TickSender:
    """What `app.timer` runs: the ticks of this worker for one interval."""

    def __init__(
        self,
        *,
        app: Any,
        settings: Settings,
        instance: str,
        node_loop: AgentLoop,
        probe: OffsetProbe,
        send: Callable[[int, bytes], None],
        flush: Callable[[], Awaitable[None]],
        inputs: Iterable[str],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self._wall = wall
        self.partitions = settings.kafka.partitions
        self.instance = instance
        self.node_loop = node_loop
        self._flush = flush
        self.probe = probe
        self.inputs = tuple(inputs)
        self.sent = 0
        self._send = send
        self._samples = NVML_SAMPLES.full_name(settings.kafka.topic_prefix)

    def owned(self) -> set[int]:
        """Partitions of the data topics this worker holds now."""
        actives = self.app.assignor.assigned_actives()
        return {tp.partition for tp in actives if tp.topic == self._samples}

    async def tick(self) -> None:
        """Send this interval's ticks; an error is logged and the next interval tries again."""
        try:
            await self._tick()
        except Exception:
            log.exception("sending ticks failed instance=%s", self.instance)

    async def _tick(self) -> None:
        owned = self.owned()
        claims, idle = claims_of(self.node_loop.partitions, owned)
        targets = set(range(self.partitions)) if claims else set()
        if not targets and not owned:
            return
        # Every record made so far, to the broker: the usage the claims promise included.
        await self._flush()
        tps = [(topic, q) for topic in self.inputs for q in range(self.partitions)]
        # The wall clock before the end offsets: what was in Kafka then is within them.
        now_ms = int(self._wall() * 1000)
        ends, starts = await self.probe.offsets(tps)
        # Owned partitions get a tick even before any claim: it loads their state.
        for q in sorted(targets | owned):
            tick = Tick(
                sender=self.instance,
                claims=claims,
                idle=idle,
                ends={topic: ends[(topic, q)] for topic in self.inputs},
                starts={topic: starts[(topic, q)] for topic in self.inputs},
                now=now_ms,
            )
            self._send(q, encode_tick(tick))
            self.sent += 1
