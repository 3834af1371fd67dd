"""Settings of the stream processing: windows, alert rules, the worker, the sinks, costs."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from schemas.prices import BUILTIN_PRICES, PriceTable
from schemas.settings.common import MODEL, cluster_name

__all__ = [
    "ClusterRules",
    "CostSettings",
    "RuleSettings",
    "SinkSettings",
    "WindowSettings",
    "WorkerSettings",
]


class WindowSettings(BaseModel):
    """Event-time windows."""

    model_config = MODEL

    window_s: int = Field(default=60, ge=1, le=86_400)
    """Length of attribution and idle/waste windows, in seconds."""
    allowed_lateness_s: int = Field(default=10, ge=0, le=86_400)
    """How long after its end a window waits for late data before it closes."""
    source_idle_after_s: int = Field(default=60, ge=1, le=86_400)
    """A node partition caught up with its input and this far (event time, at least its
    longest sample interval) behind the others' is idle: it no longer holds the pod side's
    watermark back. Data it sends later for windows closed meanwhile is late."""
    revision_horizon_s: int = Field(default=3_600, ge=0, le=7 * 86_400)
    """How long (event time, behind the stream time) a closed window can still be revised:
    usage that arrives after its window closed, within this horizon, emits the window's
    whole record again with a higher `revision`. Later than that it is late and counted.
    An hour covers a node agent's outbox draining after an hour without Kafka; 0 turns
    revisions off."""
    max_clock_skew_s: int = Field(default=300, ge=1, le=86_400)
    """A sample, node or pod event dated more than this ahead of the worker's wall clock
    goes to the dead-letter topic and moves no stream time: one wrong clock (or a producer
    holding the Kafka credential) would otherwise close every other node's windows."""


class ClusterRules(BaseModel):
    """The thresholds one cluster sets apart from the others; None: as `RuleSettings`."""

    model_config = MODEL

    idle_util_pct: float | None = Field(default=None, ge=0, le=100)
    stall_after_s: int | None = Field(default=None, ge=1)
    queued_alert_after_s: int | None = Field(default=None, ge=1)
    idle_alert_after_s: int | None = Field(default=None, ge=1)
    telemetry_missing_after_s: int | None = Field(default=None, ge=1)
    throttle_alert_after_s: int | None = Field(default=None, ge=1)
    xid_alert_hold_s: int | None = Field(default=None, ge=1)


def _json_mapping(value: Any) -> Any:
    """A JSON object in a string (as an environment variable carries one) to a dict."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON object of clusters: {exc}") from exc
    return value


class RuleSettings(BaseModel):
    """Thresholds of the lifecycle state machine and the alert rules."""

    model_config = MODEL

    idle_util_pct: float = Field(default=5.0, ge=0, le=100)
    """A GPU (or a pod's share of it) under this utilization % is idle."""
    stall_after_s: int = Field(default=300, ge=1)
    """A running pod idle on all its GPUs this long is stalled; shorter flaps on
    data-loader pauses and checkpoints."""
    queued_alert_after_s: int = Field(default=600, ge=1)
    """A pod queued this long raises PodQueuedTooLong."""
    idle_alert_after_s: int = Field(default=60, ge=1)
    """An allocated GPU idle this long raises GpuIdleAllocated: seconds, not the many
    minutes of a dashboard rule over scraped averages."""
    telemetry_missing_after_s: int = Field(default=30, ge=1)
    """A node with no sample for this long (stream time) raises NodeTelemetryMissing;
    30 ticks at 1 Hz, so a lost sample or two is not a dead node."""
    throttle_alert_after_s: int = Field(default=60, ge=1)
    """A GPU slowed by heat or power (hw/sw thermal slowdown, power brake, HW slowdown)
    on consecutive samples this long raises GpuThrottled."""
    xid_alert_hold_s: int = Field(default=300, ge=1)
    """GpuXidError resolves this long (stream time) after the last sample that reported
    its code on its GPU: an Xid is an event, not a state."""
    clusters: dict[str, ClusterRules] = {}
    """Thresholds of named clusters that differ from the ones above (a dev cluster idles
    more than a training one): `{"dev": {"idle_util_pct": 10}}`. A cluster not named, or
    a threshold a cluster leaves out, takes the value above."""

    @field_validator("clusters", mode="before")
    @classmethod
    def _clusters(cls, value: Any) -> Any:
        value = _json_mapping(value)
        if isinstance(value, dict):
            for name in value:
                cluster_name(name)
        return value

    @cached_property
    def by_cluster(self) -> dict[str, RuleSettings]:
        """The thresholds in force in each cluster of `clusters`."""
        base = self.model_dump(exclude={"clusters"})
        return {
            name: RuleSettings.model_validate(base | own.model_dump(exclude_none=True))
            for name, own in self.clusters.items()
        }

    def of(self, cluster: str) -> RuleSettings:
        """The thresholds in force in `cluster`: its own where it has some, else these."""
        if not self.clusters:
            return self
        return self.by_cluster.get(cluster, self)


class WorkerSettings(BaseModel):
    """How each worker process runs."""

    model_config = MODEL

    tick_interval_s: float = Field(default=1.0, gt=0, le=60)
    """Seconds between stream-time ticks: how soon after data stops windows close, stalls
    and queued alerts fire, and silent nodes are noticed."""
    session_timeout_s: float = Field(default=30.0, ge=6, le=300)
    """Kafka consumer session: a worker silent this long loses its partitions to the
    others (6 s is the broker's lowest allowed by default)."""
    sinks: bool = True
    """Export /metrics (pods, GPUs, pipeline); off, the worker only publishes the derived
    topics. Redis is written by `gpuwatch sink redis`, a process of its own."""
    input_end_ms: int | None = Field(default=None, ge=0)
    """Event time (epoch ms) the input ends at, for a replay of a range (`replay --rerun`):
    once caught up, the worker closes every window up to it instead of waiting for more.
    None for a live worker, whose windows wait for the data that moves stream time."""
    stall_limit_s: float = Field(default=300.0, gt=0)
    """Seconds a partition the worker holds may have records waiting while its commit does
    not move before /livez answers 503 (and `GpuwatchWorkerStalled` fires): a worker whose
    processing stopped still answers /metrics. Five minutes: longer than a busy table's
    restore after a rebalance, far shorter than a stuck worker going unnoticed."""
    align_ahead_s: int = Field(default=600, ge=0, le=86_400)
    """Watermark alignment: a node partition whose stream time is more than this far ahead
    of the lowest one is not read until the others catch up (0: never paused). Behind a
    backlog, the pod side holds the usage of every node partition ahead of the slowest in
    memory; aligned, that is at most this much event time of the fleet's usage, however long
    the backlog. Live, the partitions are seconds apart and none is paused. Keep it well
    above `GPUWATCH_SOURCE_IDLE_AFTER_S`: a partition whose nodes stopped is only taken for
    idle once the others are that far past it."""
    align_stuck_s: float = Field(default=30.0, gt=0, le=3600)
    """Seconds the lowest stream time may stay still while partitions are paused for it
    before they are read again anyway (`gpuwatch_alignment_released_total`): a slowest
    partition that does not move (its worker gone, its records stuck) must not stop the
    others."""


class SinkSettings(BaseModel):
    """How each `gpuwatch sink` process runs."""

    model_config = MODEL

    metrics_port: int = Field(default=9483, ge=1, le=65535)
    """Port of the Redis sink's own /metrics (written, refused, lag)."""
    exporter_port: int = Field(default=9484, ge=1, le=65535)
    """Port of `gpuwatch sink metrics`: the pod and GPU metrics."""
    stall_limit_s: float = Field(default=300.0, gt=0)
    """Seconds a partition a sink holds may have records waiting while the sink takes none
    in (writes nothing) before its /livez answers 503 (and `GpuwatchSinkStalled` fires)."""


class CostSettings(BaseModel):
    """Prices that turn GPU-seconds into dollars."""

    model_config = MODEL

    prices_file: Path | None = None
    """YAML or JSON price table; None uses the built-in table."""
    prices: PriceTable = BUILTIN_PRICES
    """The price table in force (loaded from prices_file when set)."""
