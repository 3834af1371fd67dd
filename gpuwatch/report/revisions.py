"""Which copy of a window `gpuwatch report` counts: the newest revision, once.

Delivery is at least once, and the worker re-emits a window's whole record, same identity,
with a higher `revision` when usage arrives after the window closed (within its revision
horizon, `GPUWATCH_REVISION_HORIZON_S`). So per identity (cluster, pod uid or GPU uuid,
`window_start`) the report keeps the revision it counted and what counting it added:

- a higher revision takes back what the counted one added and adds its own figures;
- the same revision again (a redelivery) or a lower one after a higher (a copy sent before
  the revision, delivered again) is left out.

Memory is bounded per partition: a window is remembered while its `window_start` is within
`horizon_ms` of the newest `window_start` read from the partition, and forgotten after. A
window's copies share a key, so they share a partition. So the report holds, whatever the
period, one entry per pod and per GPU per window of the horizon (67 at the defaults):
about 300 bytes a pod window (twice that where it reports units of work: their counts are
held too), 270 a GPU window, measured with tracemalloc on CPython 3.11; 10,000 pods on
10,000 GPUs hold about 400 MB. The identities alone took about 100 bytes; what counting a
window added is what a newer revision must take back. The horizon must cover the
worker's: a revision is emitted at most `revision_horizon_s` of stream time after its
window closed, when the partition's newest windows are at most that far ahead of it, give
or take a window, the lateness and a clock that runs ahead (`dedup_horizon_ms`). What is
read older than the horizon cannot be checked:

- revision 0 is counted: it may be the first copy (a partition whose windows come out of
  order), so a redelivery that old is counted twice;
- a higher revision is left out and counted on stderr: its window's earlier copy was
  written before it in the same partition and counted, so adding it would count the window
  twice (it can only come from a worker with a longer revision horizon than the settings
  the report was given).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final, Generic, TypeVar

from schemas.settings import WindowSettings

__all__ = ["MIN_HORIZON_MS", "Copy", "PartitionWindows", "dedup_horizon_ms"]

MIN_HORIZON_MS: Final = 3_600_000  # a worker restarted re-sends what it wrote since its last
# commit, minutes of event time; an hour of windows covers it with room

Counted = TypeVar("Counted", bound=tuple[Any, ...])


def dedup_horizon_ms(windows: WindowSettings) -> int:
    """How far behind a partition's newest window a copy of a window can come: the worker's
    revision horizon, a window and its lateness (the revised window's own length, and the
    closing), another window (the newest may be one ahead of the stream time that closes
    them) and the clock skew the worker accepts; at least `MIN_HORIZON_MS`."""
    slack_s = 2 * windows.window_s + windows.allowed_lateness_s + windows.max_clock_skew_s
    return max(MIN_HORIZON_MS, (windows.revision_horizon_s + slack_s) * 1000)


class Copy(Enum):
    """What a record is to the windows already read from its partition."""

    FIRST = "first"
    """Its window was not read before: count it."""
    NEWER = "newer"
    """A higher revision of a window counted: take the counted one back, count this one."""
    AGAIN = "again"
    """The revision counted, delivered again: leave it out."""
    OLDER = "older"
    """A lower revision than the one counted: leave it out."""
    UNCHECKED = "unchecked"
    """Revision 0 of a window older than the horizon: count it, remember nothing."""
    TOO_LATE = "too_late"
    """A higher revision of a window older than the horizon: leave it out."""


_FIRST: Final = (Copy.FIRST, None)
_AGAIN: Final = (Copy.AGAIN, None)
_OLDER: Final = (Copy.OLDER, None)
_UNCHECKED: Final = (Copy.UNCHECKED, None)
_TOO_LATE: Final = (Copy.TOO_LATE, None)


class PartitionWindows(Generic[Counted]):
    """The windows read from one partition within the horizon: per identity, what counting
    it added (`Counted`, the caller's: a tuple whose first item is the revision counted, one
    object per window, as small as it can be: there are an hour of windows of them)."""

    __slots__ = ("_by_start", "_floor", "_horizon", "_newest")

    def __init__(self, horizon_ms: int) -> None:
        self._by_start: dict[int, dict[int, Counted]] = {}
        self._horizon = horizon_ms
        self._newest = -(1 << 62)
        self._floor = -(1 << 62)

    def __len__(self) -> int:
        """Windows remembered."""
        return sum(len(seen) for seen in self._by_start.values())

    def check(self, start: int, identity: int, revision: int) -> tuple[Copy, Counted | None]:
        """What a copy of the window `(identity, start)` at `revision` is, and what the
        revision counted before added (with `Copy.NEWER` only)."""
        seen = self._by_start.get(start)
        if seen is None:
            if start < self._floor:
                return _TOO_LATE if revision > 0 else _UNCHECKED
            return _FIRST
        before = seen.get(identity)
        if before is None:
            return _FIRST
        counted: int = before[0]
        if revision > counted:
            return Copy.NEWER, before
        return _AGAIN if revision == counted else _OLDER

    def keep(self, start: int, identity: int, added: Counted) -> None:
        """Remember what counting a revision of the window added (`added[0]`: the revision),
        after `check` said `FIRST` or `NEWER`; windows past the horizon are forgotten."""
        seen = self._by_start.get(start)
        if seen is None:
            seen = self._by_start[start] = {}
            if start > self._newest:
                self._newest = start
                self._floor = start - self._horizon
                for old in [s for s in self._by_start if s < self._floor]:
                    del self._by_start[old]
        seen[identity] = added
