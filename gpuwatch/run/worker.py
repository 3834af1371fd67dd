"""`gpuwatch worker`: checks the topics, creates the internal tick and fleet topics and runs
the Faust app."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from gpuwatch.kafka import (
    ADMIN_TIMEOUT_MS,
    KafkaError,
    TopicAdminError,
    admin,
    describe_topics,
    ensure_topic,
    new_topic,
)
from gpuwatch.run.memory import start_trimming, tune_collector
from schemas.settings import Settings
from streams.faust.app import WorkerOptions, WorkerRuntime, build, changelog_topic_names
from streams.faust.process import new_worker, run_worker
from streams.faust.tick_timer import fleet_topic_name, tick_topic_name

__all__ = ["TICK_RETENTION_MS", "WorkerStartError", "ensure_tick_topic", "run"]

log = logging.getLogger(__name__)

# Ticks matter for seconds; an hour covers a worker restart that replays the last commit.
TICK_RETENTION_MS = 3_600_000
# Fleet inputs wait for seconds, but a restart reads them again from the oldest one the
# stored state did not hold, which a pod partition that stopped marking keeps back: a week,
# as the input topics keep their history.
FLEET_RETENTION_MS = 7 * 86_400_000
STOP_TIMEOUT_S = 25.0  # a clean stop takes seconds; Kubernetes kills after 30 s
EXIT_STUCK = 3  # exit status when the stop had to be forced


class WorkerStartError(Exception):
    """The worker cannot start: Kafka away, or the topics missing or wrongly partitioned."""


def check_topics(settings: Settings) -> None:
    """Every public topic exists with the partition count of the settings."""
    try:
        rows = describe_topics(settings)
    except TopicAdminError as exc:
        raise WorkerStartError(f"{exc}; is the stack up (`gpuwatch stack up`)?") from exc
    want = settings.kafka.partitions
    bad = [row for row in rows if row.partitions != want]
    if bad:
        listed = ", ".join(f"{row.name} ({row.partitions or 'missing'})" for row in bad)
        raise WorkerStartError(
            f"topics missing or not {want} partitions: {listed}; "
            "run `gpuwatch topics create` with the worker's settings"
        )


def ensure_tick_topic(settings: Settings) -> str:
    """Create the internal tick and fleet topics and the state tables' changelogs unless
    they exist; their partition counts must match the inputs'. The tick topic's name.

    Faust declares the changelogs too, but may do so after its consumer joined the group:
    a partition assigned before its changelog exists (Faust's assignor "Ignoring missing
    topic") can leave the first state write waiting for the topic's metadata, with both
    agents' record batches behind it. One worker of a test run logged that and made no
    progress for four minutes."""
    kafka = settings.kafka
    try:
        client = admin(
            kafka, client_id="gpuwatch-worker-admin", request_timeout_ms=ADMIN_TIMEOUT_MS
        )
    except KafkaError as exc:
        raise WorkerStartError(f"cannot reach Kafka at {kafka.bootstrap}: {exc!r}") from exc
    try:
        internal = [
            (name, {"cleanup.policy": "delete", "retention.ms": str(retention_ms)})
            for name, retention_ms in (
                (tick_topic_name(settings), TICK_RETENTION_MS),
                (fleet_topic_name(settings), FLEET_RETENTION_MS),
            )
        ]
        # Compacted, as streams/faust/app.py declares them.
        internal += [
            (name, {"cleanup.policy": "compact"}) for name in changelog_topic_names(settings)
        ]
        for name, configs in internal:
            try:
                partitions = ensure_topic(client, new_topic(kafka, name, configs))
            except KafkaError as exc:
                raise WorkerStartError(f"Kafka refused the internal topic {name}: {exc!r}") from exc
            if partitions != kafka.partitions:
                raise WorkerStartError(
                    f"{name} has {partitions} partitions, the inputs have {kafka.partitions}: "
                    "delete it, the worker recreates it"
                )
    finally:
        client.close()
    return tick_topic_name(settings)


def run(settings: Settings, options: WorkerOptions | None = None, loglevel: str = "WARNING") -> int:
    """Run the worker until SIGTERM or SIGINT; the exit status."""
    check_topics(settings)
    ensure_tick_topic(settings)
    options = options or WorkerOptions()
    stop_trimming = start_trimming()
    restore_collector = tune_collector()
    try:
        if options.datadir is None:
            # Faust wants a data directory even when every table lives in memory.
            with tempfile.TemporaryDirectory(prefix="gpuwatch-worker-") as datadir:
                options = dataclasses.replace(options, datadir=Path(datadir))
                return _run(settings, options, loglevel)
        return _run(settings, options, loglevel)
    finally:
        stop_trimming()
        restore_collector()


def _run(settings: Settings, options: WorkerOptions, loglevel: str) -> int:
    from gpuwatch.run.progress import StallCollector, stuck
    from gpuwatch.run.worker_sinks import WorkerSinks
    from sinks.prometheus.metrics import MetricsServeError, serve
    from streams.core.progress import Stalls
    from streams.processors.outputs import Counters

    counters = Counters()
    if not settings.worker.sinks:
        return _execute(build(settings, options, None, counters), settings, loglevel)
    sinks = WorkerSinks(settings, counters)
    # The stall of each partition held: /metrics shows it, /livez fails past the limit.
    stalls = Stalls(settings.worker.stall_limit_s)
    sinks.registry.register(StallCollector(stalls, "gpuwatch_worker_", "worker"))
    try:
        server, _ = serve(
            settings.metrics.port, settings.metrics.bind, sinks.registry, stuck(stalls, "worker")
        )
    except MetricsServeError as exc:
        raise WorkerStartError(str(exc)) from exc
    try:
        runtime = build(settings, options, sinks, counters, stalls)
        return _execute(runtime, settings, loglevel, metrics=True)
    finally:
        server.shutdown()
        server.server_close()


def _execute(
    runtime: WorkerRuntime,
    settings: Settings,
    loglevel: str,
    *,
    metrics: bool = False,
) -> int:
    worker = new_worker(runtime.app, loglevel, wrap_stop=_bounded)
    log.info(
        "worker starting app_id=%s prefix=%s partitions=%d metrics=%s",
        settings.kafka.app_id,
        settings.kafka.topic_prefix,
        settings.kafka.partitions,
        f"{settings.metrics.bind}:{settings.metrics.port}" if metrics else "off",
    )
    code = run_worker(worker)
    log.info("worker stopped %s", summary(runtime))
    return code


def _bounded(stop: Callable[[], None]) -> Callable[[], None]:
    """A signal handler that stops the worker, and ends the process if stopping hangs.

    aiokafka can hang for ever in a consumer group's heartbeat loop when a rebalance starts
    while the worker stops (every replica of a rollout stops at once). Ending the process
    then is as safe as a crash: outputs are acknowledged before the state that made them is
    stored, and inputs after the last commit are processed again.
    """

    def on_signal() -> None:
        timer = threading.Timer(STOP_TIMEOUT_S, _force_exit)
        timer.daemon = True
        timer.start()
        stop()

    return on_signal


def _force_exit() -> None:
    log.error("worker did not stop within %.0f s; exiting", STOP_TIMEOUT_S)
    logging.shutdown()
    os._exit(EXIT_STUCK)


def summary(runtime: WorkerRuntime) -> str:
    """The counters as key=value fields."""
    c = runtime.counters
    return (
        f"events={c.events} deadletter={c.deadletter} late={c.late} "
        f"duplicates={c.duplicates} ticks={c.ticks} ticks_sent={runtime.ticks.sent}"
    )
