"""Time ranges of `gpuwatch replay` and `report`: `--from`/`--to` parsed, instants and
durations printed, the range itself (`TimeRange`).

A time is `now`, a relative time before now (`-2h`, `-1h30m`, `-90s`), epoch seconds or
milliseconds, or ISO 8601 with a time zone. Everything is epoch milliseconds (UTC) inside.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["MS_THRESHOLD", "TimeRange", "format_duration", "format_time", "parse_time"]

# Epoch values at or above this are milliseconds: 1e11 ms is March 1973, 1e11 s the
# year 5138, so no real epoch in seconds reaches it and no real one in ms falls under it.
MS_THRESHOLD = 100_000_000_000

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)"
_RELATIVE = re.compile(rf"^(?:now)?-((?:{_PART})+)$")
_PARTS = re.compile(_PART)
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def parse_time(text: str, now_ms: int) -> int:
    """Epoch ms of `text`; ValueError with the accepted forms when it is none of them."""
    value = text.strip().lower()
    if value == "now":
        return now_ms
    relative = _RELATIVE.match(value)
    if relative is not None:
        ago = sum(float(n) * _UNIT_MS[unit] for n, unit in _PARTS.findall(relative.group(1)))
        return now_ms - round(ago)
    if _NUMBER.match(value):
        number = float(value)
        return round(number if number >= MS_THRESHOLD else number * 1000)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read the time {text!r}: give `now`, a time before now such as -2h, "
            "-30m or -1h30m, epoch seconds or milliseconds, or ISO 8601 such as "
            "2025-11-29T02:10:00Z"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"give the time zone of {text!r} (a trailing Z for UTC, or +02:00)")
    return round(when.timestamp() * 1000)


def format_time(ms: int, *, date: bool = True) -> str:
    """`2025-11-29 02:10:00` (UTC), with milliseconds only when there are some."""
    when = datetime.fromtimestamp(ms / 1000, UTC)
    text = when.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")
    return text + (f".{ms % 1000:03d}" if ms % 1000 else "")


def format_duration(ms: float) -> str:
    """`2h05m`, `4m30s`, `12s`, `0.5s`: the two largest units, clamped at 0."""
    seconds = max(0.0, ms / 1000)
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


@dataclass(frozen=True)
class TimeRange:
    """`[start_ms, end_ms]` in event time."""

    start_ms: int
    end_ms: int

    def holds(self, ts: int) -> bool:
        """An instant in the range (both ends included)."""
        return self.start_ms <= ts <= self.end_ms

    def overlaps(self, start: int, end: int) -> bool:
        """A window `[start, end)` shares time with the range."""
        return end > self.start_ms and start < self.end_ms
