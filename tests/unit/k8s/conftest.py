"""Fixtures of the watcher's tests: recorded API objects, the test API server, a client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import waiter

from producers.k8s.client import KubernetesApi
from producers.simulate.kube.apiserver import FakeApiServer

FIXTURES = Path(__file__).parent / "fixtures"

Wait = Callable[..., None]


def load(name: str) -> dict[str, Any]:
    """A recorded object from fixtures/ (`pod-evicted`)."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


@pytest.fixture
def fixture() -> Callable[[str], dict[str, Any]]:
    return load


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def wait() -> Wait:
    """`wait(predicate, what, timeout_s=10.0)`: poll until it holds, or fail naming `what`."""
    return waiter(default_timeout_s=10.0, interval_s=0.01)


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    """The test API server, bookmarks every 100 ms."""
    with FakeApiServer(bookmark_interval_s=0.1) as server:
        yield server


@pytest.fixture
def kube(apiserver: FakeApiServer) -> Iterator[KubernetesApi]:
    """The real `kubernetes` client pointed at the test API server."""
    api = KubernetesApi.for_host(apiserver.url)
    yield api
    api.close()
