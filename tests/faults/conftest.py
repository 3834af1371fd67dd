"""Fixtures of the fault tests: the worker and agent test helpers, worker processes, private Redis.

The fault tests drive the same processes as the worker's and the node agent's integration
tests, with their helpers (`tests/integration/worker/worker_fixtures.py`,
`tests/integration/agent/test_agent_broker_outage.py`), put on the import path here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE.parent / "integration" / "worker", HERE.parent / "integration" / "agent"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from fault_services import Persistence, PrivateRedis, StartRedis  # noqa: E402
from support import free_port  # noqa: E402
from worker_fixtures import StartWorker, worker_starter  # noqa: E402 - needs the path above


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[StartWorker]:
    """Start `gpuwatch worker` processes; every one is stopped (SIGTERM) after the test."""
    with worker_starter(tmp_path) as start:
        yield start


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[StartRedis]:
    """Start a redis-server of this test alone; every one is stopped after the test."""
    servers: list[PrivateRedis] = []

    def start(persistence: Persistence = "none") -> PrivateRedis:
        workdir = tmp_path / f"redis-{len(servers)}"
        workdir.mkdir()
        server = PrivateRedis(free_port(), workdir, persistence)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
