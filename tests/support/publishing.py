"""Messages and Kafka clients for the node agent's outbox and publisher tests: clients that
acknowledge at once, or refuse (no broker) until told otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from producers.base.outbox import Entry
from producers.base.publisher import Done, SendBlocked

SIZE = 10  # every publisher test message is 10 bytes: 5-byte key, 5-byte value


def entry(n: int, size: int = 10) -> Entry:
    """An outbox entry whose key names it and whose total size is `size` bytes."""
    key = f"{n:04d}".encode()
    return Entry(key, b"v" * (size - len(key)))


def names(entries: list[Entry]) -> list[int]:
    return [int(e.key) for e in entries]


def message(n: int) -> tuple[bytes, bytes]:
    return f"{n:05d}".encode(), b"v" * (SIZE - 5)


def keys(sent: Sequence[tuple[bytes, bytes] | Entry]) -> list[int]:
    return [int(item.key if isinstance(item, Entry) else item[0]) for item in sent]


class AckingSender:
    """Acknowledges every message inside `send`, as a client with a broker next door might."""

    delivery_timeout_s = 600.0

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.closed_with: float | None = None
        self.abandoned = 0

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.sent.append((key, value))
        done(None)

    def abandon(self) -> None:
        self.abandoned += 1

    def flush(self, timeout_s: float) -> None:
        return None

    def close(self, timeout_s: float) -> None:
        self.closed_with = timeout_s


class RefusingSender(AckingSender):
    """Takes `accept` messages, then raises SendBlocked (no broker) until opened."""

    def __init__(self, accept: int = 0) -> None:
        super().__init__()
        self.accept = accept
        self.refusals = 0

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        if len(self.sent) >= self.accept:
            self.refusals += 1
            raise SendBlocked("no broker")
        super().send(key, value, done)


@dataclass
class SharedSender:
    """The one client of several simulated nodes: acknowledges at once, or refuses (no
    broker) while `refuse` is set; counts how often it is closed."""

    refuse: bool = False
    got: list[tuple[bytes, bytes]] = field(default_factory=list)
    closed: int = 0
    abandoned: int = 0
    delivery_timeout_s: float = 600.0

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        if self.refuse:
            raise SendBlocked("no broker")
        self.got.append((key, value))
        done(None)

    def abandon(self) -> None:
        """Nothing is held; counted."""
        self.abandoned += 1

    def flush(self, timeout_s: float) -> None:
        """Nothing is held."""

    def close(self, timeout_s: float) -> None:
        self.closed += 1
