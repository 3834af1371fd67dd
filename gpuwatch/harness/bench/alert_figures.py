"""The figures of the idle-alert part: latencies per stage, and a DCGM + Prometheus setup's.

A GpuIdleAllocated alert fires on the node sample whose end completes `idle_alert_after_s`
of idleness (streams/core/node/gpu_alerts.py): its message's `ts` is the run's start plus the
threshold, so that sample is its node's first one ending at or after the alert's `ts`. A
stage's latency runs from that sample's hand-over to the Kafka client to the first time
the bench saw the alert there: read from the `alerts` topic, in Redis' firing hash, in
Prometheus' `ALERTS`.

The DCGM figure is computed, not measured: dcgm-exporter collects every `collect` s,
Prometheus scrapes it every `scrape` s and evaluates the rule (`DCGM_FI_DEV_GPU_UTIL` under
the idle threshold, with a `for` standing for the idle time) every `evaluate` s. A GPU
going idle is seen by the next collection, scrape and evaluation (each up to its interval
later, half of it on average); the alert goes pending there and fires at the first
evaluation `for` or more later. From the moment the GPU has been idle for the rule's `for`
(the instant gpuwatch's latency starts from, with `for` = `idle_alert_after_s`) that is
the three delays plus the rounding of `for` up to whole evaluations.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from gpuwatch.harness.bench.figures import percentile

__all__ = [
    "DCGM_DEFAULTS",
    "AlertResult",
    "DcgmFigures",
    "DcgmSetup",
    "Fired",
    "StageLatency",
    "alert_fields",
    "alert_result",
    "dcgm_figures",
    "format_alerts",
    "stage_latency",
]

S = 1000


@dataclass(frozen=True)
class DcgmSetup:
    """A DCGM exporter + Prometheus setup's intervals, in seconds."""

    collect_interval_s: float = 30.0
    """dcgm-exporter's collection interval (its `-c 30000` default)."""
    scrape_interval_s: float = 15.0
    """The scrape interval of the exporter's job (the common 15 s)."""
    evaluation_interval_s: float = 15.0
    """Rule evaluation (set with the scrape interval in the common setups)."""
    rule_for_s: float = 60.0
    """The idle rule's `for` (the shipped threshold rule's 1m)."""


DCGM_DEFAULTS = DcgmSetup()


@dataclass(frozen=True)
class DcgmFigures:
    """When a DCGM + Prometheus setup would fire its idle alert, in seconds."""

    dcgm_collect_interval_s: float
    dcgm_scrape_interval_s: float
    dcgm_evaluation_interval_s: float
    dcgm_rule_for_s: float
    dcgm_idle_alert_latency_worst_s: float
    """From the GPU idle for the rule's `for` to ALERTS firing, all phases at their worst."""
    dcgm_idle_alert_latency_typical_s: float
    """The same, each phase half its interval (the mean over phases)."""
    dcgm_idle_alert_after_idle_worst_s: float
    """From the GPU going idle to ALERTS firing, at worst: the `for` on top of the delays."""
    dcgm_idle_alert_after_idle_typical_s: float


def dcgm_figures(setup: DcgmSetup = DCGM_DEFAULTS) -> DcgmFigures:
    """The DCGM figures of `setup` (see the module docstring)."""
    intervals = (setup.collect_interval_s, setup.scrape_interval_s, setup.evaluation_interval_s)
    if min(intervals) <= 0 or setup.rule_for_s < 0:
        raise ValueError(f"intervals must be positive and `for` not negative: {setup}")
    evaluate = setup.evaluation_interval_s
    held = math.ceil(setup.rule_for_s / evaluate - 1e-9) * evaluate  # whole evaluations
    worst, typical = sum(intervals), sum(intervals) / 2
    return DcgmFigures(
        dcgm_collect_interval_s=setup.collect_interval_s,
        dcgm_scrape_interval_s=setup.scrape_interval_s,
        dcgm_evaluation_interval_s=evaluate,
        dcgm_rule_for_s=setup.rule_for_s,
        dcgm_idle_alert_latency_worst_s=worst + held - setup.rule_for_s,
        dcgm_idle_alert_latency_typical_s=typical + held - setup.rule_for_s,
        dcgm_idle_alert_after_idle_worst_s=worst + held,
        dcgm_idle_alert_after_idle_typical_s=typical + held,
    )


@dataclass(frozen=True)
class Fired:
    """A GpuIdleAllocated alert the worker fired (its first firing message)."""

    fingerprint: str
    gpu: str
    node: str
    at_ms: int
    """The message's `ts`: the idle run's start plus the threshold."""


@dataclass(frozen=True)
class StageLatency:
    """One stage's latencies, in ms."""

    values: list[float]
    missing: int
    """Alerts fired that the stage never showed within the wait."""

    @property
    def p50(self) -> float | None:
        """The median, or None without values."""
        return percentile(self.values, 50) if self.values else None

    @property
    def max(self) -> float | None:
        """The largest, or None without values."""
        return max(self.values) if self.values else None


def _sent_at(sent: Sequence[tuple[int, float]], at_ms: int) -> float | None:
    """The send time of the first sample ending at or after `at_ms` (`sent` by end)."""
    i = bisect.bisect_left(sent, (at_ms, -math.inf))
    return sent[i][1] if i < len(sent) else None


def stage_latency(
    fired: Sequence[Fired],
    sent: Mapping[str, Sequence[tuple[int, float]]],
    seen: Mapping[str, float],
) -> StageLatency:
    """Each alert's latency in one stage.

    `sent` maps a node to its samples' (end ms, send wall time), in order; `seen` maps a
    fingerprint to the wall time the stage first showed it.
    """
    values, missing = [], 0
    for alert in fired:
        start = _sent_at(sent.get(alert.node, ()), alert.at_ms)
        shown = seen.get(alert.fingerprint)
        if start is None:
            raise ValueError(f"no sample of {alert.node} ends at or after {alert.at_ms}")
        if shown is None:
            missing += 1
        else:
            values.append((shown - start) * S)
    return StageLatency(values, missing)


@dataclass(frozen=True)
class AlertResult:
    """The idle-alert part's figures: its setup, each stage's latencies, the DCGM figure."""

    idle_alert_after_s: int
    idle_alert_nodes: int
    idle_alert_fired: int
    """GPUs whose GpuIdleAllocated alert the worker fired (each measured once)."""
    idle_alert_topic_p50_ms: float | None
    idle_alert_topic_max_ms: float | None
    idle_alert_redis_p50_ms: float | None
    idle_alert_redis_max_ms: float | None
    idle_alert_redis_missing: int
    idle_alert_prometheus_p50_ms: float | None
    idle_alert_prometheus_max_ms: float | None
    idle_alert_prometheus_missing: int
    idle_alert_prometheus_behind_topic_max_ms: float | None
    """The most an alert reached ALERTS after the `alerts` topic."""
    prometheus_scrape_interval_s: float
    prometheus_evaluation_interval_s: float
    dcgm: DcgmFigures


def alert_result(
    *,
    idle_after_s: int,
    nodes: int,
    fired: Sequence[Fired],
    sent: Mapping[str, Sequence[tuple[int, float]]],
    seen: Mapping[str, Mapping[str, float]],
    prometheus_s: tuple[float, float],
    dcgm: DcgmSetup = DCGM_DEFAULTS,
) -> AlertResult:
    """The result from what was fired, sent and seen (`seen`: topic, redis, prometheus)."""
    topic, redis, prom = (
        stage_latency(fired, sent, seen[k]) for k in ("topic", "redis", "prometheus")
    )
    behind = [
        (seen["prometheus"][a.fingerprint] - seen["topic"][a.fingerprint]) * S
        for a in fired
        if a.fingerprint in seen["prometheus"] and a.fingerprint in seen["topic"]
    ]
    return AlertResult(
        idle_alert_after_s=idle_after_s,
        idle_alert_nodes=nodes,
        idle_alert_fired=len(fired),
        idle_alert_topic_p50_ms=topic.p50,
        idle_alert_topic_max_ms=topic.max,
        idle_alert_redis_p50_ms=redis.p50,
        idle_alert_redis_max_ms=redis.max,
        idle_alert_redis_missing=redis.missing,
        idle_alert_prometheus_p50_ms=prom.p50,
        idle_alert_prometheus_max_ms=prom.max,
        idle_alert_prometheus_missing=prom.missing,
        idle_alert_prometheus_behind_topic_max_ms=max(behind) if behind else None,
        prometheus_scrape_interval_s=prometheus_s[0],
        prometheus_evaluation_interval_s=prometheus_s[1],
        dcgm=dcgm_figures(dcgm),
    )


def alert_fields(result: AlertResult | None) -> dict[str, Any]:
    """The result as flat JSON fields; every field null when the part did not run."""
    if result is None:
        names = [f.name for f in fields(AlertResult) if f.name != "dcgm"]
        return dict.fromkeys([*names, *(f.name for f in fields(DcgmFigures))])
    data = asdict(result)
    return {**{k: v for k, v in data.items() if k != "dcgm"}, **data["dcgm"]}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def format_alerts(r: AlertResult) -> list[str]:
    """Summary lines of the idle-alert part."""
    d = r.dcgm
    return [
        f"  idle alert ({r.idle_alert_fired} GPUs of {r.idle_alert_nodes} nodes, idle for "
        f"{r.idle_alert_after_s} s): alerts topic p50 {_ms(r.idle_alert_topic_p50_ms)} "
        f"max {_ms(r.idle_alert_topic_max_ms)}; Redis p50 {_ms(r.idle_alert_redis_p50_ms)} "
        f"max {_ms(r.idle_alert_redis_max_ms)}",
        f"  idle alert in ALERTS   p50 {_ms(r.idle_alert_prometheus_p50_ms)} max "
        f"{_ms(r.idle_alert_prometheus_max_ms)} (scrape {r.prometheus_scrape_interval_s:g} s, "
        f"evaluation {r.prometheus_evaluation_interval_s:g} s; at most "
        f"{_ms(r.idle_alert_prometheus_behind_topic_max_ms)} after the topic; "
        f"{r.idle_alert_prometheus_missing} missing)",
        f"  DCGM + Prometheus      {d.dcgm_idle_alert_latency_typical_s:g} s typical, "
        f"{d.dcgm_idle_alert_latency_worst_s:g} s worst after the idle threshold "
        f"({d.dcgm_idle_alert_after_idle_typical_s:g} / {d.dcgm_idle_alert_after_idle_worst_s:g}"
        f" s after going idle: collect {d.dcgm_collect_interval_s:g} s, scrape "
        f"{d.dcgm_scrape_interval_s:g} s, evaluate {d.dcgm_evaluation_interval_s:g} s, "
        f"for {d.dcgm_rule_for_s:g} s)",
    ]
