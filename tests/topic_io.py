"""Topics in tests: scoped topics made and deleted, whole topics read back in a stable order."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from kafka.consumer.fetcher import ConsumerRecord

from gpuwatch import kafka
from gpuwatch.kafka import TopicPartition, create_topics, delete_topics
from schemas.settings import Settings

READ_DEADLINE_S = 30  # a local broker serves a test's few thousand records in seconds
PARTITIONS = 3  # of a scoped topic: more than one, so keys spread

NewScope = Callable[[], Settings]
"""The `new_scope` fixture: settings with topics and an app id of their own."""


def consume_all(settings: Settings, topic: str) -> list[ConsumerRecord]:
    """Every record of `topic` now, in partition then offset order."""
    consumer = kafka.consumer(settings.kafka, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + READ_DEADLINE_S
        while (ids := consumer.partitions_for_topic(topic)) is None:
            assert time.monotonic() < deadline, f"no metadata for {topic}"
            time.sleep(0.1)
        partitions = [TopicPartition(topic, p) for p in sorted(ids)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        records: list[ConsumerRecord] = []
        while any(consumer.position(tp) < end[tp] for tp in partitions):
            assert time.monotonic() < deadline, f"read {len(records)} records, end was {end}"
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


def scoped_topics(settings: Settings, prefix: str, partitions: int = 3) -> Iterator[Settings]:
    """Settings with `prefix` and `partitions`, every topic created; deleted afterwards."""
    scoped_kafka = settings.kafka.model_copy(
        update={"topic_prefix": prefix, "partitions": partitions}
    )
    scoped = settings.model_copy(update={"kafka": scoped_kafka})
    rows = create_topics(scoped)
    assert all(row.ok for row in rows), rows
    yield scoped
    delete_topics(scoped)


def delete_prefixed(settings: Settings, prefixes: Iterable[str]) -> None:
    """Delete every topic whose name starts with one of `prefixes` (internal ones too)."""
    admin = kafka.admin(settings.kafka)
    try:
        names = [name for name in admin.list_topics() if name.startswith(tuple(prefixes))]
        if names:
            admin.delete_topics(names)
    finally:
        admin.close()


@contextmanager
def topic_scopes(stack: Settings, partitions: int = PARTITIONS) -> Iterator[NewScope]:
    """Make settings with a topic prefix and app id of their own, topics created; deleted after.

    The body of the `new_scope` fixture, for fixtures of a wider scope too.
    """
    prefixes: list[str] = []
    groups: list[str] = []

    def scope() -> Settings:
        tag = uuid.uuid4().hex[:10]
        prefixes.append(f"gwtest-{tag}.")
        scoped_kafka = stack.kafka.model_copy(
            update={
                "topic_prefix": prefixes[-1],
                "partitions": partitions,
                "app_id": f"gwtest-app-{tag}",
            }
        )
        scoped = stack.model_copy(update={"kafka": scoped_kafka})
        groups.append(scoped_kafka.app_id)
        rows = create_topics(scoped)
        assert all(row.ok for row in rows), rows
        return scoped

    yield scope
    admin = kafka.admin(stack.kafka)
    try:
        names = [n for n in admin.list_topics() if any(n.startswith(p) for p in prefixes)]
        if names:
            admin.delete_topics(names)
        known = {g["group_id"] for g in admin.list_groups()}
        if gone := [g for g in groups if g in known]:
            admin.delete_groups(gone)  # the workers have stopped: the groups are empty
    finally:
        admin.close()
