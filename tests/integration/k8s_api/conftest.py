"""Fixtures of the watcher's tests against the in-process test API server (no Kafka): the
server, the real `kubernetes` client pointed at it, a poll with a deadline."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support import waiter

from producers.k8s.client import KubernetesApi
from producers.simulate.kube.apiserver import FakeApiServer

Wait = Callable[..., None]


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
