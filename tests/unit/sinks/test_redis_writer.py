"""The Redis writer without services: retries, positions, live GPU states from the samples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, cast

import msgspec
import pytest
from kafka.errors import CommitFailedError, KafkaConnectionError, RebalanceInProgressError

from gpuwatch.harness.examples import example
from gpuwatch.run import sink as sink_run
from schemas.capacity import Capacity
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from schemas.settings import Settings
from schemas.topics import CAPACITY, NVML_SAMPLES, POD_LIFECYCLE
from sinks.redis import writer as sink_writer
from sinks.redis.live_gpus import LiveGpus
from sinks.redis.plan import GpuLive, SinkRecord
from sinks.redis.sink import RedisSink, SinkRejected, SinkUnavailable
from sinks.redis.writer import LIVE_LOOKBACK_S, RedisWriter, redis_group

SETTINGS = Settings()
TOPIC = POD_LIFECYCLE.full_name(SETTINGS.kafka.topic_prefix)
SAMPLES = NVML_SAMPLES.full_name(SETTINGS.kafka.topic_prefix)
NOW_S = 1_764_412_100.0


class Msg(NamedTuple):
    topic: str
    partition: int
    offset: int
    value: bytes | None


def transition(uid: str, ts: int = 1_764_412_000_000) -> PodLifecycle:
    raw = example("gpuwatch.pod.lifecycle/v1") | {"uid": uid, "ts": ts}
    return msgspec.convert(raw, PodLifecycle)


class TP(NamedTuple):
    topic: str
    partition: int


TP0 = TP(TOPIC, 0)


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class FakeConsumer:
    """Polls hand out the batches given, one per poll (the messages' own topic and partition);
    commits, pauses and seeks recorded. Assigned: TP0 and the partitions polled so far."""

    def __init__(self, batches: list[list[Msg]], position: int = 0, start: int = 0) -> None:
        self.batches = batches
        self.assigned = {TP0}
        self.committed_at: dict[TP, int] = {}
        self.times: dict[TP, OffsetAndTimestamp | None] = {}
        self.ends: dict[TP, int] = {}
        self.asked_since: list[int] = []
        self.commits = 0
        self.polls_while_paused = 0
        self.at = position
        self.start = start
        self.seeks: list[int] = []
        self.seeks_by: dict[TP, int] = {}
        self._paused: set[TP] = set()

    def poll(self, timeout_ms: int) -> dict[TP, list[Msg]]:
        if self._paused:
            self.polls_while_paused += 1
            return {}
        if not self.batches:
            return {}
        batch = self.batches.pop(0)
        if batch:
            self.at = batch[-1].offset + 1
        polled: dict[TP, list[Msg]] = {TP0: []}
        for m in batch:
            polled.setdefault(TP(m.topic, m.partition), []).append(m)
        self.assigned |= set(polled)
        return polled

    def assignment(self) -> set[TP]:
        return set(self.assigned)

    def committed(self, tp: TP) -> int | None:
        return self.committed_at.get(tp)

    def offsets_for_times(self, timestamps: dict[TP, int]) -> dict[TP, Any]:
        self.asked_since.extend(timestamps.values())
        return {tp: self.times.get(tp) for tp in timestamps}

    def end_offsets(self, tps: list[TP]) -> dict[TP, int]:
        return {tp: self.ends.get(tp, 0) for tp in tps}

    def position(self, tp: TP) -> int:
        return self.at

    def beginning_offsets(self, tps: list[TP]) -> dict[TP, int]:
        return dict.fromkeys(tps, self.start)

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append(offset)
        self.seeks_by[tp] = offset
        self.at = offset

    def pause(self, *tps: TP) -> None:
        self._paused |= set(tps)

    def paused(self) -> set[TP]:
        return set(self._paused)

    def resume(self, *tps: TP) -> None:
        self._paused -= set(tps)

    def commit(self) -> None:
        self.commits += 1


class FakeRedis:
    """Fails as scripted (`failures`: exceptions raised by the next calls), records batches."""

    target = "redis://fake/0"

    def __init__(self, failures: list[Exception] | None = None, refuse: str | None = None) -> None:
        self.failures = failures or []
        self.refuse = refuse
        self.applied: list[list[SinkRecord]] = []
        self.stored: dict[str, int] = {}
        self.errors: Counter[str] = Counter()
        self.run_id, self.evicted = "run-1", 0
        self.generations = 0
        self.rebuilds: list[tuple[str, int]] = []

    def apply(
        self,
        batch: list[SinkRecord],
        positions: tuple[str, dict[str, int]] | None = None,
        live: Sequence[GpuLive] = (),
    ) -> None:
        if self.failures:
            raise self.failures.pop(0)
        batch = [*batch, *live]
        if self.refuse and any(getattr(r, "uid", None) == self.refuse for r in batch):
            raise SinkRejected("WRONGTYPE")
        if batch:
            self.applied.append(list(batch))
        if positions is not None:
            for key, offset in positions[1].items():
                self.stored[key] = max(offset, self.stored.get(key, 0))

    def positions(self, group: str) -> dict[str, int]:
        return dict(self.stored)

    def evictions(self) -> tuple[str, int]:
        return self.run_id, self.evicted

    def generation(self, group: str) -> int:
        return self.generations

    def rebuild(self, group: str, evictions: tuple[str, int]) -> int:
        """As the script: the keys deleted once per eviction count of a run."""
        if evictions not in self.rebuilds:
            self.rebuilds.append(evictions)
            self.stored.clear()
            self.generations += 1
        return self.generations

    def close(self) -> None:
        pass


def writer(redis: FakeRedis) -> RedisWriter:
    w = sink_run.redis_writer(SETTINGS, redis_sink=cast(RedisSink, redis))
    w._wall = lambda: NOW_S
    return w


def msgs(*uids: str) -> list[Msg]:
    return [Msg(TOPIC, 0, i, POD_LIFECYCLE.encode(transition(u))) for i, u in enumerate(uids)]


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_writer, "FIRST_PAUSE_S", 0.001)


def test_a_batch_is_committed_only_after_redis_took_it_and_retried_while_away() -> None:
    redis = FakeRedis(failures=[SinkUnavailable("down"), SinkUnavailable("down")])
    consumer = FakeConsumer([msgs("a", "b")])
    w = writer(redis)
    w.step(consumer)
    assert [[r.uid for r in b] for b in redis.applied] == [["a", "b"]]  # type: ignore[union-attr]
    assert (consumer.commits, consumer.polls_while_paused, w.written) == (1, 2, 2)
    assert consumer.paused() == set()  # resumed once written


def test_stopping_while_redis_is_away_commits_nothing() -> None:
    redis = FakeRedis(failures=[SinkUnavailable("down")] * 100)
    consumer = FakeConsumer([msgs("a")])
    w = writer(redis)
    w._stop.set()
    w.step(consumer)
    assert (redis.applied, consumer.commits, w.written) == ([], 0, 0)


def test_a_refused_record_costs_itself_only() -> None:
    redis = FakeRedis(refuse="bad")
    consumer = FakeConsumer([msgs("a", "bad", "c")])
    w = writer(redis)
    w.step(consumer)
    assert [[r.uid for r in b] for b in redis.applied] == [["a"], ["c"]]  # type: ignore[union-attr]
    assert (w.written, w.rejected, consumer.commits) == (2, 1, 1)


def test_an_undecodable_record_is_counted_and_the_rest_written() -> None:
    redis = FakeRedis()
    batch = [Msg(TOPIC, 0, 0, b"not json"), Msg(TOPIC, 0, 1, None), *msgs("a")]
    w = writer(redis)
    w.step(FakeConsumer([batch]))
    assert (w.invalid, w.written) == (2, 1)


def test_capacity_records_are_read_and_written_with_the_other_derived_records() -> None:
    redis = FakeRedis()
    topic = CAPACITY.full_name(SETTINGS.kafka.topic_prefix)
    record = msgspec.convert(example("gpuwatch.capacity/v1"), Capacity)
    w = writer(redis)
    assert topic in w.topics
    consumer = FakeConsumer([[*msgs("a"), Msg(topic, 2, 7, CAPACITY.encode(record))]])
    w.step(consumer)
    (batch,) = redis.applied
    assert batch[-1] == record
    assert (w.written, w.invalid, consumer.commits) == (2, 0, 1)
    assert redis.stored == {f"{TOPIC}:0": 1, f"{topic}:2": 8}


def test_live_gpu_states_ride_along_and_come_back_if_undelivered() -> None:
    redis = FakeRedis(failures=[SinkUnavailable("down")] * 100)
    w = writer(redis)
    raw: dict[str, Any] = example("gpuwatch.nvml.sample/v1")
    raw["gpus"][0]["util_pct"] = 50.0
    w.live.observe(msgspec.convert(raw, NvmlSample))
    w._stop.set()
    w.step(FakeConsumer([]))
    assert [s.util_pct for s in w.live.take()] == [50.0]  # kept for the next attempt


def test_positions_are_stored_with_the_batch_even_after_a_refused_record() -> None:
    redis = FakeRedis(refuse="bad")
    w = writer(redis)
    w.step(FakeConsumer([msgs("a", "bad", "c")]))
    assert redis.stored == {f"{TOPIC}:0": 3}


def test_a_redis_that_lost_writes_is_written_again_from_where_it_stands() -> None:
    redis = FakeRedis()
    w = writer(redis)
    consumer = FakeConsumer([msgs("a", "b", "c")])
    w.step(consumer)
    assert (redis.stored, consumer.at) == ({f"{TOPIC}:0": 3}, 3)
    redis.stored[f"{TOPIC}:0"] = 1  # restarted from a snapshot taken after offset 0
    w._next_check = 0.0
    w.step(consumer)
    assert consumer.seeks == [1]


def test_an_empty_redis_is_written_again_from_the_start_and_a_fresh_one_is_not() -> None:
    w = writer(FakeRedis())
    fresh = FakeConsumer([], position=5, start=5)  # nothing before 5 left in the topic
    w.step(fresh)
    assert fresh.seeks == []
    w._next_check = 0.0
    emptied = FakeConsumer([], position=9, start=2)
    w.step(emptied)
    assert emptied.seeks == [2]


def test_the_redis_writers_group_is_their_own() -> None:
    assert redis_group(SETTINGS) == "gpuwatch.redis" != SETTINGS.kafka.app_id


class RefusingConsumer(FakeConsumer):
    """Its first commit is refused: the group rebalanced while the process was stopped."""

    def commit(self) -> None:
        if self.commits == 0:
            self.commits = -1
            raise CommitFailedError("UnknownMemberIdError")
        super().commit()


def test_a_refused_commit_is_counted_and_the_writer_goes_on() -> None:
    redis = FakeRedis()
    consumer = RefusingConsumer([msgs("a"), msgs("b")])
    w = writer(redis)
    w.step(consumer)
    w.step(consumer)
    assert [[r.uid for r in b] for b in redis.applied] == [["a"], ["b"]]  # type: ignore[union-attr]
    assert (w.kafka_errors, consumer.commits, w.written) == (1, 0, 2)


class RefusedCommits(FakeConsumer):
    """Its first commits raise the errors given, in turn; then it commits."""

    def __init__(self, batches: list[list[Msg]], errors: list[Exception]) -> None:
        super().__init__(batches)
        self.errors = errors
        self.tries = 0

    def commit(self) -> None:
        self.tries += 1
        if self.errors:
            raise self.errors.pop(0)
        super().commit()


def test_a_commit_during_a_rejoin_waits_and_is_tried_again_though_no_record_comes() -> None:
    redis = FakeRedis()
    rebalancing = [RebalanceInProgressError("the group is rebalancing") for _ in range(2)]
    consumer = RefusedCommits([msgs("a")], rebalancing)  # then nothing more
    w = writer(redis)
    for _ in range(3):
        w.step(consumer)  # no error to pause on: the next poll goes on with the rejoin
    assert (w.kafka_errors, consumer.tries, consumer.commits, w.written) == (0, 3, 1, 1)
    w.step(consumer)  # committed: nothing more to do
    assert (consumer.tries, consumer.commits) == (3, 1)
    assert len(redis.applied) == 1


class Subscribing(RefusedCommits):
    """A consumer `run` makes: it subscribes and closes (both recorded)."""

    def __init__(self, batches: list[list[Msg]], errors: list[Exception]) -> None:
        super().__init__(batches, errors)
        self.calls: list[str] = []

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}

    def subscribe(self, topics: list[str]) -> None:
        self.calls.append("subscribe")

    def close(self) -> None:
        self.calls.append("close")


def test_a_consumer_rejoining_for_too_long_is_made_anew_and_the_records_written_again() -> None:
    # kafka-python's consumer resumed after its session expired was seen to keep fetching
    # without ever rejoining, every commit refused as asked for during a rejoin.
    redis = FakeRedis()
    rejoining = [RebalanceInProgressError("the group is rebalancing") for _ in range(99)]
    stuck = Subscribing([msgs("a")], rejoining)
    fresh = Subscribing([msgs("a"), msgs("b")], [])
    made = [stuck, fresh]
    kafka = replace(sink_run.KAFKA, consumer=lambda *_, **__: made.pop(0))
    clock = {"t": 1000.0}
    w = RedisWriter(
        SETTINGS,
        LiveGpus(5.0),
        kafka=kafka,
        redis_sink=cast(RedisSink, redis),
        monotonic=lambda: clock["t"],
    )
    real_step = w.step
    steps: list[Subscribing] = []

    def step(consumer: Any) -> None:
        steps.append(consumer)
        real_step(consumer)
        if consumer is stuck:
            clock["t"] += sink_writer.REJOIN_LIMIT_S / 4
        elif len(steps) >= 8:
            w.stopping()

    w.step = step  # type: ignore[method-assign]
    w.run()
    assert w.error is None
    # Written, then refused as rejoining for the limit (five steps): a new consumer.
    assert steps.count(stuck) == 5
    assert stuck.calls == ["subscribe", "close"]
    assert (stuck.commits, w.kafka_errors, w.renewed) == (0, 1, 1)
    # The new one joins, reads from the group's commits and writes and commits again.
    assert fresh.calls == ["subscribe", "close"]
    assert fresh.commits == 2
    assert [[r.uid for r in b] for b in redis.applied] == [["a"], ["a"], ["b"]]  # type: ignore[union-attr]


def test_a_commit_the_broker_was_away_for_is_tried_again_though_no_record_comes() -> None:
    redis = FakeRedis()
    consumer = RefusedCommits([msgs("a")], [KafkaConnectionError("broker away")])
    w = writer(redis)
    with pytest.raises(KafkaConnectionError):
        w.step(consumer)  # the loop counts it and pauses
    w.step(consumer)
    assert (consumer.tries, consumer.commits, w.written) == (2, 1, 1)


class FlakyConsumer(FakeConsumer):
    """Its first poll fails; the writer is stopped after the third."""

    def __init__(self, batches: list[list[Msg]], stop: Callable[[], None]) -> None:
        super().__init__(batches)
        self.polls = 0
        self._stop_after = stop
        self.calls: list[str] = []

    def poll(self, timeout_ms: int) -> dict[TP, list[Msg]]:
        self.polls += 1
        if self.polls == 1:
            raise KafkaConnectionError("broker away")
        if self.polls == 3:
            self._stop_after()
        return super().poll(timeout_ms)

    def partitions_for_topic(self, topic: str) -> set[int]:
        self.calls.append(f"metadata {topic}")
        return {0}

    def subscribe(self, topics: list[str]) -> None:
        self.calls.append("subscribe")

    def close(self) -> None:
        pass


def test_a_kafka_error_in_the_writers_loop_is_retried_not_the_end_of_it() -> None:
    redis = FakeRedis()
    kafka = replace(sink_run.KAFKA, consumer=lambda *_, **__: consumer)
    w = RedisWriter(SETTINGS, LiveGpus(5.0), kafka=kafka, redis_sink=cast(RedisSink, redis))
    consumer = FlakyConsumer([msgs("a"), msgs("b")], stop=w._stop.set)
    w.run()
    assert w.error is None
    assert w.kafka_errors == 1
    assert [[r.uid for r in b] for b in redis.applied] == [["a"], ["b"]]  # type: ignore[union-attr]


def test_the_writer_knows_its_topics_before_it_joins_the_group() -> None:
    # kafka-python assigns from the metadata it has when it joins; topics it learns of
    # during the join were left unassigned until its next metadata change.
    redis = FakeRedis()
    kafka = replace(sink_run.KAFKA, consumer=lambda *_, **__: consumer)
    w = RedisWriter(SETTINGS, LiveGpus(5.0), kafka=kafka, redis_sink=cast(RedisSink, redis))
    consumer = FlakyConsumer([msgs("a")], stop=w._stop.set)
    w.run()
    assert consumer.calls == [*(f"metadata {topic}" for topic in w.topics), "subscribe"]
    assert w.topics[-1] == SAMPLES
    assert len(w.topics) == 7  # the 5 derived topics, k8s.workloads, the samples


def sample_msg(offset: int, ts: int, util_pct: float, partition: int = 0) -> Msg:
    raw: dict[str, Any] = example("gpuwatch.nvml.sample/v1") | {"ts": ts}
    raw["gpus"][0]["util_pct"] = util_pct
    value = NVML_SAMPLES.encode(msgspec.convert(raw, NvmlSample))
    return Msg(SAMPLES, partition, offset, value)


def test_node_samples_become_live_gpu_states_without_stored_positions() -> None:
    redis = FakeRedis()
    w = writer(redis)
    consumer = FakeConsumer([[sample_msg(0, 1_764_412_000_000, 50.0)]])
    consumer.committed_at[TP(SAMPLES, 0)] = 0  # the group has read this partition before
    consumer.assigned.add(TP(SAMPLES, 0))
    w.step(consumer)
    live = [r for b in redis.applied for r in b if isinstance(r, GpuLive)]
    assert [s.util_pct for s in live][:1] == [50.0]
    assert (w.samples, consumer.commits, redis.stored, consumer.seeks) == (1, 1, {}, [])
    assert w.newest_sample_ms == 1_764_412_000_000 + 1000  # the example's interval


def test_a_sample_partition_the_group_never_read_starts_a_few_minutes_back() -> None:
    redis = FakeRedis()
    w = writer(redis)
    tp = TP(SAMPLES, 3)
    consumer = FakeConsumer([[sample_msg(0, 1_700_000_000_000, 50.0, partition=3)]])
    consumer.times[tp] = OffsetAndTimestamp(40, 0)
    w.step(consumer)
    assert consumer.asked_since == [int((NOW_S - LIVE_LOOKBACK_S) * 1000)]
    assert consumer.seeks_by == {tp: 40}
    assert (w.samples, redis.applied) == (0, [])  # the day-old record polled first is dropped


def test_a_sample_partition_with_nothing_that_recent_starts_at_its_end() -> None:
    w = writer(FakeRedis())
    consumer = FakeConsumer([[sample_msg(0, 1_700_000_000_000, 50.0, partition=1)]])
    consumer.ends[TP(SAMPLES, 1)] = 77
    w.step(consumer)
    assert consumer.seeks_by == {TP(SAMPLES, 1): 77}


def test_an_undecodable_sample_is_counted_and_skipped() -> None:
    w = writer(FakeRedis())
    consumer = FakeConsumer([[Msg(SAMPLES, 0, 0, b"{"), sample_msg(1, 1_764_412_000_000, 1.0)]])
    consumer.committed_at[TP(SAMPLES, 0)] = 0
    consumer.assigned.add(TP(SAMPLES, 0))
    w.step(consumer)
    assert (w.samples_invalid, w.samples) == (1, 1)


def test_an_emptied_redis_does_not_read_the_samples_again() -> None:
    w = writer(FakeRedis())
    consumer = FakeConsumer([], position=9, start=2)
    consumer.assigned = {TP(SAMPLES, 0)}
    consumer.committed_at[TP(SAMPLES, 0)] = 9
    w.step(consumer)
    assert consumer.seeks == []


def test_the_sinks_metrics_read_the_writers_counters() -> None:
    from prometheus_client import CollectorRegistry

    w = writer(FakeRedis())
    w.written, w.samples, w.newest_sample_ms = 12, 3, int((NOW_S - 2.5) * 1000)
    registry = CollectorRegistry()
    registry.register(sink_run.SinkCollector(w, wall=lambda: NOW_S))
    assert registry.get_sample_value("gpuwatch_sink_written_total") == 12
    assert registry.get_sample_value("gpuwatch_sink_samples_total") == 3
    assert registry.get_sample_value("gpuwatch_sink_lag_seconds") == pytest.approx(2.5)
    w.redis.errors.update({"oom": 4, "readonly": 1})
    w.rewrites["evicted"] += 1
    errors = "gpuwatch_sink_redis_errors_total"
    assert registry.get_sample_value(errors, {"reason": "oom"}) == 4
    assert registry.get_sample_value(errors, {"reason": "readonly"}) == 1
    rewrites = "gpuwatch_sink_redis_rewrites_total"
    assert registry.get_sample_value(rewrites, {"reason": "evicted"}) == 1
    assert registry.get_sample_value(rewrites, {"reason": "lost"}) == 0


def test_a_refusal_keeps_the_batch_uncommitted_and_is_logged_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    full = SinkUnavailable("OOM command not allowed", reason="oom")
    redis = FakeRedis(failures=[full, full])
    consumer = FakeConsumer([msgs("a")])
    w = writer(redis)
    commits: list[int] = []
    redis_apply = redis.apply

    def apply(*args: Any, **kwargs: Any) -> None:
        commits.append(consumer.commits)  # the commits made before each attempt
        redis_apply(*args, **kwargs)

    redis.apply = apply  # type: ignore[method-assign]
    w.step(consumer)
    assert commits == [0, 0, 0]  # nothing committed while Redis refused the batch
    assert (consumer.commits, w.written) == (1, 1)
    assert "reason=oom" in caplog.text


def test_evictions_delete_the_keys_once_and_every_writer_reads_all_again() -> None:
    redis = FakeRedis()
    first, second = writer(redis), writer(redis)  # two replicas of the group
    consumer, other = FakeConsumer([msgs("a", "b", "c")], start=2), FakeConsumer([], start=2)
    other.assigned = {TP(TOPIC, 1)}
    other.at = redis.stored[f"{TOPIC}:1"] = 7  # what it wrote before
    samples = TP(SAMPLES, 0)
    consumer.assigned.add(samples)
    consumer.committed_at[samples] = 40
    consumer.times[samples] = OffsetAndTimestamp(31, 0)
    first.step(consumer)
    second.step(other)
    assert (consumer.seeks, other.seeks) == ([], [])
    redis.evicted = 5  # a maxmemory-policy that evicts
    for w in (first, second):
        w._next_check = 0.0
    first.step(consumer)
    assert redis.rebuilds == [("run-1", 5)]
    assert consumer.seeks_by == {TP0: 2, samples: 31}  # the start; the samples' look-back
    assert consumer.asked_since == [int((NOW_S - LIVE_LOOKBACK_S) * 1000)]
    second.step(other)  # noticed the same evictions: found the keys deleted already
    assert redis.rebuilds == [("run-1", 5)]
    assert other.seeks_by == {TP(TOPIC, 1): 2}
    assert (first.rewrites["evicted"], second.rewrites["evicted"]) == (1, 1)
    redis.run_id, redis.evicted = "run-2", 1  # restarted: its count starts again
    first._next_check = 0.0
    first.step(consumer)
    assert (redis.rebuilds, first.rewrites["evicted"]) == ([("run-1", 5)], 1)
