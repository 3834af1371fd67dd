"""Fixtures of the watcher's integration tests: the test API server, a kubeconfig for it,
topics of the test's own, a consumer, the JSON Schemas.

test_k8s_watcher_kafka.py keeps the in-process test server: it cuts watches and compacts
on cue, and reads the server's request log. test_k8s_watcher_real.py runs the command
against the real kube-apiserver of the local stack as its own service account;
test_k8s_watcher_restart.py restarts the watcher there, with a worker
(`tests/integration/worker/worker_fixtures.py`, put on the import path here)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from kafka.consumer.fetcher import ConsumerRecord
from support import free_port, waiter
from support.apiservers import LiveApiServer, live
from support.fake_apiserver import FakeApiServer
from topic_io import consume_all, scoped_topics

from schemas import K8S_NODES, K8S_PODS
from schemas.export import JSON_DIR
from schemas.settings import Settings

WORKER_HELPERS = Path(__file__).resolve().parent.parent / "worker"
if str(WORKER_HELPERS) not in sys.path:  # worker_fixtures, for the watcher-and-worker tests
    sys.path.insert(0, str(WORKER_HELPERS))

from worker_fixtures import StartWorker, worker_starter  # noqa: E402 - needs the path above


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def wait() -> Callable[..., None]:
    """`wait(predicate, what, timeout_s=30.0)`: poll until it holds, or fail naming `what`."""
    return waiter(default_timeout_s=30.0, interval_s=0.02)


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    return free_port


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval_s=0.2) as server:
        yield server


@pytest.fixture
def real(kube_stack: Settings) -> Iterator[LiveApiServer]:
    """The stack's kube-apiserver, emptied of pods, nodes, ReplicaSets and Jobs."""
    with live(kube_stack) as server:
        yield server


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[StartWorker]:
    """Start `gpuwatch worker` processes; every one is stopped (SIGTERM) after the test."""
    with worker_starter(tmp_path) as start:
        yield start


@pytest.fixture
def kubeconfig(apiserver: FakeApiServer, tmp_path: Path) -> Path:
    """A kubeconfig whose current context is the test API server (no credentials)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sim", "cluster": {"server": apiserver.url}}],
                "users": [{"name": "sim", "user": {}}],
                "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
                "current-context": "sim",
            }
        ),
        encoding="utf-8",
    )
    return path


@pytest.fixture
def scoped(stack: Settings, topic_prefix: str) -> Iterator[Settings]:
    """The stack's settings with topics of this test alone (3 partitions), deleted after."""
    yield from scoped_topics(stack, topic_prefix)


@pytest.fixture
def consume() -> Callable[[Settings, str], list[ConsumerRecord]]:
    return consume_all


@pytest.fixture(scope="session")
def validators() -> dict[str, Draft202012Validator]:
    """The committed JSON Schemas of the two topics, by topic name."""
    out = {}
    for spec in (K8S_PODS, K8S_NODES):
        document: dict[str, Any] = json.loads(
            (JSON_DIR / spec.json_schema_file).read_text(encoding="utf-8")
        )
        Draft202012Validator.check_schema(document)
        out[spec.name] = Draft202012Validator(document)
    return out
