"""The `gpuwatch` command: one console script, one verb per job (docs/DESIGN.md §6).

The top-level parser and options, the settings they override, and the dispatch to the
verb's handler. Each verb lives in its own module; its heavy imports stay in its handler
so that `gpuwatch --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuwatch import __version__
from gpuwatch.cli import (
    bench,
    demo,
    k8s_watcher,
    node_agent,
    replay,
    report,
    settings,
    simulate,
    sink,
    stack,
    top,
    topics,
    worker,
)
from gpuwatch.cli.common import Handler, UserFacingError
from gpuwatch.config import SettingsError, load_settings
from gpuwatch.run.lifetime import die_with_parent

EPILOG = """\
settings come from GPUWATCH_* environment variables and an optional YAML file
(--config or GPUWATCH_CONFIG); flags override both. `gpuwatch settings` prints the
settings in force. Quick start: `make demo`; tests: `make test`.
"""

# In the order `gpuwatch --help` lists them.
VERBS = (
    stack,
    topics,
    node_agent,
    k8s_watcher,
    worker,
    sink,
    simulate,
    bench,
    demo,
    top,
    replay,
    report,
    settings,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="gpuwatch",
        description="Real-time GPU observability and cost attribution for Kubernetes: "
        "per-pod GPU share, VRAM, lifecycle (queued, running, stalled, finished), "
        "idle/waste windows and cost, streamed through Kafka into Redis and Prometheus.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuwatch {__version__}")
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML settings file (env: GPUWATCH_CONFIG)"
    )
    parser.add_argument(
        "--kafka-bootstrap",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (env: GPUWATCH_KAFKA_BOOTSTRAP)",
    )
    parser.add_argument(
        "--topic-prefix", metavar="PREFIX", help="topic name prefix (env: GPUWATCH_TOPIC_PREFIX)"
    )
    parser.add_argument("--redis-url", metavar="URL", help="Redis URL (env: GPUWATCH_REDIS_URL)")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: WARNING)",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        verb.add_parser(verbs)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "kafka.bootstrap": args.kafka_bootstrap,
        "kafka.topic_prefix": args.topic_prefix,
        "redis.url": args.redis_url,
        "kafka.partitions": getattr(args, "partitions", None),
        "kafka.replication_factor": getattr(args, "replication_factor", None),
        "agent.interval_s": getattr(args, "interval", None),
        "worker.tick_interval_s": getattr(args, "tick_interval", None),
        "worker.session_timeout_s": getattr(args, "session_timeout", None),
        "worker.sinks": False if getattr(args, "no_sinks", False) else None,
        "metrics.port": getattr(args, "worker_metrics_port", None),
        "sink.metrics_port": getattr(args, "sink_metrics_port", None),
        "sink.exporter_port": getattr(args, "sink_exporter_port", None),
        "agent.node_name": getattr(args, "node", None),
        "agent.metrics_port": getattr(args, "metrics_port", None),
        "watcher.kubeconfig": getattr(args, "kubeconfig", None),
        "watcher.context": getattr(args, "context", None),
        "watcher.namespaces": _joined(getattr(args, "watch_namespaces", None)),
        "watcher.label_selector": getattr(args, "selector", None),
        "watcher.pod_label_allowlist": _joined(getattr(args, "pod_label", None)),
        "watcher.metrics_port": getattr(args, "watcher_metrics_port", None),
        **k8s_watcher.gpu_resource_overrides(getattr(args, "gpu_resource", None)),
    }
    return {key: value for key, value in pairs.items() if value is not None}


def _joined(values: list[str] | None) -> tuple[str, ...] | None:
    return tuple(values) if values else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    die_with_parent()  # a child of `gpuwatch demo` stops when the demo dies, however it dies
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    if args.log_level != "DEBUG":
        # kafka-python logs every connection at INFO; its warnings still show.
        logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.root.level))
    try:
        loaded = load_settings(config_file=args.config, overrides=_overrides(args))
    except SettingsError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 2
    handler: Handler = args.handler
    try:
        return handler(args, loaded)
    except KeyboardInterrupt:
        print("gpuwatch: interrupted", file=sys.stderr)
        return 130
    except UserFacingError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 1
