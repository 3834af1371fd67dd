"""The Redis writer on the local stack's Kafka and a private redis-server that refuses writes
for a while (full, a failed snapshot, a read-only replica) or evicts keys: nothing is
committed past a refused batch, each refusal is counted by its reason, and once Redis takes
writes again it holds what the topics say; evicted keys are noticed and written anew."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr
from support import free_port, wait_until
from test_capacity_sinks import running
from test_redis_sink_private import PREFIX, PrivateRedis, batches, dump

from gpuwatch import kafka
from gpuwatch.harness.examples import POD_UID
from gpuwatch.run.sink import redis_writer
from schemas.settings import RedisSettings, Settings
from schemas.topics import ALERTS, ATTRIBUTION, POD_LIFECYCLE
from sinks.redis.plan import SinkRecord
from sinks.redis.sink import Backoff, RedisSink
from sinks.redis.writer import RedisWriter

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0  # a consumer group's first join and a few retries on a loaded machine
SPECS = {spec.value_type: spec for spec in (POD_LIFECYCLE, ATTRIBUTION, ALERTS)}


def produce(scoped: Settings, records: list[SinkRecord]) -> None:
    """`records` into the scope's derived topics, keyed as the worker keys them."""
    producer = kafka.producer(scoped.kafka, acks="all")
    try:
        for record in records:
            spec: Any = SPECS[type(record)]
            key = spec.key_of(record).encode()
            producer.send(
                spec.full_name(scoped.kafka.topic_prefix), key=key, value=spec.encode(record)
            )
        producer.flush(timeout=30)
    finally:
        producer.close()


def committed(scoped: Settings, group: str) -> int:
    """How many records of the derived topics `group` has committed."""
    admin = kafka.admin(scoped.kafka)
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    prefix = scoped.kafka.topic_prefix
    return sum(o.offset for tp, o in offsets.items() if tp.topic.startswith(prefix))


def written(client: redis.Redis) -> dict[str, Any]:
    """The records' keys (the writer's own positions and rebuild keys left out)."""
    return {k: v for k, v in dump(client).items() if not k.startswith(f"{PREFIX}sink:")}


def expected(port: int, records: list[SinkRecord]) -> dict[str, Any]:
    """What Redis holds once it took `records`: written straight to an empty database 1."""
    url = f"redis://127.0.0.1:{port}/1"
    with RedisSink(RedisSettings(url=SecretStr(url)), key_prefix=PREFIX) as sink:
        sink.apply(records)
    client = redis.Redis(port=port, db=1, decode_responses=True)
    try:
        state = written(client)
        client.flushdb()
        return state
    finally:
        client.close()


class Run:
    """A writer of a scope of its own on the private Redis's database 0, running."""

    def __init__(self, scoped: Settings, server: PrivateRedis) -> None:
        self.scoped = scoped
        url = f"redis://127.0.0.1:{server.port}/0"
        # Quick retries: a refusal is seen within seconds and so is its end.
        backoff = Backoff(base_s=0.05, cap_s=0.5, budget_s=2.0)
        sink = RedisSink(RedisSettings(url=SecretStr(url)), key_prefix=PREFIX, backoff=backoff)
        self.writer: RedisWriter = redis_writer(scoped, redis_sink=sink)
        self.client = redis.Redis(port=server.port, decode_responses=True)
        self.stop = running(self.writer)

    def converged(self, want: dict[str, Any], records: int) -> None:
        """Wait until Redis holds `want` and the group committed `records` records."""
        wait_until(
            lambda: (
                written(self.client) == want
                and committed(self.scoped, self.writer.group) == records
            ),
            timeout_s=DEADLINE_S,
            what=f"Redis to hold the {records} records and the group to commit them",
        )

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.writer.redis.close()
            self.client.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private redis-server whose data directory is `tmp_path/data`."""
    (tmp_path / "data").mkdir()
    started = PrivateRedis(tmp_path, "--dir", str(tmp_path / "data"))
    started.start()
    yield started
    started.kill()


def snapshot(client: redis.Redis, status: str) -> None:
    """Take a snapshot in the background and wait until it ends in `status` (ok, err)."""
    client.bgsave()
    wait_until(
        lambda: client.info("persistence")["rdb_last_bgsave_status"] == status,
        timeout_s=10,
        what=f"a snapshot to end in {status}",
    )


def refuse(client: redis.Redis, how: str, data: Path) -> None:
    """Make Redis refuse writes: full (noeviction), a snapshot that failed, a replica."""
    if how == "oom":
        client.config_set("maxmemory", "1")  # the policy is noeviction by default
    elif how == "misconf":
        client.config_set("save", "3600 1")  # MISCONF needs snapshots configured
        client.config_set("stop-writes-on-bgsave-error", "yes")
        (data / "dump.rdb" / "in-the-way").mkdir(parents=True)  # the snapshot cannot land
        snapshot(client, "err")
    else:
        client.replicaof("127.0.0.1", str(free_port()))  # a primary that never answers


def accept(client: redis.Redis, how: str, data: Path) -> None:
    """What an operator does to make Redis take writes again."""
    if how == "oom":
        client.config_set("maxmemory", "0")
    elif how == "misconf":
        shutil.rmtree(data / "dump.rdb")
        snapshot(client, "ok")
    else:
        client.replicaof("NO", "ONE")


@pytest.mark.parametrize("how", ["oom", "misconf", "readonly"])
def test_a_refused_batch_is_kept_uncommitted_and_written_once_redis_takes_writes(
    how: str, new_scope: Any, server: PrivateRedis, tmp_path: Path
) -> None:
    first, second, third = batches()
    scoped = new_scope()
    want_before = expected(server.port, [*first, *second])
    want_after = expected(server.port, [*first, *second, *third])
    produce(scoped, [*first, *second])
    run = Run(scoped, server)
    try:
        run.converged(want_before, len(first) + len(second))
        refuse(run.client, how, tmp_path / "data")
        produce(scoped, third)
        wait_until(
            lambda: run.writer.redis.errors[how] >= 3,
            timeout_s=DEADLINE_S,
            what=f"the writer to count Redis's refusals as {how}",
        )
        # Refused: nothing of the batch in Redis, nothing of it committed.
        assert written(run.client) == want_before
        assert committed(scoped, run.writer.group) == len(first) + len(second)
        accept(run.client, how, tmp_path / "data")
        run.converged(want_after, len(first) + len(second) + len(third))
    finally:
        run.close()
    assert (run.writer.rejected, run.writer.invalid) == (0, 0)
    assert set(run.writer.redis.errors) == {how}


def test_evicted_and_flushed_keys_are_noticed_and_written_again(
    new_scope: Any, server: PrivateRedis
) -> None:
    records = [record for batch in batches() for record in batch]
    scoped = new_scope()
    want = expected(server.port, records)
    produce(scoped, records)
    run = Run(scoped, server)
    client = run.client
    try:
        run.converged(want, len(records))
        # Evicting Redis, a little over its limit: it evicts the one key with an expiry,
        # the running pod's window totals (its pod hash stays).
        for key in client.scan_iter(f"{PREFIX}*"):
            client.persist(key)  # the finished pod's keys
        totals = f"{PREFIX}pod:{POD_UID}:windows"
        assert client.expire(totals, 3600)
        client.config_set("maxmemory-policy", "volatile-random")
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) - 1000))
        wait_until(
            lambda: client.info("stats")["evicted_keys"] > 0,
            timeout_s=10,
            what="Redis to evict keys",
        )
        client.config_set("maxmemory", "0")
        left = written(client)
        assert totals not in left
        assert f"{PREFIX}pod:{POD_UID}" in left
        run.converged(want, len(records))
        assert run.writer.rewrites["evicted"] == 1
        client.flushdb()  # all of it gone: the positions say so
        run.converged(want, len(records))
        assert run.writer.rewrites["lost"] >= 1
    finally:
        run.close()
    assert run.writer.rejected == 0
    assert dict(run.writer.rewrites) == {"evicted": 1, "lost": run.writer.rewrites["lost"]}
