"""Helpers every test folder shares: waiting with a deadline, threads left behind, free ports,
commands run with their output captured.

`tests/` is on the import path (pytest puts the folder of `tests/conftest.py` there), so a
test imports them as `from support import wait_until`.
"""

from support.commands import reaped, run_command
from support.ports import free_port, free_ports
from support.waiting import WaitTimeoutError, holds_within, threads_left, wait_until, waiter

__all__ = [
    "WaitTimeoutError",
    "free_port",
    "free_ports",
    "holds_within",
    "reaped",
    "run_command",
    "threads_left",
    "wait_until",
    "waiter",
]
