"""One step of the pod processor: lifecycle, attribution windows and alerts for one input.

The worker keeps one `PodState` per pod uid and calls `step_pod_event` for each
`k8s.pods` message, `step_usage` for each `pod.usage` message and `step_watermark` for
every pod on each stream-time tick of the partition. Each returns the next state and
everything to publish; nothing here reads a clock or touches Kafka.
"""

from __future__ import annotations

from typing import NamedTuple

from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.k8s_pod import K8sPod
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from schemas.settings import RuleSettings, WindowSettings
from streams import lifecycle, pod_alerts, pod_attribution
from streams.pod_state import PodState

__all__ = ["PodOutputs", "step_pod_event", "step_usage", "step_watermark"]


class PodOutputs(NamedTuple):
    """What one step publishes, and whether its usage was late (`late_events_total`)."""

    lifecycle: list[PodLifecycle]
    attributions: list[Attribution]
    alerts: list[Alert]
    late_usage: int = 0
    """1 when a usage message had a part for a window already closed (not re-emitted)."""


def _finish(
    before: PodState | None,
    state: PodState,
    transitions: list[PodLifecycle],
    *,
    rules: RuleSettings,
    windows: WindowSettings,
    now_ms: int | None,
) -> tuple[PodState, PodOutputs]:
    state, records = pod_attribution.close_windows(state, windows, now_ms)
    state, alerts = pod_alerts.evaluate(before, state, transitions, rules)
    return state, PodOutputs(transitions, records, alerts)


def step_pod_event(
    state: PodState | None, event: K8sPod, rules: RuleSettings, windows: WindowSettings
) -> tuple[PodState, PodOutputs]:
    """A `k8s.pods` message: transitions, a finished pod's last windows, alerts."""
    after, transitions = lifecycle.on_pod_event(state, event, rules)
    return _finish(state, after, transitions, rules=rules, windows=windows, now_ms=None)


def step_usage(
    state: PodState | None, usage: PodUsage, rules: RuleSettings, windows: WindowSettings
) -> tuple[PodState, PodOutputs]:
    """A `pod.usage` message: counted into windows; it may stall the pod or end a stall."""
    counted, outcome = pod_attribution.add_usage(state, usage, windows)
    after, transitions = lifecycle.on_usage(counted, usage, rules)
    after, out = _finish(state, after, transitions, rules=rules, windows=windows, now_ms=None)
    return after, out._replace(late_usage=int(outcome == "late"))


def step_watermark(
    state: PodState, now_ms: int, rules: RuleSettings, windows: WindowSettings
) -> tuple[PodState, PodOutputs]:
    """A stream-time tick: queued alerts due by `now_ms`, windows it closes."""
    after, transitions = lifecycle.on_watermark(state, now_ms, rules)
    return _finish(state, after, transitions, rules=rules, windows=windows, now_ms=now_ms)
