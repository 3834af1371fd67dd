"""The scratch space of a bench run: its own topics, app id and Redis database, removed after."""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gpuwatch.harness.bench.probes import floor_groups
from gpuwatch.kafka import admin, create_topics
from schemas.settings import Settings
from sinks.redis import client as redis_client
from sinks.redis.writer import redis_group

__all__ = ["cleanup", "create", "flush", "redis_url", "scope", "space"]


def redis_url(settings: Settings, db: int) -> str:
    """The settings' Redis URL on database `db`."""
    parts = urlsplit(settings.redis.url.get_secret_value())
    return urlunsplit(parts._replace(path=f"/{db}"))


def flush(url: str) -> None:
    """Empty the Redis database of `url`."""
    client = redis_client.connect(url, timeout_s=10)
    try:
        client.flushdb()
    finally:
        client.close()


def scope(settings: Settings) -> Settings:
    """The settings on a topic prefix and an app id of their own."""
    tag = uuid.uuid4().hex[:8]
    kafka = settings.kafka.model_copy(
        update={"topic_prefix": f"gpuwatch-bench-{tag}.", "app_id": f"gpuwatch-bench-{tag}"}
    )
    return settings.model_copy(update={"kafka": kafka})


def create(scoped: Settings) -> None:
    """Create the scope's topics; RuntimeError when one is not."""
    rows = create_topics(scoped)
    if not all(row.ok for row in rows):
        raise RuntimeError(f"topics not created: {rows}")


def cleanup(scoped: Settings) -> None:
    """Delete every topic under the scope's prefix and its consumer groups."""
    kafka = scoped.kafka
    client = admin(kafka, client_id="gpuwatch-bench")
    try:
        names = [n for n in client.list_topics() if n.startswith(kafka.topic_prefix)]
        if names:
            client.delete_topics(names)
        known = {g["group_id"] for g in client.list_groups()}
        mine = (kafka.app_id, redis_group(scoped), *floor_groups(scoped))
        if groups := [g for g in mine if g in known]:
            client.delete_groups(groups)
    finally:
        client.close()


@contextmanager
def space(settings: Settings, redis_url: str) -> Iterator[tuple[Settings, Path]]:
    """A scope with its topics created and a temporary directory for logs, Redis flushed;
    the topics, groups and Redis emptied again at the end, the directory removed unless
    the bench failed."""
    scoped = scope(settings)
    flush(redis_url)
    try:
        create(scoped)
        tmp = Path(tempfile.mkdtemp(prefix="gpuwatch-bench-"))
        try:
            yield scoped, tmp
        except BaseException:
            sys.stderr.write(f"bench: the processes' logs are kept in {tmp}\n")
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        cleanup(scoped)
        flush(redis_url)
