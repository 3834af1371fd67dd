"""Services of the fault tests' own: a redis-server of one test."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Literal

Persistence = Literal["none", "snapshot", "aof"]
"""none: memory only; snapshot: the local stack's own (`save 300 100`, and at shutdown);
aof: an append-only file synced on every write."""

StartRedis = Callable[..., "PrivateRedis"]
"""The `private_redis` fixture: `start(persistence="none") -> PrivateRedis`, running."""

PERSISTENCE: dict[Persistence, list[str]] = {
    "none": ["--save", "", "--appendonly", "no"],
    "snapshot": ["--save", "300 100", "--appendonly", "no"],
    "aof": ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
}


class PrivateRedis:
    """A redis-server of one test on a port of its own; `start()` again after a stop."""

    def __init__(self, port: int, workdir: Path, persistence: Persistence) -> None:
        self.port = port
        self.workdir = workdir
        self.persistence = persistence
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server on its port and directory (a restart reads what it persisted)."""
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--dir", str(self.workdir), *PERSISTENCE[self.persistence]]
        with (self.workdir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL the server and wait for it: a crash, nothing saved on the way out."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM the server and wait: it saves its snapshot first when it keeps one."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
