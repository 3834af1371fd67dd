"""A bounded FIFO of encoded messages: the sampler puts, the sender takes, the oldest drop first."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Entry:
    """One encoded message waiting to be sent."""

    key: bytes
    value: bytes

    @property
    def size(self) -> int:
        """Bytes it holds (key and value); what the bound counts."""
        return len(self.key) + len(self.value)


class Outbox:
    """Thread-safe FIFO bounded by bytes. `put` never blocks: when full it drops the oldest.

    Every drop is counted (`dropped`, `dropped_bytes`), so a gap in `seq` downstream can
    be told apart from a loss nobody noticed.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._entries: deque[Entry] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self.dropped = 0
        self.dropped_bytes = 0

    def put(self, entry: Entry) -> int:
        """Append `entry`, dropping the oldest entries to make room; returns how many dropped."""
        dropped = 0
        with self._cond:
            if entry.size > self.max_bytes:
                self.dropped += 1
                self.dropped_bytes += entry.size
                return 1
            while self._bytes + entry.size > self.max_bytes:
                oldest = self._entries.popleft()
                self._bytes -= oldest.size
                self.dropped += 1
                self.dropped_bytes += oldest.size
                dropped += 1
            self._entries.append(entry)
            self._bytes += entry.size
            self._cond.notify_all()
        return dropped

    def take(self, max_bytes: int) -> list[Entry]:
        """Pop entries from the head up to `max_bytes` (at least one when any is waiting)."""
        taken: list[Entry] = []
        size = 0
        with self._cond:
            while self._entries and (not taken or size + self._entries[0].size <= max_bytes):
                entry = self._entries.popleft()
                self._bytes -= entry.size
                size += entry.size
                taken.append(entry)
        return taken

    def push_front(self, entries: Iterable[Entry]) -> None:
        """Give back entries that could not be handed over, keeping their order at the head.

        They may push the outbox over its bound; the next `put` drops what is oldest.
        """
        with self._cond:
            for entry in reversed(list(entries)):
                self._entries.appendleft(entry)
                self._bytes += entry.size
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block until an entry is waiting or `timeout` passes; True when one is waiting."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._entries), timeout)

    def wake(self) -> None:
        """Wake a sender blocked in `wait` (on shutdown)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def size_bytes(self) -> int:
        """Bytes waiting."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
