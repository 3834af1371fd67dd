"""`records read / total` of a long read, on stderr: a `rich` progress bar on a terminal,
a line every few seconds in a log.

`gpuwatch replay`, `report` and the watcher's read-back show it while they read topics.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, TaskID, TaskProgressColumn, TextColumn
from rich.progress import Progress as Bar

__all__ = ["Progress"]


class Progress:
    """`records read / total` on stderr for reads that last: a bar in place on a terminal.

    Nothing is shown for a read under `after_s`; then a terminal gets a bar redrawn in
    place (at most every 0.1 s, erased when the read is over), anything else (a log file)
    a line every `every_s`.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        after_s: float = 1.0,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        verb: str = "replay",
    ) -> None:
        stream = sys.stderr if stream is None else stream  # the one in force now, not at import
        self.stream, self.clock, self.verb = stream, clock, verb
        self.tty = stream.isatty() if tty is None else tty
        self.after_s, self.every_s = after_s, every_s
        self.label, self.done, self.total = "", 0, 0
        self._began = self._drawn_at = 0.0
        self._shown = False
        self._bar: tuple[Bar, TaskID] | None = None

    def begin(self, label: str, total: int) -> None:
        """A new read of at most `total` records."""
        self.label, self.done, self.total = label, 0, total
        self._began = self.clock()
        self._shown = False

    def advance(self, n: int = 1) -> None:
        """`n` more records read (or skipped past)."""
        self.done += n
        now = self.clock()
        if now - self._began < self.after_s:
            return
        if self._shown and now - self._drawn_at < (0.1 if self.tty else self.every_s):
            return
        self._draw(now)

    def finish(self) -> None:
        """The read is over: complete the line (a terminal's bar is erased)."""
        if not self._shown:
            return
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None
        else:
            self.stream.write(f"{self._text()} done\n")
            self.stream.flush()
        self._shown = False

    def _text(self) -> str:
        pct = 100 * self.done / self.total if self.total else 100.0
        return f"{self.verb}: {self.label} {self.done:,}/{self.total:,} records ({pct:.0f}%)"

    def _draw(self, now: float) -> None:
        self._shown, self._drawn_at = True, now
        if not self.tty:
            self.stream.write(f"{self._text()}\n")
            self.stream.flush()
            return
        if self._bar is None:
            self._bar = self._start()
        bar, task = self._bar
        bar.update(task, completed=self.done, total=max(self.total, self.done) or None)
        bar.refresh()

    def _start(self) -> tuple[Bar, TaskID]:
        """The terminal's bar: drawn when told (no refresh thread), gone when stopped."""
        console = Console(file=self.stream, force_terminal=True, highlight=False)
        bar = Bar(
            TextColumn(f"{self.verb}: {self.label}", markup=False),
            BarColumn(),
            TextColumn("{task.completed:,}/{task.total:,} records"),
            TaskProgressColumn(),
            console=console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        task = bar.add_task(self.label, total=max(self.total, self.done) or None)
        bar.start()
        return bar, task
