"""The worker's bounded stop: a stop that hangs past its timeout ends the process."""

from __future__ import annotations

import threading

import pytest

from gpuwatch.run import worker


def test_a_stop_that_hangs_ends_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    forced = threading.Event()
    stopped: list[bool] = []
    monkeypatch.setattr(worker, "STOP_TIMEOUT_S", 0.01)
    monkeypatch.setattr(worker, "_force_exit", forced.set)
    worker._bounded(lambda: stopped.append(True))()
    assert stopped == [True]
    assert forced.wait(5)
