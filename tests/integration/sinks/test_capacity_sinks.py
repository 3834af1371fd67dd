"""The capacity topic through both sinks, on the local stack's Kafka and Redis: the metrics
sink's feed and the Redis writer each show every key's latest picture, whatever order the
records of a key were written in."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import redis
from prometheus_client import CollectorRegistry
from support import wait_until

from gpuwatch import kafka
from gpuwatch.harness.examples import example
from gpuwatch.run.sink import KAFKA, redis_writer
from schemas.capacity import Capacity
from schemas.settings import Settings
from schemas.topics import CAPACITY
from sinks.prometheus.feed import MetricsFeed
from sinks.prometheus.metrics import WorkerMetrics
from sinks.redis.sink import RedisSink

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0  # a consumer group's first join and a few fetches on a loaded machine
H100 = "NVIDIA H100 80GB HBM3"
PRODUCT = "NVIDIA-H100-80GB-HBM3"  # the nodes' gpu.product label: what the records are keyed by


def capacity(ts: int, free: dict[str, int], **kw: Any) -> Capacity:
    raw = example("gpuwatch.capacity/v1") | {"ts": ts, "free_by_node": free}
    return msgspec.convert(raw | {"free": sum(free.values()), **kw}, Capacity)


def written(scoped: Settings, records: list[Capacity]) -> None:
    """`records` into the scope's capacity topic, in this order, keyed as the worker keys them."""
    topic = CAPACITY.full_name(scoped.kafka.topic_prefix)
    producer = kafka.producer(scoped.kafka, acks="all")
    try:
        for record in records:
            key = CAPACITY.key_of(record).encode()
            producer.send(topic, key=key, value=CAPACITY.encode(record))
        producer.flush(timeout=30)
    finally:
        producer.close()


def running(loop: Any) -> Callable[[], None]:
    """Run a sink's consumer loop in a thread; the returned call stops and joins it."""
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()

    def stop() -> None:
        loop.stopping()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert loop.error is None

    return stop


@pytest.fixture
def records(new_scope: Any) -> tuple[Settings, int]:
    """A scope whose capacity topic holds, for the default cluster's H100s, a picture and then
    an older one (read again, or late), and east's H100s once; its `now` in epoch ms."""
    scoped, t = new_scope(), int(time.time() * 1000)
    written(
        scoped,
        [
            capacity(t - 60_000, {"n1": 2, "n2": 1}, stranded=3),
            capacity(t - 3_600_000, {"n9": 5}, stranded=5),  # older: must not win
            capacity(t - 30_000, {"e1": 4}, cluster="east", stranded=0, blocked=0),
        ],
    )
    return scoped, t


def test_the_metrics_sink_shows_each_keys_newest_picture(records: tuple[Settings, int]) -> None:
    scoped, _ = records
    metrics = WorkerMetrics(CollectorRegistry())
    stop = running(MetricsFeed(scoped, metrics, kafka=KAFKA))
    try:

        def free(node: str, **labels: str) -> float | None:
            labels = {"node": node, "model": H100, "resource": "nvidia.com/gpu"} | labels
            return metrics.registry.get_sample_value("gpuwatch_free_gpus", labels)

        wait_until(
            lambda: free("n1") and free("e1", cluster="east"),
            timeout_s=DEADLINE_S,
            what="both keys' pictures in the metrics",
        )
        assert (free("n1"), free("n2"), free("n9")) == (2.0, 1.0, None)
        stranded = {"model": H100, "resource": "nvidia.com/gpu"}
        assert metrics.registry.get_sample_value("gpuwatch_stranded_gpus", stranded) == 3.0
        east = stranded | {"cluster": "east"}
        assert metrics.registry.get_sample_value("gpuwatch_blocked_pods", east) == 0.0
    finally:
        stop()


def test_the_redis_sink_keeps_each_keys_newest_record(
    records: tuple[Settings, int], client: redis.Redis, prefix: str
) -> None:
    scoped, t = records
    writer = redis_writer(scoped, redis_sink=RedisSink(scoped.redis, key_prefix=prefix))
    stop = running(writer)
    try:
        stored = wait_until(
            lambda: (found := client.hgetall(f"{prefix}capacity")) and len(found) == 2 and found,
            timeout_s=DEADLINE_S,
            what="both keys in the capacity hash",
        )
    finally:
        stop()
        writer.redis.close()
    default = msgspec.json.decode(stored[f"{PRODUCT}/nvidia.com/gpu"], type=Capacity)
    east = msgspec.json.decode(stored[f"east/{PRODUCT}/nvidia.com/gpu"], type=Capacity)
    assert (default.ts, dict(default.free_by_node)) == (t - 60_000, {"n1": 2, "n2": 1})
    assert (east.ts, east.cluster) == (t - 30_000, "east")
    assert writer.invalid == 0
