"""The worker's progress watch: each interval, its input partitions' commits against their ends.

What `app.timer` runs beside the ticks: the partitions of the agents' topics this worker
holds (the inputs, the tick topic, the fleet topic), their end offsets (through the
tick timer's `OffsetProbe`, a client of its own that answers while Faust's consumer is
stuck) and the offsets Faust committed for them, into `Stalls`. A committed offset moves
only once the agents have processed the records before it and their outputs are
acknowledged, so a worker whose processing stopped (a hung table recovery, outputs the
broker does not acknowledge, an agent waiting for ever) stops moving it, while ticks and
inputs keep arriving: its stall grows, and /livez and `gpuwatch_worker_stalled_seconds`
say so (gpuwatch/run/progress.py). A partition never committed counts from its log start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from streams.core.progress import Partition, Stalls
from streams.faust.tick_timer import OffsetProbe

__all__ = ["ProgressWatch"]

log = logging.getLogger(__name__)


class ProgressWatch:
    """What `app.timer` runs: this worker's positions and ends, into `stalls`."""

    def __init__(
        self,
        app: Any,
        probe: OffsetProbe,
        stalls: Stalls,
        committed: Callable[[str, int], int | None],
        topics: Iterable[str],
    ) -> None:
        self.app = app
        self.topics = frozenset(topics)
        self.probe = probe
        self.stalls = stalls
        self._committed = committed

    def held(self) -> list[Partition]:
        """The partitions of `topics` this worker holds now (Faust's actives hold the
        changelogs too, which it writes and reads only to restore)."""
        actives = self.app.assignor.assigned_actives()
        return sorted((tp.topic, tp.partition) for tp in actives if tp.topic in self.topics)

    async def check(self) -> None:
        """Read ends and commits once; an error is logged and the next interval tries again
        (the stall meanwhile grows from the last reading)."""
        try:
            await self._check()
        except Exception:
            log.exception("reading the worker's progress failed")

    async def _check(self) -> None:
        held = self.held()
        self.stalls.hold(held)
        if not held:
            return
        # The commits before the ends: a record waiting at the end read is one the commit
        # read had not passed.
        committed = {p: self._committed(*p) for p in held}
        ends, starts = await self.probe.offsets(held)
        self.stalls.positions({p: starts.get(p) if c is None else c for p, c in committed.items()})
        self.stalls.ends(ends)
