"""A bounded FIFO of encoded messages held until Kafka acknowledges them; the oldest waiting
drop first when it is full."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, eq=False)
class Entry:
    """One encoded message; entries are compared by identity (two equal samples are two)."""

    key: bytes
    value: bytes

    @property
    def size(self) -> int:
        """Bytes it holds (key and value); what the bound counts."""
        return len(self.key) + len(self.value)


class Outbox:
    """Thread-safe FIFO bounded by bytes, of what the broker has not acknowledged yet.

    An entry waits, is taken (handed to the client: in flight, still held and counted),
    then leaves on `ack`, or goes back to the head of the waiting entries (`give_back`)
    when the client gave it up, to be sent again in order. `put` never blocks: when full
    it drops the oldest waiting entries. What is in flight is not dropped (the client
    holds it); while more than the bound is in flight, the newest entry still waits.
    Every drop is counted (`dropped`, `dropped_bytes`), so a gap in `seq` downstream can
    be told apart from a loss nobody noticed.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._waiting: deque[Entry] = deque()
        self._in_flight: dict[Entry, None] = {}  # in the order handed over
        self._waiting_bytes = 0
        self._in_flight_bytes = 0
        self._cond = threading.Condition()
        self.dropped = 0
        self.dropped_bytes = 0

    def put(self, entry: Entry) -> int:
        """Append `entry`, dropping the oldest waiting entries to make room; returns how many
        dropped."""
        dropped = 0
        with self._cond:
            if entry.size > self.max_bytes:
                self.dropped += 1
                self.dropped_bytes += entry.size
                return 1
            while self._waiting and self.size_bytes + entry.size > self.max_bytes:
                oldest = self._waiting.popleft()
                self._waiting_bytes -= oldest.size
                self.dropped += 1
                self.dropped_bytes += oldest.size
                dropped += 1
            self._waiting.append(entry)
            self._waiting_bytes += entry.size
            self._cond.notify_all()
        return dropped

    def take(self, max_bytes: int) -> list[Entry]:
        """Move waiting entries from the head, up to `max_bytes` (at least one when any
        waits), into flight; they stay held until `ack` or `give_back`."""
        taken: list[Entry] = []
        size = 0
        with self._cond:
            while self._waiting and (not taken or size + self._waiting[0].size <= max_bytes):
                entry = self._waiting.popleft()
                self._waiting_bytes -= entry.size
                self._in_flight[entry] = None
                self._in_flight_bytes += entry.size
                size += entry.size
                taken.append(entry)
        return taken

    def ack(self, entry: Entry) -> bool:
        """`entry` was acknowledged (or given up for good): it leaves. False if not in flight."""
        with self._cond:
            if self._in_flight.pop(entry, False) is False:
                return False
            self._in_flight_bytes -= entry.size
            return True

    def give_back(self, entries: Iterable[Entry]) -> None:
        """Put entries in flight back at the head of the waiting ones, in the order they were
        handed over, to be sent again before anything newer.

        They may push the outbox over its bound; the next `put` drops what is oldest.
        """
        with self._cond:
            back = set(entries)
            ordered = [e for e in self._in_flight if e in back]
            for entry in reversed(ordered):
                del self._in_flight[entry]
                self._in_flight_bytes -= entry.size
                self._waiting.appendleft(entry)
                self._waiting_bytes += entry.size
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block until an entry is waiting or `timeout` passes; True when one is waiting."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._waiting), timeout)

    def wake(self) -> None:
        """Wake a sender blocked in `wait` (on shutdown)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def size_bytes(self) -> int:
        """Bytes held: waiting and in flight, everything not acknowledged."""
        return self._waiting_bytes + self._in_flight_bytes

    @property
    def in_flight_bytes(self) -> int:
        """Bytes handed to the client and not acknowledged."""
        return self._in_flight_bytes

    @property
    def in_flight(self) -> int:
        """Entries handed to the client and not acknowledged."""
        return len(self._in_flight)

    @property
    def waiting(self) -> int:
        """Entries not handed to the client yet."""
        return len(self._waiting)

    def __len__(self) -> int:
        """Entries held: waiting and in flight."""
        return len(self._waiting) + len(self._in_flight)
