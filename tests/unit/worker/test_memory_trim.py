"""The heap trimmer finds glibc's malloc_trim here and does nothing where there is none; the
collector's tuning is applied and undone."""

from __future__ import annotations

import ctypes.util
import gc

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


def test_the_collector_is_tuned_and_put_back() -> None:
    before = gc.get_threshold()
    restore = memory.tune_collector((12_345, 7, 3))
    try:
        assert gc.get_threshold() == (12_345, 7, 3)
        assert gc.get_freeze_count() > 0  # what was loaded is out of the collector's passes
    finally:
        restore()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
