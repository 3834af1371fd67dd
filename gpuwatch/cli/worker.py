"""`gpuwatch worker`: the Faust stream processors."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from gpuwatch.cli.common import UserFacingError
from gpuwatch.cli.options import add_flag, add_float, add_int, add_verb
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `worker` verb."""
    worker = add_verb(
        verbs,
        "worker",
        _worker,
        "the Faust stream processors: samples and pod events to usage, windows, alerts",
        "Run the stream worker (a Faust app; the app id GPUWATCH_APP_ID is its "
        "consumer group, so replicas share the partitions). Node side: nvml.samples and "
        "k8s.nodes (keyed by node) to pod.usage, gpu.windows and alerts. Pod side: k8s.pods "
        "and pod.usage (keyed by pod uid) to pod.lifecycle, attribution and alerts. Bad "
        "input goes to the deadletter topic with the reason. State lives in changelog-backed "
        "tables and is restored from Kafka on a restart. The topics must exist with one "
        "partition count (`gpuwatch topics create`); the worker creates its internal tick "
        "topic. Every record it writes is confirmed by the broker before its state is "
        "stored and its inputs committed; one the broker does not take ends the worker with "
        "status 1 (counted in gpuwatch_delivery_failures_total), and a restart reads the inputs "
        "again. /livez answers 503 once an input partition's records wait with no progress "
        "past GPUWATCH_WORKER_STALL_LIMIT_S (300). SIGUSR1 logs every task's and thread's "
        "stack. SIGTERM commits and exits.",
    )
    add_float(
        worker,
        "--tick-interval",
        "seconds between stream-time ticks (GPUWATCH_WORKER_TICK_INTERVAL_S, 1.0)",
    )
    add_float(
        worker,
        "--session-timeout",
        "Kafka session timeout: a silent worker's partitions move after this long "
        "(GPUWATCH_WORKER_SESSION_TIMEOUT_S, 30)",
    )
    add_int(
        worker,
        "--metrics-port",
        "PORT",
        "port of the worker's /metrics and /livez (GPUWATCH_METRICS_PORT, 9480)",
        dest="worker_metrics_port",
    )
    add_flag(
        worker,
        "--no-sinks",
        "publish the derived topics only, no /metrics (GPUWATCH_WORKER_SINKS=false); "
        "Redis is written by `gpuwatch sink redis`",
    )
    worker.add_argument(
        "--instance", metavar="NAME", help="this worker's name in logs (default: host-pid)"
    )


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    import dataclasses

    from gpuwatch.run import worker
    from streams.faust.app import WorkerOptions

    if args.log_level == "WARNING":
        # A daemon says what it does; Faust's own INFO lines (tables, offsets) stay off.
        for name in ("gpuwatch", "streams"):
            logging.getLogger(name).setLevel(logging.INFO)
    options = WorkerOptions()
    if args.instance:
        options = dataclasses.replace(options, instance=args.instance)
    try:
        return worker.run(settings, options, loglevel=args.log_level)
    except worker.WorkerStartError as exc:
        raise UserFacingError(str(exc)) from exc
