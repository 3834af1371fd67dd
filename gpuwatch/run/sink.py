"""Wires `gpuwatch sink redis`: the Redis writer on kafka-python, its /metrics, signals.

The writer (sinks/redis/writer.py) runs in the main thread; SIGTERM and SIGINT ask it to
stop after the batch in hand. Its counters are read at scrape time (`SinkCollector`).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuwatch import kafka
from gpuwatch.run.memory import start_trimming
from gpuwatch.run.worker import WorkerStartError, check_topics
from schemas.settings import Settings
from sinks.prometheus.metrics import MetricsServeError, serve
from sinks.redis.live_gpus import LiveGpus
from sinks.redis.sink import RedisSink
from sinks.redis.writer import KafkaClient, RedisWriter

__all__ = ["KAFKA", "SinkCollector", "SinkStartError", "redis_writer", "run_redis"]

log = logging.getLogger(__name__)

KAFKA: Final = KafkaClient(
    consumer=kafka.consumer, error=kafka.KafkaError, commit_failed=kafka.CommitFailedError
)
"""The Redis writer's Kafka client: kafka-python's consumer and errors."""

PREFIX = "gpuwatch_sink_"


class SinkStartError(Exception):
    """The sink cannot start: Kafka away, the topics missing, its port taken."""


def redis_writer(settings: Settings, *, redis_sink: RedisSink | None = None) -> RedisWriter:
    """A Redis writer on kafka-python, with live GPU states of its own."""
    live = LiveGpus(settings.rules.idle_util_pct)
    return RedisWriter(settings, live, kafka=KAFKA, redis_sink=redis_sink)


class SinkCollector(Collector):
    """The writer's counters and lag, read at scrape time."""

    def __init__(self, writer: RedisWriter, wall: Callable[[], float] = time.time) -> None:
        self._writer = writer
        self._wall = wall

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """One family per figure."""
        w = self._writer
        counters = {
            "written": ("Records and live GPU states Redis took", w.written),
            "rejected": ("Records Redis refused for good (logged)", w.rejected),
            "invalid": ("Derived records that did not decode (logged)", w.invalid),
            "samples": ("Node samples taken in for the live GPU states", w.samples),
            "samples_invalid": ("Node samples that did not decode", w.samples_invalid),
            "kafka_errors": ("Polls and commits Kafka refused (retried)", w.kafka_errors),
        }
        for name, (doc, value) in counters.items():
            counter = CounterMetricFamily(PREFIX + name, doc)
            counter.add_metric([], value)
            yield counter
        if w.newest_sample_ms:
            lag = GaugeMetricFamily(
                PREFIX + "lag_seconds",
                "Wall time since the end of the newest node sample whose GPU states Redis took",
            )
            lag.add_metric([], max(0.0, self._wall() - w.newest_sample_ms / 1000))
            yield lag


def run_redis(settings: Settings) -> int:
    """Write Redis until SIGTERM or SIGINT; 0 when stopped, 1 when the writer failed."""
    try:
        check_topics(settings)
    except WorkerStartError as exc:
        raise SinkStartError(str(exc)) from exc
    writer = redis_writer(settings)
    registry = CollectorRegistry()
    registry.register(SinkCollector(writer))
    try:
        server, _ = serve(settings.sink.metrics_port, settings.metrics.bind, registry)
    except MetricsServeError as exc:
        raise SinkStartError(str(exc)) from exc

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping signal=%s", signal.Signals(signum).name)
        writer.stopping()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop_trimming = start_trimming()
    log.info(
        "redis sink starting group=%s prefix=%s redis=%s metrics=%s:%d",
        writer.group,
        settings.kafka.topic_prefix,
        writer.redis.target,
        settings.metrics.bind,
        settings.sink.metrics_port,
    )
    try:
        writer.run()
    finally:
        stop_trimming()
        writer.stop()
        server.shutdown()
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info(
        "redis sink stopped written=%d rejected=%d invalid=%d samples=%d kafka_errors=%d",
        writer.written, writer.rejected, writer.invalid, writer.samples, writer.kafka_errors,
    )  # fmt: skip
    return 1 if writer.error is not None else 0
