"""The worker's own /metrics: the pipeline's counters and lag, and the stream's alerts.

The processors hand each value they emit, and each node sample, to `WorkerSinks` (the
worker's `streams.faust.app.LiveHooks`): the worker shows the alerts of its own partitions
as they fire (`gpuwatch_alert_firing`, and the alerts a partition's loaded state says are
firing), so sums over workers count each once (sinks/prometheus/metrics.py). The pod and
GPU metrics are served by `gpuwatch sink metrics` and Redis is written by `gpuwatch sink
redis`, processes of their own (gpuwatch/run/sink.py): the worker's core does stream
processing only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from schemas.alert import Alert
from schemas.nvml_sample import NvmlSample
from schemas.settings import Settings
from sinks.prometheus.metrics import PipelineCounts, WorkerMetrics
from streams.processors.outputs import Counters

__all__ = ["WorkerSinks", "pipeline_counts"]


def pipeline_counts(counters: Counters) -> PipelineCounts:
    """The stream processors' counters as metric families (copies: read from another thread)."""
    return {
        "gpuwatch_events": {(topic,): float(n) for topic, n in counters.by_topic.copy().items()},
        "gpuwatch_deadletter": {key: float(n) for key, n in counters.dead_by.copy().items()},
        "gpuwatch_late_events": {(): float(counters.late)},
        "gpuwatch_revisions": {(): float(counters.revisions)},
        "gpuwatch_late_applied_events": {(): float(counters.applied_late)},
        "gpuwatch_duplicate_events": {(): float(counters.duplicates)},
        "gpuwatch_samples_missing": {(): float(counters.samples_missing)},
        "gpuwatch_work_units_dropped": {(): float(counters.units_dropped)},
        "gpuwatch_delivery_failures": {
            key: float(n) for key, n in counters.delivery_failures.copy().items()
        },
        "gpuwatch_alignment_paused_partitions": {(): float(counters.aligned_paused)},
        "gpuwatch_alignment_pauses": {(): float(counters.alignment_pauses)},
        "gpuwatch_alignment_released": {(): float(counters.alignment_released)},
    }


class WorkerSinks:
    """The own metrics of one worker process, fed by its processors."""

    def __init__(
        self,
        settings: Settings,
        counters: Counters,
        *,
        registry: CollectorRegistry | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry, pipeline=lambda: pipeline_counts(counters))
        self._wall = wall

    def on_record(self, value: Any) -> None:
        """A value a processor emitted: an alert is counted and shown while it fires."""
        if isinstance(value, Alert):
            self.metrics.observe_alert(value)

    def on_firing(self, alert: Alert) -> None:
        """An alert a loaded partition state says is firing: its series, not its count."""
        self.metrics.show_firing(alert)

    def on_sample(self, sample: NvmlSample) -> None:
        """A node sample processed: the pipeline's lag."""
        self.metrics.set_lag(self._wall() - (sample.ts + sample.interval_ms) / 1000)

    def on_revoked(self, pods: list[str], nodes: list[str]) -> None:
        """Partitions left this worker: their pods' and nodes' alerts go (the new owner's come)."""
        self.metrics.forget(pods=pods, nodes=nodes)
