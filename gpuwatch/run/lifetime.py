"""A process that must not outlive the one that started it (the demo's children).

The starter puts its pid in `GPUWATCH_DIE_WITH_PARENT`; the child, first thing, asks the
kernel for SIGTERM when that parent dies, however it dies, SIGKILL included (Linux's
`prctl(PR_SET_PDEATHSIG)`), and leaves at once if the parent is gone already. Armed by
the child itself, not in a `preexec_fn` between fork and exec, which is not safe in a
process with threads. Elsewhere than on Linux it does nothing: the starter's own stop
still runs on every way out it sees.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping

__all__ = ["PARENT_ENV", "die_with_parent"]

PARENT_ENV = "GPUWATCH_DIE_WITH_PARENT"
PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(env: Mapping[str, str] = os.environ) -> bool:
    """Arm the parent-death signal where `GPUWATCH_DIE_WITH_PARENT` names the parent;
    whether it was armed. Exits (status 1) when that parent has already gone."""
    raw = env.get(PARENT_ENV)
    if not raw or not raw.isdigit():
        return False
    armed = False
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        armed = int(libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)) == 0
    if os.getppid() != int(raw):  # the parent died before the signal was armed
        raise SystemExit(1)
    return armed
