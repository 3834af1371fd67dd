"""The heap trimmer finds glibc's malloc_trim here and does nothing where there is none."""

from __future__ import annotations

import ctypes.util

import pytest

from gpuwatch.run import memory


def test_glibc_has_malloc_trim_and_it_runs() -> None:
    trim = memory._malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)  # 1: memory was released, 0: there was none to release


def test_without_a_c_library_nothing_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    stop = memory.start_trimming(every_s=0.01)
    stop()  # no thread was started: nothing to wait for
    assert memory._malloc_trim() is None
