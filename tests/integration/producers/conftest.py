"""Fixtures of the node agent's adapters: a fake kubelet on a unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kubelet import Serve, serving


@pytest.fixture
def sock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A socket path short enough for AF_UNIX (108 bytes) under pytest's temp root."""
    return tmp_path_factory.mktemp("kl") / "kubelet.sock"


@pytest.fixture
def serve(sock: Path) -> Iterator[Serve]:
    """Start a real gRPC server with a servicer on the socket; stopped after the test."""
    with serving(sock) as start:
        yield start
