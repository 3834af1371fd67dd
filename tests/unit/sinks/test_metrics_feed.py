"""The metrics sink's consumer without Kafka: where partitions start, what they feed, what
a revoke takes away."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest
from support.metric_records import POD as FIXTURE_POD
from support.metric_records import T0, S, attribution, capacity, lifecycle, sample, usage, worker
from support.metric_records import gpu as gpu_reading

from schemas.settings import Settings, WindowSettings
from schemas.topics import ATTRIBUTION, CAPACITY, NVML_SAMPLES, POD_LIFECYCLE, POD_USAGE
from sinks.consumer import KafkaClient
from sinks.prometheus.feed import LOOKBACK_S, MetricsFeed, metrics_group
from sinks.prometheus.metrics import WorkerMetrics

POD = FIXTURE_POD  # records that name no cluster: no cluster label
TEAM = {"namespace": "ml", "team": "vision"}
SETTINGS = Settings()
PREFIX = SETTINGS.kafka.topic_prefix
LIFECYCLE, ATTRIB, SAMPLES, CAPACITIES, USAGE = (
    s.full_name(PREFIX) for s in (POD_LIFECYCLE, ATTRIBUTION, NVML_SAMPLES, CAPACITY, POD_USAGE)
)
NOW_S = T0 / 1000 + 3600.0


class TP(NamedTuple):
    topic: str
    partition: int


class Msg(NamedTuple):
    topic: str
    partition: int
    offset: int
    value: bytes | None


class Found(NamedTuple):
    offset: int
    timestamp: int


class FakeConsumer:
    """Hands out the polls given; the assignment is what the test says; seeks recorded."""

    def __init__(self, assigned: set[TP], polls: list[list[Msg]]) -> None:
        self.assigned = assigned
        self.polls = polls
        self.seeks: dict[TP, int] = {}
        self.asked_since: list[int] = []

    def poll(self, timeout_ms: int) -> dict[TP, list[Msg]]:
        out: dict[TP, list[Msg]] = {}
        for m in self.polls.pop(0) if self.polls else []:
            out.setdefault(TP(m.topic, m.partition), []).append(m)
        return out

    def assignment(self) -> set[TP]:
        return set(self.assigned)

    def beginning_offsets(self, tps: list[TP]) -> dict[TP, int]:
        return dict.fromkeys(tps, 3)

    def end_offsets(self, tps: list[TP]) -> dict[TP, int]:
        return dict.fromkeys(tps, 90)

    def offsets_for_times(self, timestamps: dict[TP, int]) -> dict[TP, Any]:
        self.asked_since.extend(timestamps.values())
        return {tp: Found(40, 0) if tp.topic == ATTRIB else None for tp in timestamps}

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks[tp] = offset


def _no_consumer(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the tests hand the consumer to step()")


UNUSED = KafkaClient(
    consumer=_no_consumer, error=OSError, commit_failed=OSError, rebalancing=OSError
)


def feed(metrics: WorkerMetrics, settings: Settings = SETTINGS) -> MetricsFeed:
    return MetricsFeed(settings, metrics, kafka=UNUSED, wall=lambda: NOW_S)


def msg(topic: str, offset: int, value: bytes, partition: int = 0) -> Msg:
    return Msg(topic, partition, offset, value)


def pod_state(metrics: WorkerMetrics, state: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value("gpuwatch_pod_state", POD | labels | {"state": state})


def test_new_partitions_start_at_the_lifecycle_start_and_a_few_minutes_back_elsewhere() -> None:
    metrics = worker()
    f = feed(metrics)
    tps = {TP(LIFECYCLE, 0), TP(ATTRIB, 0), TP(SAMPLES, 0)}
    # The first poll's records come from wherever the group stood: read again from the seeks.
    consumer = FakeConsumer(tps, [[msg(ATTRIB, 0, ATTRIBUTION.encode(attribution()))]])
    f.step(consumer)
    assert consumer.seeks == {TP(LIFECYCLE, 0): 3, TP(ATTRIB, 0): 40, TP(SAMPLES, 0): 90}
    assert set(consumer.asked_since) == {int((NOW_S - LOOKBACK_S) * 1000)}
    assert f.records == 0


def test_records_feed_the_pod_and_gpu_metrics() -> None:
    metrics = worker()
    f = feed(metrics)
    tps = {TP(LIFECYCLE, 0), TP(SAMPLES, 1)}
    reading = gpu_reading("GPU-1", util=75.0, pods=("u1",))
    polls = [
        [],
        [
            msg(LIFECYCLE, 3, POD_LIFECYCLE.encode(lifecycle(ts=int(NOW_S * 1000) - 5_000))),
            msg(SAMPLES, 90, NVML_SAMPLES.encode(sample("n1", T0, [reading], {})), partition=1),
        ],
    ]
    consumer = FakeConsumer(tps, polls)
    f.step(consumer)  # placed
    f.step(consumer)
    assert f.records == 2
    assert pod_state(metrics, "running") == 1
    util = {"node": "n1", "gpu": "GPU-1", "model": "H100"}
    assert metrics.registry.get_sample_value("gpuwatch_gpu_utilization_ratio", util) == 0.75


def test_a_long_finished_pod_read_from_the_history_shows_no_series() -> None:
    metrics = worker()
    f = feed(metrics)
    long_ago = int((NOW_S - 2 * LOOKBACK_S) * 1000)
    history = [
        msg(LIFECYCLE, 3, POD_LIFECYCLE.encode(lifecycle(to="running", ts=long_ago - 60_000))),
        msg(LIFECYCLE, 4, POD_LIFECYCLE.encode(lifecycle(to="finished", ts=long_ago))),
    ]
    consumer = FakeConsumer({TP(LIFECYCLE, 0)}, [[], history])
    f.step(consumer)
    f.step(consumer)
    assert pod_state(metrics, "running") is None
    assert pod_state(metrics, "finished") is None


def test_a_partition_that_leaves_takes_its_pods_and_nodes_with_it() -> None:
    metrics = worker()
    f = feed(metrics)
    tps = {TP(LIFECYCLE, 0), TP(LIFECYCLE, 1)}
    recent = int(NOW_S * 1000) - 5_000
    polls = [
        [],
        [
            msg(LIFECYCLE, 3, POD_LIFECYCLE.encode(lifecycle("u1", ts=recent))),
            msg(LIFECYCLE, 3, POD_LIFECYCLE.encode(lifecycle("u2", ts=recent, pod="p2")), 1),
        ],
    ]
    consumer = FakeConsumer(tps, polls)
    f.step(consumer)
    f.step(consumer)
    assert pod_state(metrics, "running") == 1
    consumer.assigned = {TP(LIFECYCLE, 1)}  # partition 0 went to another replica
    f.step(consumer)
    assert pod_state(metrics, "running") is None
    assert pod_state(metrics, "running", pod="p2") == 1


def test_a_samples_partition_that_leaves_takes_its_clusters_node_not_the_same_name_elsewhere() -> (
    None
):
    metrics = worker()
    f = feed(metrics)
    east, west = (
        msgspec.structs.replace(
            sample("n1", T0, [gpu_reading(f"GPU-{c}", util=50.0)], {}), cluster=c
        )
        for c in ("east", "west")
    )
    polls = [
        [],
        [
            msg(SAMPLES, 90, NVML_SAMPLES.encode(east)),
            msg(SAMPLES, 90, NVML_SAMPLES.encode(west), 1),
        ],
    ]
    consumer = FakeConsumer({TP(SAMPLES, 0), TP(SAMPLES, 1)}, polls)
    f.step(consumer)
    f.step(consumer)
    util = "gpuwatch_gpu_utilization_ratio"
    east_gpu = {"node": "n1", "gpu": "GPU-east", "model": "H100", "cluster": "east"}
    west_gpu = {"node": "n1", "gpu": "GPU-west", "model": "H100", "cluster": "west"}
    assert metrics.registry.get_sample_value(util, east_gpu) == 0.5
    consumer.assigned = {TP(SAMPLES, 1)}  # east's n1 was on partition 0
    f.step(consumer)
    assert metrics.registry.get_sample_value(util, east_gpu) is None
    assert metrics.registry.get_sample_value(util, west_gpu) == 0.5


def test_capacity_is_read_from_the_start_of_retention_and_leaves_with_its_partition() -> None:
    """A key's latest record can be of any age (one is written only on a change): the
    whole history is read, and the older records in it do not replace the newest."""
    metrics = worker()
    f = feed(metrics)
    month_ago = int((NOW_S - 29 * 86_400) * 1000)
    history = [
        msg(CAPACITIES, 3, CAPACITY.encode(capacity(month_ago - 1000, free={"n1": 4}))),
        msg(CAPACITIES, 4, CAPACITY.encode(capacity(month_ago, free={"n2": 1}))),
        msg(CAPACITIES, 3, CAPACITY.encode(capacity(month_ago, free={"n7": 3}, cluster="east")), 1),
    ]
    consumer = FakeConsumer({TP(CAPACITIES, 0), TP(CAPACITIES, 1)}, [[], history])
    f.step(consumer)
    assert consumer.seeks == {TP(CAPACITIES, 0): 3, TP(CAPACITIES, 1): 3}
    assert consumer.asked_since == []  # no time lookup: the start, whatever the age
    f.step(consumer)
    gauge = "gpuwatch_free_gpus"
    h100 = {"model": "H100", "resource": "nvidia.com/gpu"}
    assert metrics.registry.get_sample_value(gauge, {"node": "n2"} | h100) == 1
    assert metrics.registry.get_sample_value(gauge, {"node": "n1"} | h100) is None
    east = {"node": "n7", "cluster": "east"} | h100
    assert metrics.registry.get_sample_value(gauge, east) == 3
    consumer.assigned = {TP(CAPACITIES, 0)}  # partition 1, east's key, went elsewhere
    f.step(consumer)
    assert metrics.registry.get_sample_value(gauge, east) is None
    assert metrics.registry.get_sample_value(gauge, {"node": "n2"} | h100) == 1


def test_an_undecodable_record_is_counted_and_skipped() -> None:
    f = feed(worker())
    consumer = FakeConsumer({TP(LIFECYCLE, 0)}, [[], [msg(LIFECYCLE, 3, b"{")]])
    f.step(consumer)
    f.step(consumer)
    assert (f.invalid, f.records) == (1, 0)


def test_the_metrics_sinks_group_is_their_own() -> None:
    assert metrics_group(SETTINGS) == "gpuwatch.metrics"


def time_sliced() -> tuple[list[Msg], list[Msg], list[Msg]]:
    """A pod at SM 30 % of a GPU time-sliced three ways, as the worker writes it: its
    lifecycle, two minutes of usage (10 s each) and its two one-minute windows. A GPU's
    seconds count a third to each sharer: a window's used over allocated seconds is 0.9."""
    shared = {"sharing": "time-slicing", "method": "process"}
    lives = [msg(LIFECYCLE, 3, POD_LIFECYCLE.encode(lifecycle(ts=T0 - 5 * S)))]
    usages = []
    for i in range(12):
        record = usage(ts=T0 + i * 10 * S, share=0.3)
        gpu = msgspec.structs.replace(
            record.gpus[0], allocated_seconds=10 / 3, used_gpu_seconds=3.0, **shared
        )
        record = msgspec.structs.replace(record, end_ts=record.ts + 10 * S, gpus=(gpu,))
        usages.append(msg(USAGE, 40 + i, POD_USAGE.encode(record)))
    windows = []
    for i in range(2):
        record = attribution(start=T0 + i * 60 * S)
        gpu = msgspec.structs.replace(
            record.gpus[0], allocated_gpu_seconds=20.0, used_gpu_seconds=18.0, **shared
        )
        record = msgspec.structs.replace(record, gpus=(gpu,))
        windows.append(msg(ATTRIB, 40 + i, ATTRIBUTION.encode(record)))
    return lives, usages, windows


def fed(polls: list[list[Msg]]) -> WorkerMetrics:
    """A metrics sink fed `polls` after its partitions were placed."""
    metrics = worker()
    f = feed(metrics)
    consumer = FakeConsumer({TP(LIFECYCLE, 0), TP(USAGE, 0), TP(ATTRIB, 0)}, [[], *polls])
    while consumer.polls:
        f.step(consumer)
    return metrics


def test_a_backlog_shows_a_time_sliced_pods_own_share_as_a_live_feed_does() -> None:
    """Live, each record comes alone in event-time order (the lifecycle first, a window
    10 s after it ends); a backlog brings each partition's records at once, the usage
    before the lifecycle and windows made from it. Both show the pod's own 30 %."""
    lives, usages, windows = time_sliced()
    live = [*lives, *usages[:7], windows[0], *usages[7:], windows[1]]
    one_by_one = fed([[record] for record in live])
    all_at_once = fed([[*usages, *windows, *lives]])
    share = "gpuwatch_pod_gpu_share_ratio"
    labels = POD | {"gpu": "GPU-8f3c2a1e-5b7d-4c9a-8e6f-1d2b3c4a5e6f"}
    labels |= {"model": "NVIDIA H100 80GB HBM3"}
    for metrics in (one_by_one, all_at_once):
        assert metrics.registry.get_sample_value(share, labels) == pytest.approx(0.3)
        cost = metrics.registry.get_sample_value("gpuwatch_cost_usd_total", TEAM)
        assert cost == pytest.approx(2 * 0.0658)


def test_the_feed_keeps_what_was_counted_for_the_workers_revision_horizon() -> None:
    settings = Settings(windows=WindowSettings(revision_horizon_s=60))
    metrics = worker()
    feed(metrics, settings)
    for minute in range(3):
        metrics.observe_attribution(attribution(start=T0 + minute * 60 * S, cost_usd=1.0))
    # T0 starts two minutes before the newest window: forgotten, its revision adds nothing.
    metrics.observe_attribution(attribution(start=T0, cost_usd=2.0, revision=1))
    metrics.observe_attribution(attribution(start=T0 + 60 * S, cost_usd=2.0, revision=1))
    assert metrics.registry.get_sample_value("gpuwatch_cost_usd_total", TEAM) == 4.0
