"""The two Faust floors of `gpuwatch bench worker` against the real broker: each reads the
whole backlog, whatever the other left committed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gpuwatch.harness.bench import scratch
from gpuwatch.harness.bench.load import build_fleet, produce
from gpuwatch.harness.bench.probes import Offsets, faust_floor, floor_groups
from gpuwatch.kafka import TopicPartition, consumer
from gpuwatch.kafka import admin as kafka_admin
from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES

T0_MS = 1_764_400_000_000  # hours before the run: a recorded history
FLOOR_DEADLINE_S = 60.0  # a floor reads these 120 samples in seconds, Faust's start included


@pytest.fixture
def scoped(stack: Settings) -> Iterator[Settings]:
    """The bench's own scope: topics, app id; removed by the bench's cleanup."""
    scoped = scratch.scope(stack)
    scratch.create(scoped)
    try:
        yield scoped
    finally:
        scratch.cleanup(scoped)


def _commit_ends(settings: Settings, group: str, topic: str, ends: dict[int, int]) -> None:
    """Commit every partition's end in `group`, as a floor that read them all leaves it."""
    from kafka.structs import OffsetAndMetadata

    client = consumer(settings.kafka, group_id=group, enable_auto_commit=False)
    try:
        client.commit(
            {
                TopicPartition(topic, p): OffsetAndMetadata(end, "", -1)
                for p, end in ends.items()
                if end
            }
        )
    finally:
        client.close()


def test_the_inbox_floor_reads_the_backlog_the_faust_floor_committed(
    scoped: Settings,
) -> None:
    fleet = build_fleet(nodes=6, gpus=2, seconds=57 * 20, t0_ms=T0_MS, watch=0, interval_s=57)
    samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
    asyncio.run(produce(scoped.kafka, samples, fleet.backlog))
    offsets = Offsets(scoped)
    try:
        ends = offsets.partition_ends(samples)
    finally:
        offsets.close()
    assert sum(ends.values()) == fleet.messages == 120
    faust_group, inbox_group = floor_groups(scoped)
    # The Faust floor reads first and commits as it goes: after a long backlog its group
    # is committed at the end of most partitions.
    _commit_ends(scoped, faust_group, samples, ends)
    redis_url = scoped.redis.url.get_secret_value()  # the floors write no Redis
    inbox = faust_floor(scoped, redis_url, samples, ends, inbox=True, deadline_s=FLOOR_DEADLINE_S)
    assert inbox.gpu_samples == fleet.gpu_samples == 240
    client = kafka_admin(scoped.kafka, client_id="gwtest")
    try:
        assert inbox_group in {g["group_id"] for g in client.list_groups()}
    finally:
        client.close()
