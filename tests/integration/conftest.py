"""Fixtures of the integration tests that read and write the local stack's Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from schemas.settings import Settings


@pytest.fixture(scope="module")
def client(stack: Settings) -> Iterator[redis.Redis]:
    """A client of the local stack's Redis, answers decoded to str."""
    conn = redis.Redis.from_url(stack.redis.url.get_secret_value(), decode_responses=True)
    yield conn
    conn.close()


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    """A Redis key prefix of this test alone; its keys are deleted after the test."""
    name = f"gwtest-{uuid.uuid4().hex[:10]}:"
    yield name
    keys = list(client.scan_iter(f"{name}*", count=1000))
    if keys:
        client.delete(*keys)
