"""The local Redis: one redis-server on loopback, with modest snapshotting."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from gpuwatch.harness.stack.processes import require_binary
from gpuwatch.harness.stack.service import HOST, LocalService, Progress, StackPaths, Which
from schemas.settings import Settings
from sinks.redis import client as redis_client

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


class RedisService(LocalService):
    """Checks, prepares and probes the local redis-server of one state directory."""

    name = "redis"
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(self, settings: Settings, paths: StackPaths, which: Which = shutil.which):
        super().__init__(paths, which, settings.stack.redis_port)
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


def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when a Redis on host:port answers PING."""
    client = redis_client.connect_to(
        host,
        port,
        timeout_s=timeout_s,
        connect_timeout_s=timeout_s,
        retries=0,  # one question; redis-py retries 3 times by default
    )
    try:
        return client.ping() is True
    except (redis_client.RedisError, OSError) as exc:
        log.debug("redis probe failed address=%s:%d error=%r", host, port, exc)
        return False
    finally:
        client.close()
