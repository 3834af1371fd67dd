"""Unit tests are pure: one that starts a thread or opens a socket fails, naming what it
tried. Such a test belongs under tests/integration; subprocesses (code generation, the
schema export) are allowed."""

from __future__ import annotations

import socket
import threading
from typing import NoReturn

import pytest

SOCKET_CALLS = ("bind", "connect", "connect_ex", "sendto")  # each one reaches an address
WHERE = "tests/unit is pure (no thread, socket or server): move the test to tests/integration"


def _start(thread: threading.Thread) -> NoReturn:
    raise AssertionError(f"a unit test started a thread ({thread.name}); {WHERE}")


def _socket_call(call: str) -> object:
    def refuse(sock: socket.socket, *args: object) -> NoReturn:
        address = args[-1] if args else None  # sendto(data, [flags,] address)
        raise AssertionError(f"a unit test called socket.{call}({address!r}); {WHERE}")

    return refuse


@pytest.fixture(scope="session", autouse=True)
def _font_list() -> None:
    """matplotlib's font list, before any test: the first import on a machine builds it and
    starts a timer thread that only logs if that takes long (the plot tests draw PNGs)."""
    import matplotlib.font_manager  # noqa: F401


@pytest.fixture(autouse=True)
def _pure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here: no thread started, no socket bound, connected or sent from."""
    monkeypatch.setattr(threading.Thread, "start", _start)
    for call in SOCKET_CALLS:
        monkeypatch.setattr(socket.socket, call, _socket_call(call))
