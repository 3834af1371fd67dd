"""The `gpuwatch` command: one console script, one verb per job (DESIGN.md §6)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuwatch import __version__
from gpuwatch.config import SettingsError, load_settings
from schemas.settings import Settings

log = logging.getLogger(__name__)

Handler = Callable[[argparse.Namespace, Settings], int]

EPILOG = """\
settings come from GPUWATCH_* environment variables and an optional YAML file
(--config or GPUWATCH_CONFIG); flags override both. `gpuwatch settings` prints the
settings in force. Quick start: `make demo`; tests: `make test`.
"""


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
    _add_stack(verbs)
    _add_topics(verbs)
    _add_settings(verbs)
    return parser


def _add_stack(verbs: Any) -> None:
    stack = verbs.add_parser(
        "stack",
        help="local Kafka (KRaft), Redis and Prometheus without Docker",
        description="Run the local stack as plain processes: Apache Kafka 4.x in KRaft mode "
        "(jars fetched from Maven Central on first use into the cache directory), "
        "redis-server and prometheus from the OS packages. Data, logs and pid files live "
        "in the state directory (GPUWATCH_STATE_DIR, default ~/.local/state/gpuwatch).",
    )
    actions = stack.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser(
        "up",
        help="start what is not running (idempotent)",
        description="Start Kafka on 127.0.0.1:9092, Redis on 6379 and Prometheus on 9090 "
        "(idempotent: each unless already running), and wait until each answers (Kafka: a metadata "
        "request; Redis: PING; Prometheus: /-/ready).",
    ).set_defaults(handler=_stack_up)
    actions.add_parser(
        "down",
        help="stop what `stack up` started",
        description="Stop the services this state directory started; services found "
        "running but started by someone else are left alone. Data and logs are kept.",
    ).set_defaults(handler=_stack_down)
    actions.add_parser(
        "status",
        help="show each service; exit 1 if one is down",
        description="Show each service with its state, port, pid and log file. Exits 1 "
        "when any service is down.",
    ).set_defaults(handler=_stack_status)


def _add_topics(verbs: Any) -> None:
    topics = verbs.add_parser(
        "topics",
        help="create the Kafka topics",
        description="Manage the topics of DESIGN.md §3, named with the topic prefix.",
    )
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        help="create every topic (idempotent)",
        description="Create every gpuwatch topic with its retention and cleanup policy and "
        "one partition count for all, so the topics keyed by pod uid are co-partitioned. "
        "Existing topics are kept; an existing topic with another partition count is "
        "reported and the command exits 1 (co-partitioning would be broken).",
    )
    create.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help="partitions per topic (env: GPUWATCH_KAFKA_PARTITIONS, default 12)",
    )
    create.add_argument(
        "--replication-factor",
        type=int,
        metavar="N",
        help="replication factor (env: GPUWATCH_KAFKA_REPLICATION_FACTOR, default 1)",
    )
    create.set_defaults(handler=_topics_create)
    actions.add_parser(
        "list",
        help="show the gpuwatch topics and their partition counts",
        description="Show every gpuwatch topic with the prefix, whether it exists and its "
        "partition count. Exits 1 when one is missing.",
    ).set_defaults(handler=_topics_list)


def _add_settings(verbs: Any) -> None:
    verbs.add_parser(
        "settings",
        help="print the settings in force (secrets masked)",
        description="Print the effective settings as YAML after defaults, the settings "
        "file, GPUWATCH_* variables and flags are applied. Secrets are masked.",
    ).set_defaults(handler=_settings_show)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "kafka.bootstrap": args.kafka_bootstrap,
        "kafka.topic_prefix": args.topic_prefix,
        "redis.url": args.redis_url,
        "kafka.partitions": getattr(args, "partitions", None),
        "kafka.replication_factor": getattr(args, "replication_factor", None),
    }
    return {key: value for key, value in pairs.items() if value is not None}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
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
        settings = load_settings(config_file=args.config, overrides=_overrides(args))
    except SettingsError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 2
    handler: Handler = args.handler
    try:
        return handler(args, settings)
    except KeyboardInterrupt:
        print("gpuwatch: interrupted", file=sys.stderr)
        return 130
    except UserFacingError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 1


class UserFacingError(Exception):
    """An error whose message is all the user needs; printed without a traceback."""


def _progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def _stack_up(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.stack import manager

    try:
        statuses = manager.up(settings, _progress)
    except manager.StackError as exc:
        raise UserFacingError(str(exc)) from exc
    print(manager.format_table(statuses))
    return 0


def _stack_down(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.stack import manager

    try:
        statuses = manager.down(settings, _progress)
    except manager.StackError as exc:
        raise UserFacingError(str(exc)) from exc
    print(manager.format_table(statuses))
    return 0


def _stack_status(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.stack import manager

    statuses = manager.status(settings)
    print(manager.format_table(statuses))
    return 0 if all(s.state in ("up", "external") for s in statuses) else 1


def _topics_create(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch import topics

    try:
        report = topics.create_topics(settings)
    except topics.TopicAdminError as exc:
        raise UserFacingError(str(exc)) from exc
    print(topics.format_report(report))
    return 0 if all(row.ok for row in report) else 1


def _topics_list(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch import topics

    try:
        report = topics.describe_topics(settings)
    except topics.TopicAdminError as exc:
        raise UserFacingError(str(exc)) from exc
    print(topics.format_report(report))
    return 0 if all(row.ok for row in report) else 1


def _settings_show(args: argparse.Namespace, settings: Settings) -> int:
    import yaml

    data = settings.model_dump(mode="json")
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
