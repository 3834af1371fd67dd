"""`gpuwatch topics`: create and list the Kafka topics."""

from __future__ import annotations

import argparse
from typing import Any

from gpuwatch.cli.common import UserFacingError
from gpuwatch.cli.options import add_actions, add_int, add_verb
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `topics` verb and its actions create and list."""
    topics = add_verb(
        verbs,
        "topics",
        None,
        "create the Kafka topics",
        "Manage the topics of docs/DESIGN.md §3, named with the topic prefix.",
    )
    actions = add_actions(topics)
    create = add_verb(
        actions,
        "create",
        _topics_create,
        "create every topic (idempotent)",
        "Create every gpuwatch topic with its retention and cleanup policy and "
        "one partition count for all, so the topics keyed by pod uid are co-partitioned. "
        "Existing topics are kept; an existing topic with another partition count is "
        "reported and the command exits 1 (co-partitioning would be broken).",
    )
    add_int(
        create,
        "--partitions",
        "N",
        "partitions per topic (env: GPUWATCH_KAFKA_PARTITIONS, default 12)",
    )
    add_int(
        create,
        "--replication-factor",
        "N",
        "replication factor (env: GPUWATCH_KAFKA_REPLICATION_FACTOR, default 1)",
    )
    add_verb(
        actions,
        "list",
        _topics_list,
        "show the gpuwatch topics and their partition counts",
        "Show every gpuwatch topic with the prefix, whether it exists and its "
        "partition count. Exits 1 when one is missing.",
    )


def _topics_create(args: argparse.Namespace, settings: Settings) -> int:
    return _report(settings, create=True)


def _topics_list(args: argparse.Namespace, settings: Settings) -> int:
    return _report(settings, create=False)


def _report(settings: Settings, *, create: bool) -> int:
    from gpuwatch import kafka as topics

    try:
        report = topics.create_topics(settings) if create else topics.describe_topics(settings)
    except topics.TopicAdminError as exc:
        raise UserFacingError(str(exc)) from exc
    print(topics.format_report(report))
    return 0 if all(row.ok for row in report) else 1
