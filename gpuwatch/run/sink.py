"""Wires `gpuwatch sink redis` and `gpuwatch sink metrics`: their consumers on kafka-python,
their /metrics, signals.

Each sink's consumer loop (sinks/redis/writer.py, sinks/prometheus/feed.py) runs in the
main thread; SIGTERM and SIGINT ask it to stop after the batch in hand. The Redis sink
serves its own counters (`SinkCollector`), the metrics sink the pod and GPU metrics and
its own counters (`FeedCollector`).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Final, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuwatch import kafka
from gpuwatch.run.memory import start_trimming, tune_collector
from gpuwatch.run.progress import StallCollector, stuck, tracked
from gpuwatch.run.worker import WorkerStartError, check_topics
from schemas.settings import Settings
from sinks.consumer import KafkaClient
from sinks.prometheus.feed import MetricsFeed
from sinks.prometheus.metrics import MetricsServeError, WorkerMetrics, serve
from sinks.redis.live_gpus import LiveGpus
from sinks.redis.sink import RedisSink
from sinks.redis.writer import RedisWriter
from streams.core.progress import Stalls

__all__ = [
    "KAFKA",
    "FeedCollector",
    "SinkCollector",
    "SinkStartError",
    "redis_writer",
    "run_metrics",
    "run_redis",
]

log = logging.getLogger(__name__)

KAFKA: Final = KafkaClient(
    consumer=kafka.consumer,
    error=kafka.KafkaError,
    commit_failed=kafka.CommitFailedError,
    rebalancing=kafka.RebalanceInProgressError,
)
"""The Redis writer's Kafka client: kafka-python's consumer and errors."""

PREFIX = "gpuwatch_sink_"


class SinkStartError(Exception):
    """The sink cannot start: Kafka away, the topics missing, its port taken."""


def redis_writer(
    settings: Settings, *, redis_sink: RedisSink | None = None, kafka_client: KafkaClient = KAFKA
) -> RedisWriter:
    """A Redis writer on kafka-python (`kafka_client`), with live GPU states of its own."""
    rules = settings.rules
    own = {name: rules.of(name).idle_util_pct for name in rules.clusters}
    live = LiveGpus(rules.idle_util_pct, by_cluster=own)
    return RedisWriter(settings, live, kafka=kafka_client, redis_sink=redis_sink)


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
        yield from _counters(PREFIX, counters)
        yield _by_reason(
            PREFIX + "redis_errors",
            "Redis attempts that failed, by reason (oom, misconf, readonly, connection...): "
            "the batch kept, not committed, and retried",
            w.redis.errors,
        )
        yield _by_reason(
            PREFIX + "redis_rewrites",
            "Times Redis was found to have lost writes, read again from the topics: lost "
            "(behind its stored positions), evicted (keys evicted: all written anew)",
            {"lost": 0, "evicted": 0, **w.rewrites},
        )
        if w.newest_sample_ms:
            lag = GaugeMetricFamily(
                PREFIX + "lag_seconds",
                "Wall time since the end of the newest node sample whose GPU states Redis took",
            )
            lag.add_metric([], max(0.0, self._wall() - w.newest_sample_ms / 1000))
            yield lag


class _Runner(Protocol):
    """A sink's consumer loop: `run` until `stopping()`; `error` is what ended it."""

    error: BaseException | None

    def run(self) -> None: ...
    def stopping(self) -> None: ...


def run_redis(settings: Settings) -> int:
    """Write Redis until SIGTERM or SIGINT; 0 when stopped, 1 when the writer failed."""
    _check(settings)
    stalls = Stalls(settings.sink.stall_limit_s)
    writer = redis_writer(settings, kafka_client=tracked(KAFKA, stalls))
    registry = CollectorRegistry()
    registry.register(SinkCollector(writer))
    registry.register(StallCollector(stalls, PREFIX, "Redis sink"))
    log.info(
        "redis sink starting group=%s prefix=%s redis=%s metrics=%s:%d",
        writer.group,
        settings.kafka.topic_prefix,
        writer.redis.target,
        settings.metrics.bind,
        settings.sink.metrics_port,
    )
    try:
        port = settings.sink.metrics_port
        code = _serve_while_running(writer, registry, port, settings, stuck(stalls, "Redis sink"))
    finally:
        writer.stop()
    log.info(
        "redis sink stopped written=%d rejected=%d invalid=%d samples=%d kafka_errors=%d",
        writer.written, writer.rejected, writer.invalid, writer.samples, writer.kafka_errors,
    )  # fmt: skip
    return code


def run_metrics(settings: Settings) -> int:
    """Serve the pod and GPU metrics until SIGTERM or SIGINT; 0 when stopped, 1 on a failure."""
    _check(settings)
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    stalls = Stalls(settings.sink.stall_limit_s)
    feed = MetricsFeed(settings, metrics, kafka=tracked(KAFKA, stalls))
    registry.register(FeedCollector(feed))
    registry.register(StallCollector(stalls, PREFIX, "metrics sink"))
    log.info(
        "metrics sink starting group=%s prefix=%s metrics=%s:%d",
        feed.group,
        settings.kafka.topic_prefix,
        settings.metrics.bind,
        settings.sink.exporter_port,
    )
    port = settings.sink.exporter_port
    code = _serve_while_running(feed, registry, port, settings, stuck(stalls, "metrics sink"))
    log.info(
        "metrics sink stopped records=%d invalid=%d kafka_errors=%d",
        feed.records, feed.invalid, feed.kafka_errors,
    )  # fmt: skip
    return code


class FeedCollector(Collector):
    """The metrics feed's own counters, read at scrape time."""

    def __init__(self, feed: MetricsFeed) -> None:
        self._feed = feed

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One family per counter."""
        f = self._feed
        counters = {
            "records": ("Records of the topics fed to the metrics", f.records),
            "invalid": ("Records that did not decode (skipped)", f.invalid),
            "kafka_errors": ("Polls Kafka refused (retried)", f.kafka_errors),
        }
        yield from _counters(PREFIX + "metrics_", counters)


def _counters(
    prefix: str, figures: Mapping[str, tuple[str, float]]
) -> Iterator[CounterMetricFamily]:
    """A counter family, without labels, per (documentation, value) named in `figures`."""
    for name, (doc, value) in figures.items():
        counter = CounterMetricFamily(prefix + name, doc)
        counter.add_metric([], value)
        yield counter


def _by_reason(name: str, doc: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter family labelled by `reason`, one sample per reason counted."""
    counter = CounterMetricFamily(name, doc, labels=["reason"])
    for reason, value in sorted(counts.items()):
        counter.add_metric([reason], value)
    return counter


def _check(settings: Settings) -> None:
    try:
        check_topics(settings)
    except WorkerStartError as exc:
        raise SinkStartError(str(exc)) from exc


def _serve_while_running(
    runner: _Runner,
    registry: CollectorRegistry,
    port: int,
    settings: Settings,
    unlive: Callable[[], str | None],
) -> int:
    """Serve /metrics and /livez (503 while `unlive()` gives a reason) and run `runner` in
    this thread until a signal stops it; the status."""
    try:
        server, _ = serve(port, settings.metrics.bind, registry, unlive)
    except MetricsServeError as exc:
        raise SinkStartError(str(exc)) from exc

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping signal=%s", signal.Signals(signum).name)
        runner.stopping()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop_trimming = start_trimming()
    restore_collector = tune_collector()
    try:
        runner.run()
    finally:
        stop_trimming()
        restore_collector()
        server.shutdown()
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if runner.error is not None else 0
