"""The worker's sink: its /metrics, fed as records are made.

The processors hand each value they emit, and each sample and pod usage, to `WorkerSinks`
(the worker's `streams.faust.app.LiveHooks`), so a worker exports the pods and GPUs of its
own partitions and sums over workers count each once (sinks/prometheus/metrics.py). Redis is
written by `gpuwatch sink redis`, a process of its own (gpuwatch/run/sink.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
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
        "gpuwatch_duplicate_events": {(): float(counters.duplicates)},
        "gpuwatch_samples_missing": {(): float(counters.samples_missing)},
    }


class WorkerSinks:
    """The metrics of one worker process, fed by its processors."""

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
        """A value a processor emitted; the kinds the metrics show are counted."""
        m = self.metrics
        if isinstance(value, PodLifecycle):
            m.observe_lifecycle(value)
        elif isinstance(value, Attribution):
            m.observe_attribution(value)
        elif isinstance(value, GpuWindow):
            m.observe_gpu_window(value)
        elif isinstance(value, Alert):
            m.observe_alert(value)

    def on_firing(self, alert: Alert) -> None:
        """An alert a loaded partition state says is firing: its series, not its count."""
        self.metrics.show_firing(alert)

    def on_sample(self, sample: NvmlSample) -> None:
        """A node sample processed: GPU gauges, pipeline lag."""
        self.metrics.observe_sample(sample)
        self.metrics.set_lag(self._wall() - (sample.ts + sample.interval_ms) / 1000)

    def on_usage(self, usage: PodUsage) -> None:
        """A pod usage processed: the pod's live share and VRAM."""
        self.metrics.observe_usage(usage)

    def on_revoked(self, pods: list[str], nodes: list[str]) -> None:
        """Partitions left this worker: their pods' and nodes' series go (the new owner's come)."""
        self.metrics.forget(pods=pods, nodes=nodes)
