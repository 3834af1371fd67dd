"""What the metrics have counted: newest marks per key, and the figures counted per window.

The window counters (cost, waste, idle seconds) must count each window once, and a window
the worker revises (the same identity again, whole, with a higher `revision`, when data
came after it closed) by the difference to what was counted for it. `CountedWindows` keeps
that per identity `(key, window_start)`, in bounded memory:

- Identities are remembered for the revision horizon, in event time: a key's windows
  starting more than `horizon_ms` before its newest are forgotten (the worker revises a
  window only that long after it closed), and so are the keys least recently counted once
  their newest window is that far behind the newest of all (a pod that finished). At most
  `size` windows are remembered (about 200 bytes each): past it the keys least recently
  counted are forgotten first, whole.
- A copy of a remembered window counts only when its revision is higher than the one
  counted, and only by how much each figure rose: a redelivered copy, or a lower revision
  arriving after a higher one, adds nothing. A counter never goes down: a revision that
  lowers a figure (late data adds seconds, so it does not in practice) leaves it as counted.
- A window not remembered counts whole when it starts after the key's newest window
  counted (windows of one key arrive in order: one partition, closed in order), and not at
  all otherwise: a copy of a window forgotten (past the horizon or the cap) is a replay,
  or a revision whose difference is then lost: the counters miss it rather than count the
  window twice. The newest mark of the least recently counted keys goes past `keys` keys,
  and with it that protection (a replay of such a key's windows counts again).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["CountedWindows", "Marks"]

Figures = tuple[float, ...]


class Marks:
    """The newest mark (window start, event time) seen per key, for the latest `size` keys."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._seen: OrderedDict[str, int] = OrderedDict()

    def last(self, key: str) -> int | None:
        """The key's newest mark; None when unknown or forgotten."""
        return self._seen.get(key)

    def advance(self, key: str, mark: int) -> bool:
        """True, remembering `mark`, when it is newer than the key's last; False for a replay."""
        last = self._seen.get(key)
        if last is not None and mark <= last:
            return False
        self._seen[key] = mark
        self._seen.move_to_end(key)
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return True


class CountedWindows:
    """The revision and figures counted per window identity (module docstring).

    Kept per key (pod uid, GPU uuid) in the order keys last counted a window, each key's
    windows by start: the horizon and the cap drop the oldest first, the cap whole keys.
    """

    def __init__(self, *, keys: int, size: int, horizon_ms: int) -> None:
        if size < 1 or horizon_ms < 0:
            raise ValueError("size must be positive and horizon_ms not negative")
        self._marks = Marks(keys)
        self._size = size
        self.horizon_ms = horizon_ms
        # key -> window_start -> (revision, *figures); keys least recently counted first
        self._counted: OrderedDict[str, dict[int, tuple[float, ...]]] = OrderedDict()
        self._windows = 0
        self._newest = -1

    def __len__(self) -> int:
        """Windows remembered."""
        return self._windows

    def count(self, key: str, window_start: int, revision: int, figures: Figures) -> Figures | None:
        """What one copy of a window adds to its counters, figure by figure; None: nothing."""
        windows = self._counted.get(key)
        held = None if windows is None else windows.get(window_start)
        if windows is not None and held is not None:
            if revision <= held[0]:
                return None
            risen = tuple(max(was, now) for was, now in zip(held[1:], figures, strict=True))
            windows[window_start] = (revision, *risen)
            return tuple(now - was for was, now in zip(held[1:], risen, strict=True))
        if not self._marks.advance(key, window_start):
            return None
        if windows is None:
            windows = self._counted[key] = {}
        else:
            self._counted.move_to_end(key)
        windows[window_start] = (revision, *figures)
        self._windows += 1
        self._newest = max(self._newest, window_start)
        self._trim(windows, window_start)
        return figures

    def _trim(self, windows: dict[int, tuple[float, ...]], newest: int) -> None:
        """Forget a key's windows starting more than the horizon before its newest window,
        then the keys least recently counted while their newest window is that far behind
        the newest of all, or while more windows than the cap are remembered."""
        while next(iter(windows)) < newest - self.horizon_ms:  # a key's windows are in order
            del windows[next(iter(windows))]
            self._windows -= 1
        line, counted = self._newest - self.horizon_ms, self._counted
        while counted:
            its = next(iter(counted.values()))
            if self._windows <= self._size and next(reversed(its)) >= line:
                return
            _, its = counted.popitem(last=False)
            self._windows -= len(its)
