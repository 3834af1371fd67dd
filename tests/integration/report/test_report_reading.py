"""The range reader the report shares with replay hands every record over once while its
partitions end in different polls (a report sums what it is handed: a record read twice
is charged twice where the duplicate check cannot see it)."""

from __future__ import annotations

import collections
import time

import pytest
from topic_io import topic_scopes

from gpuwatch import kafka
from gpuwatch.replay.read import Progress, RangeReader
from gpuwatch.timerange import TimeRange
from schemas import ATTRIBUTION
from schemas.settings import Settings

pytestmark = pytest.mark.integration

PARTITIONS = 12
SIZES = {p: 2000 + 250 * p for p in range(PARTITIONS)}  # each ends in a poll that also holds
# batches of partitions that go on
PAD = b"x" * 900  # about an attribution record's size: a fetch holds part of a partition


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """No Kafka client's I/O thread left running (tests/conftest.py)."""


def test_every_record_is_handed_over_once(stack: Settings) -> None:
    with topic_scopes(stack, partitions=PARTITIONS) as new_scope:
        _read_each_once(new_scope())


def _read_each_once(scoped: Settings) -> None:
    topic = ATTRIBUTION.full_name(scoped.kafka.topic_prefix)
    now = int(time.time() * 1000)
    producer = kafka.producer(scoped.kafka, acks="all")
    try:
        for partition, size in SIZES.items():
            for i in range(size):
                value = b'{"ts": %d, "n": "%d-%d", "pad": "%s"}' % (
                    now - 3_600_000 + i,
                    partition,
                    i,
                    PAD,
                )
                producer.send(topic, key=b"k", value=value, partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close()
    span = TimeRange(now - 7_200_000, now)
    with RangeReader(scoped.kafka, Progress(after_s=1e9), client_id="gwtest-report") as reader:
        plan = reader.plan([topic], span)
        seen = collections.Counter(hit.value for hit in reader.read(plan, [topic], span, 0))
    twice = sum(n > 1 for n in seen.values())
    assert twice == 0, f"{twice} records handed over more than once"
    assert len(seen) == sum(SIZES.values())
    assert plan.scanned[topic] == sum(SIZES.values())
