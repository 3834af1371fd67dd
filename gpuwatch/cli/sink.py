"""`gpuwatch sink redis`: the Redis sink as a process of its own."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from gpuwatch.cli.common import UserFacingError
from gpuwatch.cli.options import add_actions, add_int, add_verb
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `sink` verb and its `redis` action."""
    sink = add_verb(
        verbs,
        "sink",
        None,
        "the sinks as processes of their own: `sink redis`, `sink metrics`",
        "Run a sink apart from the stream workers, so that a worker does stream "
        "processing only and keeps running without the sink's store.",
    )
    actions = add_actions(sink)
    redis = add_verb(
        actions,
        "redis",
        _redis,
        "the derived topics and live GPU state into Redis",
        "Read the derived topics (pod.lifecycle, attribution, gpu.windows, alerts) and the "
        "node samples (the live state of each GPU) in a consumer group of its own "
        "(GPUWATCH_APP_ID + `.redis`, so replicas share the partitions) and write them into "
        "Redis (GPUWATCH_REDIS_URL, the keys of docs/DESIGN.md §5), each batch one transaction, "
        "offsets committed after Redis took it. While Redis is away, full (OOM), read-only "
        "or failing its snapshots (MISCONF) it keeps the batch and retries, counting each "
        "refusal by reason; when Redis comes back emptied or older, or evicted keys, it "
        "rewrites from the topics. A new group starts the derived topics at their beginning "
        "and the samples 5 minutes back. Its own /metrics and /livez (503 once records wait "
        "with no progress past GPUWATCH_SINK_STALL_LIMIT_S, 300) on --metrics-port "
        "(GPUWATCH_SINK_METRICS_PORT, 9483). SIGTERM finishes the batch in hand and exits.",
    )
    add_int(
        redis,
        "--metrics-port",
        "PORT",
        "port of the sink's /metrics (GPUWATCH_SINK_METRICS_PORT, 9483)",
        dest="sink_metrics_port",
    )

    metrics = add_verb(
        actions,
        "metrics",
        _metrics,
        "the pod and GPU metrics for Prometheus, from the topics",
        "Read pod.lifecycle, attribution, gpu.windows, pod.usage and the node samples in a "
        "consumer group of its own (GPUWATCH_APP_ID + `.metrics`, so replicas share the "
        "partitions) and serve the pod and GPU metrics of docs/DESIGN.md §5 (share, VRAM, state, "
        "utilization, allocation, idle seconds, cost and waste, unallocated access) on "
        "--port (GPUWATCH_SINK_EXPORTER_PORT, 9484). The worker serves the pipeline's own "
        "metrics and the stream's firing alerts. A partition that comes to it is read from "
        "the start of pod.lifecycle (every live pod's state) and 5 minutes back in the "
        "other topics. SIGTERM exits.",
    )
    add_int(
        metrics,
        "--port",
        "PORT",
        "port of the pod and GPU metrics (GPUWATCH_SINK_EXPORTER_PORT, 9484)",
        dest="sink_exporter_port",
    )


def _metrics(args: argparse.Namespace, settings: Settings) -> int:
    return _run(args, settings, "metrics")


def _redis(args: argparse.Namespace, settings: Settings) -> int:
    return _run(args, settings, "redis")


def _run(args: argparse.Namespace, settings: Settings, which: str) -> int:
    from gpuwatch.run import sink

    if args.log_level == "WARNING":
        # A daemon says what it does; kafka-python stays at WARNING.
        for name in ("gpuwatch", "sinks"):
            logging.getLogger(name).setLevel(logging.INFO)
    run = sink.run_metrics if which == "metrics" else sink.run_redis
    try:
        return run(settings)
    except sink.SinkStartError as exc:
        raise UserFacingError(str(exc)) from exc
