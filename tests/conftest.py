"""Shared fixtures: the settings in force, the real local stack and scoped topics on it."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator

import pytest
from support import threads_left
from topic_io import NewScope, topic_scopes

from gpuwatch.config import load_settings
from schemas.settings import Settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The settings a user running the tests has (environment and defaults)."""
    return load_settings()


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Settings:
    """The local stack, started unless it already runs (`gpuwatch stack up` is idempotent)."""
    from gpuwatch.harness.stack import manager

    def progress(message: str) -> None:
        print(f"stack: {message}", file=sys.stderr)

    manager.up(settings, progress)
    return settings


@pytest.fixture(scope="session")
def kube_stack(stack: Settings) -> Settings:
    """The local stack with its Kubernetes API server (etcd, kube-apiserver), started unless
    it runs; the first time the API server is built (minutes)."""
    from gpuwatch.harness.stack import manager

    def progress(message: str) -> None:
        print(f"stack: {message}", file=sys.stderr)

    manager.up(stack, progress, kube=True)
    return stack


@pytest.fixture
def topic_prefix() -> str:
    """A topic prefix of this test alone, so runs and tests never share topics."""
    return f"gwtest-{uuid.uuid4().hex[:10]}."


@pytest.fixture
def new_scope(stack: Settings) -> Iterator[NewScope]:
    """Settings with a topic prefix and app id of their own, topics created; deleted after."""
    with topic_scopes(stack) as scope:
        yield scope


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    """Fail a test that leaves a thread running (a watch, a publisher, a Kafka client's I/O
    thread, an API server); folders whose tests start threads use it for every test."""
    before = set(threading.enumerate())
    yield
    left = threads_left(before, timeout_s=10)
    assert not left, f"threads left running: {sorted(t.name for t in left)}"
