"""Fixtures of the watcher's tests against an API server (no Kafka): the server, the real
`kubernetes` client pointed at it, a poll with a deadline.

Every test runs twice: against the in-process test API server and against the real
kube-apiserver of the local stack (`gpuwatch stack up --kube`). A test marked
`test_server_only` runs against the test server alone; its mark says why (a fault the
real server cannot be made to show on cue, such as a connection cut mid-stream).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import waiter
from support.apiservers import LiveApiServer, UncachedApiServer, live
from support.fake_apiserver import FakeApiServer

from gpuwatch.harness.stack import kube as stack_kube
from producers.k8s.client import KubernetesApi
from schemas.settings import Settings

Wait = Callable[..., None]
TEST_SERVER = "test-server"
KUBE_APISERVER = "kube-apiserver"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`apiserver`: both servers, or the test server alone for `test_server_only` tests."""
    if "apiserver" not in metafunc.fixturenames:
        return
    only = metafunc.definition.get_closest_marker("test_server_only")
    servers = [TEST_SERVER] if only else [TEST_SERVER, KUBE_APISERVER]
    metafunc.parametrize("apiserver", servers, indirect=True)


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def wait() -> Wait:
    """`wait(predicate, what, timeout_s=10.0)`: poll until it holds, or fail naming `what`."""
    return waiter(default_timeout_s=10.0, interval_s=0.01)


@pytest.fixture
def apiserver(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The test API server (bookmarks every 100 ms), or the stack's kube-apiserver emptied
    of pods, nodes, ReplicaSets and Jobs."""
    if request.param == TEST_SERVER:
        with FakeApiServer(bookmark_interval_s=0.1) as server:
            yield server
        return
    settings: Settings = request.getfixturevalue("kube_stack")
    with live(settings) as real:
        yield real


@pytest.fixture
def kube(apiserver: FakeApiServer | LiveApiServer) -> Iterator[KubernetesApi]:
    """The real `kubernetes` client pointed at the server."""
    if isinstance(apiserver, LiveApiServer):
        api = apiserver.client()
    else:
        api = KubernetesApi.for_host(apiserver.url)
    yield api
    api.close()


@pytest.fixture
def real(kube_stack: Settings) -> Iterator[LiveApiServer]:
    """The stack's kube-apiserver (with its watch cache, as clusters run it), emptied."""
    with live(kube_stack) as server:
        yield server


@pytest.fixture
def uncached(kube_stack: Settings, tmp_path: Path) -> Iterator[LiveApiServer]:
    """A kube-apiserver over the stack's etcd without the watch cache."""
    credentials = stack_kube.credentials(kube_stack)
    with UncachedApiServer(kube_stack, credentials, tmp_path / "uncached") as server:
        server.reset()
        yield server
