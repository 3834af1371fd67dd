"""The derived topics and the node samples into Redis: a Kafka consumer that writes each
batch, then commits.

`RedisWriter` is the `gpuwatch sink redis` process's consumer, in a group of its own
(`{app_id}.redis`): the derived topics, and the node samples for the live state of each GPU
(`sinks/redis/live_gpus.py`, the newest sample of each GPU wins). It writes each polled
batch, with the live states it brought, as one Redis transaction, and commits the offsets
only after Redis took it. While Redis is away it keeps the batch, pauses its partitions and
retries with a growing pause; stream processing goes on untouched (another process and
group: no worker waits on Redis). A sample partition this group never committed starts
`LIVE_LOOKBACK_S` back from the end, not at the start of a day of retention: live state
needs the newest samples only. After a crash, the records after the last commit are written again;
the writes are idempotent upserts keyed by each record's identity, so the state is the
same. A record Redis refuses for good (a key of the wrong type someone else wrote) is
logged and counted, and the rest of its batch is written. A Redis that refuses writes for a
while (full, a failed snapshot, a read-only replica) is away like one that does not answer:
the batch is kept, uncommitted, and retried, each refusal counted by its reason.

Redis that lost keys is written again from the topics: behind the positions stored with
each batch (a restart from an older snapshot, an emptied database), the difference is read
again; after evictions (a maxmemory-policy other than noeviction), which leave some keys of
a pod or a leaderboard and not others, every key of the prefix is deleted in one step and
every writer of the group reads its partitions again from the start (`_reconcile`).

The Kafka client is given (`KafkaClient`): the wiring passes kafka-python's
(gpuwatch/run/sink.py), so that this package imports no Kafka library.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from schemas.alert import Alert
from schemas.capacity import Capacity
from schemas.codec import SchemaError, TopicSpec
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.settings import Settings
from schemas.topics import K8S_WORKLOADS, NVML_SAMPLES, SINK_TOPICS
from sinks.consumer import Consumer, ConsumerFactory, ConsumerLoop, KafkaClient, Message
from sinks.redis.live_gpus import LiveGpus
from sinks.redis.plan import GpuLive, SinkRecord
from sinks.redis.sink import Backoff, RedisSink, SinkRejected, SinkUnavailable

__all__ = ["Consumer", "ConsumerFactory", "KafkaClient", "RedisWriter", "redis_group"]

log = logging.getLogger(__name__)

POLL_MS = 250  # live GPU state reaches Redis within about this long of its sample
MAX_RECORDS = 2000  # per poll: one Redis transaction of a few hundred kB at most
# A fetch answers once this much of the derived topics is there, or after FETCH_WAIT_MS:
# with the default of one byte, a busy worker's outputs made the consumer fetch (and
# parse, in Python) dozens of times a second.
FETCH_MIN_BYTES = 64 * 1024
FETCH_WAIT_MS = 200  # under POLL_MS: a poll gets a fetch's answer before it gives up
FIRST_PAUSE_S = 0.5  # first pause after Redis was found away; doubles up to RETRY_CAP_S
RETRY_CAP_S = 10.0  # longest pause between attempts while Redis is away
ATTEMPT_BUDGET_S = 5.0  # one attempt's own quick retries (a Redis restart takes about this)
LOG_EVERY_S = 30.0  # one warning per this many seconds while Redis is away
CHECK_EVERY_S = 5.0  # how often Redis's stored positions are compared with the group's
LIVE_LOOKBACK_S = 300.0  # a new group's sample partitions start this far back in wall time
REJOIN_LIMIT_S = 30.0  # commits refused as "rejoining" this long: a new consumer joins anew


REDIS_TOPICS = (*SINK_TOPICS, K8S_WORKLOADS)
"""What the Redis sink writes besides the live GPU states: the derived topics, and Kueue's
workloads as the watcher publishes them (the picture of what waits in Kueue's queues)."""


def redis_group(settings: Settings) -> str:
    """The consumer group of the Redis sinks."""
    return f"{settings.kafka.app_id}.redis"


class RedisWriter(ConsumerLoop):
    """The derived topics and live GPU states into Redis, at least once."""

    name = "redis writer"
    retry_s = FIRST_PAUSE_S

    def __init__(
        self,
        settings: Settings,
        live: LiveGpus,
        *,
        kafka: KafkaClient,
        redis_sink: RedisSink | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        prefix = settings.kafka.topic_prefix
        self.redis = redis_sink or RedisSink(
            settings.redis, backoff=Backoff(cap_s=1.0, budget_s=ATTEMPT_BUDGET_S)
        )
        self.live = live
        self.samples_topic = NVML_SAMPLES.full_name(prefix)
        topics = [*(spec.full_name(prefix) for spec in REDIS_TOPICS), self.samples_topic]
        super().__init__(settings.kafka, kafka, topics)
        self._decoders: dict[str, TopicSpec[Any]] = {
            spec.full_name(prefix): spec for spec in REDIS_TOPICS
        }
        self._monotonic = monotonic
        self._wall = wall
        self._thread: threading.Thread | None = None
        self._next_log = 0.0
        self._next_check = 0.0
        self.group = redis_group(settings)
        self.written = 0
        """Records and live states Redis has taken."""
        self.rejected = 0
        """Records Redis refused for good."""
        self.invalid = 0
        """Records of the derived topics that did not decode (written by someone else)."""
        self.samples = 0
        """Node samples taken in for the live GPU states."""
        self.samples_invalid = 0
        """Node samples that did not decode (the worker dead-letters them with the reason)."""
        self.newest_sample_ms = 0
        """End (ts + interval) of the newest node sample whose live states Redis took."""
        self._commit_due = False
        """Positions past the group's commit, written to Redis: committed at the next step,
        with or without new records, until Kafka takes the commit."""
        self._rejoining_since: float | None = None
        """When the commits began to be refused as asked for during a rejoin."""
        self.rewrites: Counter[str] = Counter()
        """Times Redis was found to have lost writes and they were read again: `lost` (its
        positions behind the consumer's), `evicted` (keys evicted, all written anew)."""
        self._evictions: tuple[str, int] | None = None
        """Redis's run id and eviction count at the last check."""
        self._generation: int | None = None
        """The group's rebuild generation at the last check (`RedisSink.rebuild`)."""

    def start(self) -> None:
        """Run in a daemon thread until `stop()`."""
        self._thread = threading.Thread(target=self.run, name="redis-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the batch in hand (or its current retry), leave the group, close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.redis.close()

    def consumer_options(self) -> dict[str, Any]:
        """Commits after each batch Redis took; a new group from the topics' start."""
        return {
            "group_id": self.group,
            "client_id": "gpuwatch-redis-writer",
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "max_poll_records": MAX_RECORDS,
            "fetch_min_bytes": FETCH_MIN_BYTES,
            "fetch_max_wait_ms": FETCH_WAIT_MS,
        }

    def step(self, consumer: Consumer) -> None:
        """One poll: its records and the pending live GPU states into Redis, then commit."""
        self._reconcile(consumer)
        polled = consumer.poll(timeout_ms=POLL_MS)
        moved = self._place_new_sample_partitions(consumer)
        batch: list[SinkRecord] = []
        positions: dict[str, int] = {}
        newest = 0
        for tp, messages in polled.items():
            if not messages or tp in moved:
                continue
            if tp.topic == self.samples_topic:
                newest = max(newest, self._observe_samples(messages))
                continue  # positions of the derived topics only: see `_reconcile`
            for m in messages:
                record = self._decode(m)
                if record is not None:
                    batch.append(record)
            positions[f"{tp.topic}:{tp.partition}"] = messages[-1].offset + 1
        states = self.live.take()
        if not positions and not states and not newest:
            if self._commit_due:
                self._commit(consumer)
            return
        if not self._write(batch, states, consumer, positions):
            self.live.put_back(states)
            return  # stopping with the batch unwritten: no commit, the next owner writes it
        self.newest_sample_ms = max(self.newest_sample_ms, newest)
        if positions or newest or self._commit_due:
            self._commit(consumer)

    def _commit(self, consumer: Consumer) -> None:
        """Commit the positions Redis has; one Kafka cannot take now is tried again at the
        next step even when no record comes (the group's lag would otherwise stay until the
        next one did). While the consumer rejoins its group the commit waits, and the loop
        polls on without pausing: its polls finish the rejoin (a pause after each refused
        commit kept a sink resumed after its session expired rejoining for minutes). The
        broker away raises, counted and retried by the loop."""
        self._commit_due = True
        try:
            consumer.commit()
        except self._kafka.rebalancing:
            now = self._monotonic()
            if self._rejoining_since is None:
                self._rejoining_since = now
            if now - self._rejoining_since < REJOIN_LIMIT_S:
                log.debug("redis writer: rejoining the group, the commit waits")
                return
            # kafka-python's consumer resumed after its session expired (a process held up,
            # SIGSTOP) was seen never to finish rejoining: it kept fetching, never joined,
            # and refused every commit, while the broker had dropped the group. A new
            # consumer joins anew and reads on from the commits; what this one wrote after
            # them is written again, equal upserts of what Redis holds.
            self.kafka_errors += 1
            self._rejoining_since = None
            log.warning(
                "redis writer: still rejoining its group after %.0f s: a new consumer joins it",
                REJOIN_LIMIT_S,
            )
            self.renew_consumer()
            return
        except self._kafka.commit_failed as exc:
            # The group went on without this consumer (the process was held up past its
            # session timeout): it rejoins at the next poll, and the records after the last
            # commit are read and written again, equal upserts of what Redis holds.
            self.kafka_errors += 1
            log.warning("redis writer: commit refused, the batch will be written again: %r", exc)
        self._commit_due = False
        self._rejoining_since = None

    def _reconcile(self, consumer: Consumer) -> None:
        """Read again what Redis lost (every few seconds): all of it after evictions, else
        where its stored positions are behind ours.

        Redis restarted from an older snapshot (or empty) holds less than the group's
        committed offsets say; the positions written with each batch tell how much less.
        """
        now = self._monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        assigned = consumer.assignment()
        try:
            rebuilt = self._rebuilt()  # from the first step on, assigned or not
            if not assigned:
                return
            stored = self.redis.positions(self.group)
        except SinkUnavailable:
            return  # the write that follows waits for Redis
        if rebuilt:
            self._read_all_again(consumer, assigned)
            return
        lost = False
        for tp in sorted(assigned):
            if tp.topic == self.samples_topic:
                continue  # live states come back with the next samples: nothing to re-read
            at = consumer.position(tp)
            kept = stored.get(f"{tp.topic}:{tp.partition}")
            if kept is None:
                start = consumer.beginning_offsets([tp])[tp]
                if at is not None and at > start:
                    log.warning(
                        "Redis holds nothing of topic=%s partition=%d: writing it again "
                        "from offset %d",
                        tp.topic, tp.partition, start,
                    )  # fmt: skip
                    consumer.seek(tp, start)
                    lost = True
            elif at is not None and kept < at:
                log.warning(
                    "Redis lost writes of topic=%s partition=%d: writing offsets %d..%d again",
                    tp.topic, tp.partition, kept, at - 1,
                )  # fmt: skip
                consumer.seek(tp, kept)
                lost = True
        if lost:
            self.rewrites["lost"] += 1

    def _rebuilt(self) -> bool:
        """Whether the group's keys were deleted since the last check, to be written anew;
        deletes them first if Redis evicted keys since then.

        An eviction can take any key: a pod's window totals and not the pod, a leaderboard
        and not its windows. The scripts build each key on the others, so what is left is
        deleted with what went and the topics are read again from the start. The eviction
        count is Redis's, all keys of the server: another application's evictions count
        too. Under steady memory pressure this repeats at each check that sees evictions:
        give Redis `maxmemory-policy noeviction` (a full Redis is waited for, nothing lost).
        """
        evictions = self.redis.evictions()
        last, self._evictions = self._evictions, evictions
        if last is not None and evictions[0] == last[0] and evictions[1] > last[1]:
            log.warning(
                "Redis evicted keys=%d: the sink's keys are deleted and written again from "
                "the topics (give Redis maxmemory-policy noeviction) target=%s",
                evictions[1] - last[1], self.redis.target,
            )  # fmt: skip
            generation = self.redis.rebuild(self.group, evictions)
        else:
            generation = self.redis.generation(self.group)
        known, self._generation = self._generation, generation
        # Lower: Redis lost the count with the rest (a restart, a flush): its positions say
        # what to read again.
        return known is not None and generation > known

    def _read_all_again(self, consumer: Consumer, assigned: set[Any]) -> None:
        """Every assigned partition from the start, the samples `LIVE_LOOKBACK_S` back."""
        self.rewrites["evicted"] += 1
        since_ms = int((self._wall() - LIVE_LOOKBACK_S) * 1000)
        for tp in sorted(assigned):
            if tp.topic == self.samples_topic:
                offset = self.offset_at(consumer, tp, since_ms)
            else:
                offset = consumer.beginning_offsets([tp])[tp]
            consumer.seek(tp, offset)
        log.warning(
            "redis writer: Redis's keys were deleted after evictions: partitions=%d read "
            "again from the start",
            len(assigned),
        )

    def _place_new_sample_partitions(self, consumer: Consumer) -> set[Any]:
        """Sample partitions just assigned that this group never committed, sought to
        `LIVE_LOOKBACK_S` back (the end when nothing is that recent): the partitions moved,
        whose records of this poll are dropped (read again from there)."""
        new, _ = self.assignment_changes(consumer)
        moved: set[Any] = set()
        for tp in sorted(new):
            if tp.topic != self.samples_topic or consumer.committed(tp) is not None:
                continue
            since_ms = int((self._wall() - LIVE_LOOKBACK_S) * 1000)
            offset = self.offset_at(consumer, tp, since_ms)
            consumer.seek(tp, offset)
            moved.add(tp)
            log.info(
                "redis writer: samples topic=%s partition=%d start at offset %d (%.0f s back)",
                tp.topic, tp.partition, offset, LIVE_LOOKBACK_S,
            )  # fmt: skip
        return moved

    def _observe_samples(self, messages: Sequence[Message]) -> int:
        """Node samples into the live GPU states; the end of the newest, epoch ms (0: none)."""
        newest = 0
        for m in messages:
            try:
                if m.value is None:
                    raise SchemaError(m.topic, "$", "no value (a tombstone)")
                sample: NvmlSample = NVML_SAMPLES.decode(m.value)
            except SchemaError as exc:
                self.samples_invalid += 1  # dead-lettered by the worker, with the reason
                log.debug("redis writer skips an invalid sample offset=%d: %s", m.offset, exc)
                continue
            self.live.observe(sample)
            self.samples += 1
            newest = max(newest, sample.ts + sample.interval_ms)
        return newest

    def _decode(self, m: Message) -> SinkRecord | None:
        spec = self._decoders.get(m.topic)
        try:
            if spec is None or m.value is None:
                raise SchemaError(m.topic, "$", "no value (a tombstone)")
            record: SinkRecord = spec.decode(m.value)
        except SchemaError as exc:
            self.invalid += 1
            log.error(
                "redis writer skips an invalid record topic=%s partition=%d offset=%d: %s",
                m.topic,
                m.partition,
                m.offset,
                exc,
            )
            return None
        return record

    def _write(
        self,
        batch: list[SinkRecord],
        live: list[GpuLive],
        consumer: Consumer,
        positions: dict[str, int],
    ) -> bool:
        """Write until Redis takes the batch, live states and positions; False when stopping."""
        pause = FIRST_PAUSE_S
        paused = False
        try:
            while True:
                try:
                    self.redis.apply(batch, (self.group, positions), live)
                    self.written += len(batch) + len(live)
                    return True
                except SinkRejected:
                    if self._one_by_one([*batch, *live]):
                        batch, live = [], []  # written one by one: the positions are left
                        continue
                except SinkUnavailable as exc:
                    self._kept(len(batch), exc)
                if not paused:
                    consumer.pause(*consumer.assignment())
                    paused = True
                if self._stop.wait(pause):
                    return False
                consumer.poll(timeout_ms=0)  # paused: fetches nothing, stays in the group
                pause = min(RETRY_CAP_S, pause * 2)
        finally:
            if paused:
                consumer.resume(*consumer.paused())

    def _one_by_one(self, batch: list[SinkRecord]) -> bool:
        """A batch Redis refused: its records alone, so one bad key costs one record.

        False when Redis went away meanwhile: the caller retries the whole batch, which
        rewrites the records already written to the same values.
        """
        for record in batch:
            try:
                self.redis.apply([record])
                self.written += 1
            except SinkRejected as exc:
                self.rejected += 1
                log.error("Redis refused a record %s: %s", _what(record), exc)
            except SinkUnavailable as exc:
                self._kept(len(batch), exc)
                return False
        return True

    def _kept(self, size: int, exc: SinkUnavailable) -> None:
        """Say (at most every `LOG_EVERY_S`) that a batch waits for Redis, and why."""
        self._warn(f"Redis unavailable reason={exc.reason}, batch of {size} kept: {exc}")

    def _warn(self, message: str) -> None:
        now = self._monotonic()
        if now >= self._next_log:
            self._next_log = now + LOG_EVERY_S
            log.warning("%s target=%s", message, self.redis.target)


def _what(record: SinkRecord) -> str:
    """A record's kind and identity, for a log line."""
    if isinstance(record, GpuLive):
        return f"live gpu={record.uuid}"
    if isinstance(record, GpuWindow):
        return f"{record.schema} gpu={record.uuid} window_start={record.window_start}"
    if isinstance(record, Alert):
        return f"{record.schema} fingerprint={record.fingerprint} ts={record.ts}"
    if isinstance(record, Capacity):
        return f"{record.schema} key={record.key()} ts={record.ts}"
    return f"{record.schema} uid={record.uid} ts={record.ts}"
