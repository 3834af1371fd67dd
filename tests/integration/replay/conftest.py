"""Fixtures of the replay integration tests: scoped topics, a private Redis, the CLI in-process."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from kafka import KafkaAdminClient

# The worker tests' helpers (a simulated node's 90 s, producing, scoped topics) serve here too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

from worker_fixtures import NewScope, topic_scopes

from gpuwatch.cli import main
from schemas.settings import Settings

RunCli = Callable[..., tuple[int, str, str]]
"""`run(settings, *args) -> (exit status, stdout, stderr)` of `gpuwatch replay ...`."""


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Fail a test that leaves a thread running (a Kafka client's I/O thread)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 10
    while (left := set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"threads left running: {sorted(t.name for t in left)}"


@pytest.fixture
def new_scope(stack: Settings) -> Iterator[NewScope]:
    """Settings with a topic prefix and app id of their own, topics created; deleted after."""
    with topic_scopes(stack) as scope:
        yield scope


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
    admin = KafkaAdminClient(**stack.kafka.client_options())
    try:
        names = [n for n in admin.list_topics() if n.startswith(tuple(prefixes))]
        if names:
            admin.delete_topics(names)
    finally:
        admin.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[int]:
    """A Redis server of this test alone, so no database of the shared one is written."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(tmp_path)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the private redis-server did not answer"
                time.sleep(0.1)
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
