"""Fixtures of the replay integration tests: scoped topics, a private Redis, the CLI in-process."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

# The worker tests' helpers (a simulated node's 90 s, producing, scoped topics) serve here too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

from support import free_port, wait_until
from topic_io import delete_prefixed

from gpuwatch.cli import main
from schemas.settings import Settings

RunCli = Callable[..., tuple[int, str, str]]
"""`run(settings, *args) -> (exit status, stdout, stderr)` of `gpuwatch replay ...`."""


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (a Kafka client's I/O thread; tests/conftest.py)."""


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> RunCli:
    """`gpuwatch --topic-prefix <scope> replay ...` in this process, its output captured."""

    def run(settings: Settings, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--topic-prefix", settings.kafka.topic_prefix, "replay", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def prefix_cleanup(stack: Settings) -> Iterator[list[str]]:
    """Prefixes whose topics (internal ones too) are deleted after the test."""
    prefixes: list[str] = []
    yield prefixes
    delete_prefixed(stack, prefixes)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[int]:
    """A Redis server of this test alone, so no database of the shared one is written."""
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(tmp_path)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(port=port)
    try:
        wait_until(
            client.ping,
            timeout_s=20,
            what="the private redis-server to answer",
            interval_s=0.1,
            not_yet=(redis.ConnectionError,),
        )
        yield port
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=10)


@dataclass
class Sandbox:
    """Where a rerun may write: a private Redis (live = db 0), logs in tmp, prefixes to delete."""

    redis_port: int
    logs: Path
    prefixes: list[str]


@pytest.fixture
def sandbox(
    private_redis: int,
    prefix_cleanup: list[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Sandbox:
    """The live Redis is the private one's db 0; the worker's log goes to tmp_path."""
    monkeypatch.setenv("GPUWATCH_REDIS_URL", f"redis://127.0.0.1:{private_redis}/0")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return Sandbox(private_redis, tmp_path, prefix_cleanup)
