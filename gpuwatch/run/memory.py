"""Hands the heap's free pages back to the system every few seconds (glibc's `malloc_trim`).

A worker working a backlog off allocates and frees hundreds of megabytes of message
buffers (5-6 kB node samples, produce batches, state documents), which glibc's allocator
keeps in its heap: the process's RSS, the figure a Kubernetes memory limit is held to,
stays at the peak long after the memory was freed. `malloc_trim(0)` returns the free pages
of every arena (about a tenth of a busy worker's RSS in `gpuwatch bench worker`). Where the
C library has no `malloc_trim` (musl, macOS) nothing is done.

The cyclic garbage collector is tuned for the same processes (`tune_collector`): what is
loaded at the start (modules, the app) is frozen out of its passes, and its youngest
generation is collected every 20,000 container allocations instead of every 700. A worker
holds millions of small state objects (40,000 pods, their windows and integrals) and
replaces many on every sample; with the default thresholds the collector walked them
every few seconds, a fifth of the processing's CPU (`python -m gpuwatch.harness.bench.core`).
Nothing of ours makes reference cycles in the hot path, so the cycles the collector finds
(asyncio's and Faust's, a few) are only found later.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
from collections.abc import Callable

__all__ = ["GC_THRESHOLDS", "TRIM_EVERY_S", "start_trimming", "tune_collector"]

log = logging.getLogger(__name__)

TRIM_EVERY_S = 10.0  # a call costs a few milliseconds on a heap of hundreds of megabytes
GC_THRESHOLDS = (20_000, 20, 10)  # CPython's defaults: (700, 10, 10)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def start_trimming(every_s: float = TRIM_EVERY_S) -> Callable[[], None]:
    """Trim the heap every `every_s` seconds from a daemon thread; the function that stops it."""
    trim = _malloc_trim()
    stop = threading.Event()
    if trim is None:
        log.debug("no malloc_trim in this C library: the heap is not trimmed")
        return stop.set

    def run() -> None:
        while not stop.wait(every_s):
            trim(0)

    threading.Thread(target=run, name="heap-trim", daemon=True).start()
    return stop.set


def tune_collector(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> Callable[[], None]:
    """Freeze what is loaded so far out of the collector's passes and set its thresholds;
    the function that puts both back as they were."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)

    def restore() -> None:
        gc.set_threshold(*previous)
        gc.unfreeze()

    return restore
