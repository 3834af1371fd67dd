"""The newest state of each GPU for `gpuwatch:gpu:{uuid}`, coalesced between Redis writes.

Samples arrive every second per node; Redis needs only the newest per GPU, so a burst (a
catch-up after an outage, a replay) costs one write per GPU, and a Redis outage holds at
most one pending state per GPU. `idle_since` is the start of the GPU's current run of idle
samples, by the rule the idle alert uses (`streams.core.node.idleness`, with the idle threshold
of the GPU's cluster): a GPU pods hold is idle when each of them is by its own share, so on
a time-sliced GPU a process of no pod that keeps the device busy does not hide idle
holders; a GPU no pod holds is idle by its device reading. The run is kept in this process:
after a restart a GPU that was already idle shows idle since the first sample seen again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from schemas.ids import GpuUuid
from schemas.nvml_sample import NvmlSample
from sinks.redis.plan import GpuLive, gpu_live_states
from streams.core.node.idleness import idle_by_gpu

__all__ = ["LiveGpus"]


class LiveGpus:
    """Idle runs per GPU and the pending live state of each, newest sample wins.

    The worker's processors call `observe`, its Redis writer thread `take` and `put_back`.
    """

    def __init__(
        self,
        idle_util_pct: float,
        max_gpus: int = 200_000,
        by_cluster: Mapping[str, float] | None = None,
    ) -> None:
        self._idle_util_pct = idle_util_pct
        self._by_cluster = dict(by_cluster or {})
        """The idle threshold of each cluster that sets its own (`RuleSettings.clusters`)."""
        self._max_gpus = max_gpus
        self._idle_since: dict[GpuUuid, int | None] = {}
        self._seen_until: dict[GpuUuid, int] = {}
        self._pending: dict[GpuUuid, GpuLive] = {}
        self._lock = threading.Lock()

    def observe(self, sample: NvmlSample) -> None:
        """Take a node sample in; older samples of a GPU than one already seen change nothing."""
        end = sample.ts + sample.interval_ms
        runs: dict[GpuUuid, int | None] = {}
        threshold = self._by_cluster.get(sample.cluster, self._idle_util_pct)
        for uuid, idle in idle_by_gpu(sample, threshold).items():
            if self._seen_until.get(uuid, -1) >= end:
                continue
            if idle:
                since = self._idle_since.get(uuid)
                runs[uuid] = sample.ts if since is None else since
            else:
                runs[uuid] = None  # busy, or unknown: unknown is not idle
        if not runs:
            return
        if len(self._seen_until) > self._max_gpus:  # GPUs gone for good: start afresh
            self._seen_until.clear()
            self._idle_since.clear()
        states = [state for state in gpu_live_states(sample, runs) if state.uuid in runs]
        with self._lock:
            for state in states:
                self._pending[state.uuid] = state
                self._seen_until[state.uuid] = end
                self._idle_since[state.uuid] = runs[state.uuid]

    def idle_since(self) -> Mapping[GpuUuid, int | None]:
        """The idle run start of each GPU seen (None: busy or unknown)."""
        with self._lock:
            return dict(self._idle_since)

    def take(self) -> list[GpuLive]:
        """The pending states, leaving none."""
        with self._lock:
            pending, self._pending = self._pending, {}
        return list(pending.values())

    def put_back(self, states: list[GpuLive]) -> None:
        """Return states a write did not deliver; a newer state taken since wins."""
        with self._lock:
            for state in states:
                newer = self._pending.get(state.uuid)
                if newer is None or newer.ts < state.ts:
                    self._pending[state.uuid] = state
