"""Hands the heap's free pages back to the system every few seconds (glibc's `malloc_trim`).

A worker working a backlog off allocates and frees hundreds of megabytes of message
buffers (5-6 kB node samples, produce batches, state documents), which glibc's allocator
keeps in its heap: the process's RSS, the figure a Kubernetes memory limit is held to,
stays at the peak long after the memory was freed. `malloc_trim(0)` returns the free pages
of every arena (about a tenth of a busy worker's RSS in `gpuwatch bench worker`). Where the
C library has no `malloc_trim` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

__all__ = ["TRIM_EVERY_S", "start_trimming"]

log = logging.getLogger(__name__)

TRIM_EVERY_S = 10.0  # a call costs a few milliseconds on a heap of hundreds of megabytes


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
