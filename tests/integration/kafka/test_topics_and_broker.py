"""Topic creation against the real broker, and a message through a topic both ways."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from topic_io import delete_prefixed

from gpuwatch import kafka
from gpuwatch.harness.examples import example
from gpuwatch.kafka import create_topics, describe_topics
from gpuwatch.run.worker import ensure_tick_topic
from schemas import ALL_TOPICS, NVML_SAMPLES, POD_KEYED, NvmlSample
from schemas.settings import Settings
from streams.faust.app import changelog_topic_names
from streams.faust.tick_timer import fleet_topic_name, tick_topic_name

pytestmark = pytest.mark.integration


@pytest.fixture
def scoped(stack: Settings, topic_prefix: str) -> Iterator[Settings]:
    """Settings with a topic prefix and partition count of this test alone."""
    scoped_kafka = stack.kafka.model_copy(update={"topic_prefix": topic_prefix, "partitions": 3})
    yield stack.model_copy(update={"kafka": scoped_kafka})
    delete_prefixed(stack, [topic_prefix])


def test_create_topics_is_idempotent_with_configs(scoped: Settings) -> None:
    prefix = scoped.kafka.topic_prefix
    first = create_topics(scoped)
    assert [row.name for row in first] == [spec.full_name(prefix) for spec in ALL_TOPICS]
    assert {row.outcome for row in first} == {"created"}
    second = create_topics(scoped)
    assert {row.outcome for row in second} == {"exists"}
    assert {row.partitions for row in describe_topics(scoped)} == {3}

    admin = kafka.admin(scoped.kafka)
    try:
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, spec.full_name(prefix)) for spec in ALL_TOPICS
        ]
        described = admin.describe_configs(resources)
    finally:
        admin.close()
    configs = described["topic"]
    for spec in ALL_TOPICS:
        entry = configs[spec.full_name(prefix)]
        assert entry["cleanup.policy"]["value"] == (
            "compact,delete" if spec.compacted else "delete"
        )
        assert entry["retention.ms"]["value"] == str(spec.retention_ms)


def test_a_pod_keyed_topic_with_another_partition_count_is_reported(scoped: Settings) -> None:
    prefix = scoped.kafka.topic_prefix
    odd = POD_KEYED[-1].full_name(prefix)
    admin = kafka.admin(scoped.kafka)
    try:
        admin.create_topics([NewTopic(odd, num_partitions=5, replication_factor=1)])
    finally:
        admin.close()
    rows = {row.name: row for row in create_topics(scoped)}
    assert rows[odd].outcome == "partition-mismatch"
    assert rows[odd].partitions == 5
    assert not rows[odd].ok
    others = [row for name, row in rows.items() if name != odd]
    assert all(row.outcome == "created" for row in others)


def test_a_sample_goes_through_the_broker_to_both_clients(scoped: Settings) -> None:
    create_topics(scoped)
    topic = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
    sample = NVML_SAMPLES.decode(json.dumps(example(NVML_SAMPLES.schema_name)))
    assert isinstance(sample, NvmlSample)

    producer = kafka.producer(scoped.kafka, acks="all")
    try:
        future = producer.send(topic, key=sample.node.encode(), value=NVML_SAMPLES.encode(sample))
        metadata = future.get(timeout=30)
    finally:
        producer.close()

    consumer = kafka.consumer(
        scoped.kafka,
        topic,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    try:
        received = next(iter(consumer))
    finally:
        consumer.close()
    assert received.partition == metadata.partition
    assert received.key == sample.node.encode()
    assert NVML_SAMPLES.decode(received.value) == sample

    async def read_with_aiokafka() -> bytes:
        # aiokafka is the client inside the Faust worker: prove it speaks to Kafka 4.x.
        reader = AIOKafkaConsumer(
            topic,
            bootstrap_servers=scoped.kafka.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await reader.start()
        try:
            message = await asyncio.wait_for(reader.getone(), timeout=20)
        finally:
            await reader.stop()
        assert message.value is not None
        return message.value

    assert NVML_SAMPLES.decode(asyncio.run(read_with_aiokafka())) == sample


def test_the_worker_creates_its_internal_topics_and_changelogs_before_faust_starts(
    scoped: Settings,
) -> None:
    """The state tables' changelogs exist, compacted, with the inputs' partition count,
    before Faust's consumer joins the group: a partition assigned before its changelog
    existed left the worker's first state write waiting for the topic."""
    names = [
        tick_topic_name(scoped),
        fleet_topic_name(scoped),
        *changelog_topic_names(scoped),
    ]
    assert ensure_tick_topic(scoped) == names[0]
    assert ensure_tick_topic(scoped) == names[0]  # again: they exist, nothing changes
    admin = kafka.admin(scoped.kafka)
    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        )["topic"]
        partitions = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(names)}
    finally:
        admin.close()
    assert partitions == dict.fromkeys(names, 3)
    for name in names[2:]:
        assert described[name]["cleanup.policy"]["value"] == "compact", name
    for name in names[:2]:
        assert described[name]["cleanup.policy"]["value"] == "delete", name
