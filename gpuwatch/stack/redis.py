"""The local Redis: one redis-server on loopback, with modest snapshotting."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gpuwatch.stack.processes import Which, require_binary
from gpuwatch.stack.service import HOST, Daemon, Progress, StackPaths
from schemas.settings import Settings

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 15.0  # redis saves its snapshot on SIGTERM before it exits


def render_redis_conf(*, port: int, data_dir: Path) -> str:
    """redis.conf of the local stack."""
    lines = [
        "# Written by `gpuwatch stack up` at every start; edits are overwritten.",
        f"bind {HOST}",
        f"port {port}",
        "protected-mode yes",
        "daemonize no",
        "# Logs go to stdout, which the stack writes to <state>/logs/redis.log.",
        'logfile ""',
        "loglevel notice",
        f'dir "{data_dir}"',
        "dbfilename dump.rdb",
        "# Live state is rebuilt from Kafka; a snapshot every 5 minutes after 100 writes",
        "# (and at shutdown) keeps restarts warm without much disk traffic.",
        "save 300 100",
        "appendonly no",
        "# A failed background save must not turn the live-state store read-only.",
        "stop-writes-on-bgsave-error no",
    ]
    return "\n".join(lines) + "\n"


class RedisService:
    """Checks, prepares and probes the local redis-server of one state directory."""

    def __init__(self, settings: Settings, paths: StackPaths, which: Which = shutil.which):
        self.port = settings.stack.redis_port
        self.which = which
        self.home = paths.service_dir("redis")
        self.config = self.home / "redis.conf"
        self.binary = "redis-server"

    def check(self) -> None:
        """redis-server must be installed."""
        self.binary = require_binary("redis-server", self.which)

    def prepare(self, progress: Progress) -> list[str]:
        """Write redis.conf; the command line."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.config.write_text(render_redis_conf(port=self.port, data_dir=self.home), "utf-8")
        return [self.binary, str(self.config)]

    def probe(self) -> bool:
        """True when PING on the port answers PONG."""
        return probe(HOST, self.port)


def daemon(settings: Settings, paths: StackPaths, which: Which = shutil.which) -> Daemon:
    """The local Redis as a service of the stack."""
    service = RedisService(settings, paths, which)
    return Daemon(
        name="redis",
        port=service.port,
        check=service.check,
        prepare=service.prepare,
        probe=service.probe,
        workdir=service.home,
        stop_timeout_s=STOP_TIMEOUT_S,
    )


def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when a Redis on host:port answers PING."""
    client = redis.Redis(
        host=host,
        port=port,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),  # one question; redis-py retries 3 times by default
    )
    try:
        return client.ping() is True
    except (redis.RedisError, OSError) as exc:
        log.debug("redis probe failed address=%s:%d error=%r", host, port, exc)
        return False
    finally:
        client.close()
