"""Kafka for every kafka-python client of gpuwatch: the client factory and the topic admin.

`producer`, `consumer` and `admin` build clients from the Kafka settings (servers, SASL
and TLS come from `KafkaSettings.client_options`, the one place that reads them); the
types and errors the callers need are re-exported here, so that kafka-python is imported
by this module and the node side's sender (`producers.base.kafka`) alone. The rest creates
and checks topics: those of docs/DESIGN.md §3 together, another (the worker's internal tick
topic) on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import (
    CommitFailedError,
    KafkaError,
    KafkaTimeoutError,
    RebalanceInProgressError,
    TopicAlreadyExistsError,
)
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from schemas import ALL_TOPICS, POD_KEYED, TopicSpec
from schemas.settings import KafkaSettings, Settings

__all__ = [
    "CommitFailedError",
    "KafkaAdminClient",
    "KafkaConsumer",
    "KafkaError",
    "KafkaProducer",
    "KafkaTimeoutError",
    "OffsetAndMetadata",
    "RebalanceInProgressError",
    "TopicAdminError",
    "TopicPartition",
    "admin",
    "consumer",
    "create_topic",
    "create_topics",
    "delete_topics",
    "describe_topics",
    "ensure_topic",
    "new_topic",
    "producer",
]

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_MS = 15_000  # a healthy broker answers in milliseconds; a cold one in seconds

Outcome = Literal["created", "exists", "missing", "partition-mismatch"]


class TopicAdminError(Exception):
    """The broker could not be reached or refused an admin request."""


@dataclass(frozen=True)
class TopicRow:
    """What became of one topic."""

    name: str
    outcome: Outcome
    partitions: int | None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """True when the topic exists with the partition count it should have."""
        return self.outcome in ("created", "exists")


def producer(kafka: KafkaSettings, /, **options: Any) -> KafkaProducer:
    """A kafka-python producer on the cluster of `kafka`; `options` add or override."""
    return KafkaProducer(**(kafka.client_options() | options))


def consumer(kafka: KafkaSettings, /, *topics: str, **options: Any) -> KafkaConsumer:
    """A kafka-python consumer (subscribed to `topics` when given); `options` add or override."""
    return KafkaConsumer(*topics, **(kafka.client_options() | options))


def admin(kafka: KafkaSettings, /, **options: Any) -> KafkaAdminClient:
    """A kafka-python admin client; `options` add or override."""
    return KafkaAdminClient(**(kafka.client_options() | options))


def new_topic(kafka: KafkaSettings, name: str, configs: dict[str, str]) -> NewTopic:
    """A topic with the partition count and replication factor of the settings."""
    return NewTopic(
        name=name,
        num_partitions=kafka.partitions,
        replication_factor=kafka.replication_factor,
        topic_configs=configs,
    )


def create_topic(client: KafkaAdminClient, topic: NewTopic) -> bool:
    """Create one topic; False when it exists already.

    One request per topic, so a topic created meanwhile by another process (a second
    worker starting) does not fail the others.
    """
    try:
        client.create_topics([topic], timeout_ms=ADMIN_TIMEOUT_MS, wait_for_metadata=True)
    except TopicAlreadyExistsError:
        return False
    log.info("topic created topic=%s partitions=%d", topic.name, topic.num_partitions)
    return True


SETTLE_S = 10.0  # how long a topic just created elsewhere may show no partitions


def ensure_topic(client: KafkaAdminClient, topic: NewTopic) -> int:
    """Create the topic unless it exists; the partition count it has.

    A topic another process has just created (two workers starting together) can be
    described with no partitions for a moment, until the broker has them all in its
    metadata: asked again until it has some, for SETTLE_S at most."""
    create_topic(client, topic)

    def partitions() -> int:
        described = client.describe_topics([topic.name])
        return len(described[0]["partitions"])

    settled = Retrying(
        retry=retry_if_result(lambda count: count == 0),
        stop=stop_after_delay(SETTLE_S),
        wait=wait_fixed(0.1),
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else 0,
    )
    count: int = settled(partitions)
    return count


def topic_configs(spec: TopicSpec[Any]) -> dict[str, str]:
    """Broker-side configs of one topic: cleanup policy and retention."""
    configs = {"cleanup.policy": "compact,delete" if spec.compacted else "delete"}
    if spec.retention_ms is not None:
        configs["retention.ms"] = str(spec.retention_ms)
    return configs


@contextmanager
def _admin(settings: Settings) -> Iterator[KafkaAdminClient]:
    try:
        client = admin(
            settings.kafka, client_id="gpuwatch-admin", request_timeout_ms=ADMIN_TIMEOUT_MS
        )
    except KafkaError as exc:
        raise TopicAdminError(
            f"cannot reach Kafka at {settings.kafka.bootstrap}: {exc!r}; "
            "is the stack up (`gpuwatch stack up`)?"
        ) from exc
    try:
        yield client
    finally:
        client.close()


def _existing(admin: KafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition counts of those of `names` that exist."""
    present = set(admin.list_topics()) & set(names)
    if not present:
        return {}
    described = admin.describe_topics(sorted(present))
    # kafka-python 3 names the topic `name` (2.x: `topic`).
    return {item.get("name", item.get("topic")): len(item["partitions"]) for item in described}


def create_topics(settings: Settings) -> list[TopicRow]:
    """Create every missing topic; report those that exist with another partition count."""
    prefix = settings.kafka.topic_prefix
    want = settings.kafka.partitions
    names = [spec.full_name(prefix) for spec in ALL_TOPICS]
    try:
        with _admin(settings) as admin:
            existing = _existing(admin, names)
            new = [
                new_topic(settings.kafka, spec.full_name(prefix), topic_configs(spec))
                for spec in ALL_TOPICS
                if spec.full_name(prefix) not in existing
            ]
            created = {topic.name for topic in new if create_topic(admin, topic)}
            if len(created) < len(new):
                existing = _existing(admin, names)
    except KafkaError as exc:
        raise TopicAdminError(f"Kafka refused the topic request: {exc!r}") from exc
    return [
        _row(spec, prefix, spec.full_name(prefix) in created, existing, want) for spec in ALL_TOPICS
    ]


def describe_topics(settings: Settings) -> list[TopicRow]:
    """The state of every topic, without changing anything."""
    prefix = settings.kafka.topic_prefix
    names = [spec.full_name(prefix) for spec in ALL_TOPICS]
    try:
        with _admin(settings) as admin:
            existing = _existing(admin, names)
    except KafkaError as exc:
        raise TopicAdminError(f"Kafka refused the metadata request: {exc!r}") from exc
    want = settings.kafka.partitions
    return [_row(spec, prefix, False, existing, want) for spec in ALL_TOPICS]


def delete_topics(settings: Settings) -> list[str]:
    """Delete every gpuwatch topic under the settings' prefix (benchmarks, tests, replays)."""
    prefix = settings.kafka.topic_prefix
    names = {spec.full_name(prefix) for spec in ALL_TOPICS}
    try:
        with _admin(settings) as admin:
            present = sorted(names & set(admin.list_topics()))
            if present:
                admin.delete_topics(present, timeout_ms=ADMIN_TIMEOUT_MS)
    except KafkaError as exc:
        raise TopicAdminError(f"Kafka refused to delete topics: {exc!r}") from exc
    return present


def _row(
    spec: TopicSpec[Any], prefix: str, created: bool, existing: dict[str, int], want: int
) -> TopicRow:
    name = spec.full_name(prefix)
    partitions = existing.get(name)
    if created:
        return TopicRow(name, "created", want)
    if partitions is None:
        return TopicRow(name, "missing", None, "run `gpuwatch topics create`")
    if partitions == want:
        return TopicRow(name, "exists", partitions)
    if spec in POD_KEYED:
        # The worker joins these by co-partitioning: one uid must land on the same
        # partition number in each of them, which only equal counts guarantee.
        return TopicRow(
            name,
            "partition-mismatch",
            partitions,
            f"has {partitions} partitions, the pod-keyed topics need {want} like the others",
        )
    return TopicRow(name, "exists", partitions, f"{partitions} partitions, settings say {want}")


def format_report(rows: list[TopicRow]) -> str:
    """A plain-text table of the rows (rich is imported here: the daemons never print one)."""
    from gpuwatch.tables import table_lines

    cells = [
        (
            row.name,
            "-" if row.partitions is None else str(row.partitions),
            row.outcome + (f" ({row.detail})" if row.detail else ""),
        )
        for row in rows
    ]
    return "\n".join(table_lines(("TOPIC", "PARTITIONS", "STATUS"), cells, right={1}))
