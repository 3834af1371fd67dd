"""The one redis-py client factory, and the redis-py types and errors its callers need.

Every Redis client of gpuwatch (the sink, `gpuwatch top`, the stack's probe, the
benchmarks) is built here, so that redis-py is imported by this package alone. Options
left out keep redis-py's defaults.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

__all__ = [
    "AuthenticationError",
    "BusyLoadingError",
    "ClusterDownError",
    "NoScriptError",
    "OutOfMemoryError",
    "ReadOnlyError",
    "Redis",
    "RedisConnectionError",
    "RedisError",
    "RedisTimeoutError",
    "ResponseError",
    "TryAgainError",
    "connect",
    "connect_to",
]


def connect(
    url: str,
    *,
    timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
    retries: int | None = None,
    decode_responses: bool = False,
) -> Redis:
    """A client of the Redis at `url` (`redis://`, `rediss://`, `unix://`).

    `timeout_s` bounds each socket read and write, `connect_timeout_s` each connect
    (None: no limit). `retries`: how many times redis-py resends a command after a
    connection error, without waiting (None: redis-py's own retry policy; 0 when the
    caller's loop decides).
    """
    return Redis.from_url(url, **_options(timeout_s, connect_timeout_s, retries, decode_responses))


def connect_to(
    host: str,
    port: int,
    *,
    timeout_s: float | None = None,
    connect_timeout_s: float | None = None,
    retries: int | None = None,
) -> Redis:
    """A client of the Redis on `host`:`port`, database 0; the options as for `connect`."""
    return Redis(host=host, port=port, **_options(timeout_s, connect_timeout_s, retries, False))


def _options(
    timeout_s: float | None,
    connect_timeout_s: float | None,
    retries: int | None,
    decode_responses: bool,
) -> dict[str, Any]:
    """redis-py's keyword arguments for the options given (the rest left to its defaults)."""
    options: dict[str, Any] = {}
    if timeout_s is not None:
        options["socket_timeout"] = timeout_s
    if connect_timeout_s is not None:
        options["socket_connect_timeout"] = connect_timeout_s
    if retries is not None:
        options["retry"] = Retry(NoBackoff(), retries)
    if decode_responses:
        options["decode_responses"] = True
    return options
