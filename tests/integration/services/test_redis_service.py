"""The local stack's Redis answers and keeps what is written, with expiry."""

from __future__ import annotations

import uuid

import pytest
import redis

from schemas.settings import Settings

pytestmark = pytest.mark.integration


def test_redis_round_trip_with_expiry(stack: Settings) -> None:
    client = redis.Redis.from_url(stack.redis.url.get_secret_value(), decode_responses=True)
    key = f"gpuwatch-test:pod:{uuid.uuid4()}"
    try:
        assert client.ping() is True
        with client.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"state": "running", "vram_bytes": "61203283968"})
            pipe.expire(key, 60)
            pipe.execute()
        assert client.hgetall(key) == {"state": "running", "vram_bytes": "61203283968"}
        assert 0 < client.ttl(key) <= 60
    finally:
        client.delete(key)
        client.close()
