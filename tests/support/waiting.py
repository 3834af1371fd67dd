"""Polling with a deadline: the one way a test waits for what another thread or process does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """What `wait_until` waited for did not come before its deadline."""


def wait_until(
    check: Callable[[], T],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    not_yet: tuple[type[Exception], ...] = (),
) -> T:
    """Call `check` until it returns something truthy, and return that.

    An exception of a type in `not_yet` (a refused connection while a server starts) counts
    as a falsy answer. After `timeout_s` it raises `WaitTimeoutError`, naming `what` and the
    last answer.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = check()
        except not_yet as exc:
            last: object = exc
        else:
            if answer:
                return answer
            last = answer
        if time.monotonic() > deadline:
            raise WaitTimeoutError(
                f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})"
            )
        time.sleep(interval_s)


def waiter(default_timeout_s: float, interval_s: float) -> Callable[..., None]:
    """`wait(predicate, what, timeout_s=default_timeout_s)`: `wait_until` for a fixture."""

    def wait(
        predicate: Callable[[], object], what: str, timeout_s: float = default_timeout_s
    ) -> None:
        wait_until(predicate, timeout_s=timeout_s, what=what, interval_s=interval_s)

    return wait


def holds_within(
    check: Callable[[], object], *, timeout_s: float, interval_s: float = 0.05
) -> bool:
    """Whether `check` holds within `timeout_s`: for a caller that says itself what went wrong."""
    try:
        wait_until(check, timeout_s=timeout_s, what="the check", interval_s=interval_s)
    except WaitTimeoutError:
        return False
    return True


def threads_left(before: set[threading.Thread], timeout_s: float = 10.0) -> set[threading.Thread]:
    """The threads started since `before` that still run after up to `timeout_s` (a Kafka
    client's I/O thread, a watch, a publisher ends a moment after it is told to)."""
    deadline = time.monotonic() + timeout_s
    while (left := set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
