"""One step of the pod processor: lifecycle, attribution windows and alerts for one input.

The worker keeps one `PodState` per pod uid and calls `step_pod_event` for each
`k8s.pods` message, `step_usage` for each `pod.usage` message and `step_watermark` for
every pod on each stream-time tick of the partition. Each returns the next state and
everything to publish; nothing here reads a clock or touches Kafka.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.k8s_pod import K8sPod
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from schemas.settings import RuleSettings, WindowSettings
from streams import lifecycle, pod_alerts, pod_attribution
from streams.pod_attribution import UNKNOWN_POD_GRACE_MS
from streams.pod_state import PodState

# A finished pod's state is kept this long (event time) after it finished, so a late pod
# event or usage still finds it finished instead of starting a new, unnamed pod.
FINISHED_KEEP_MS: Final = 3_600_000

__all__ = [
    "FINISHED_KEEP_MS",
    "PodOutputs",
    "next_due",
    "step_pod_event",
    "step_usage",
    "step_watermark",
]


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


def next_due(state: PodState, rules: RuleSettings, windows: WindowSettings) -> int | None:
    """The earliest stream time at which `step_watermark` publishes something for `state`
    or the processor forgets it; None when only a new input can change that.

    Below it a watermark step only moves bookkeeping that any later step (the next one
    due, or the catch-up before the pod's next input) computes the same from the newer
    watermark: the horizon, `closed_until` of a pod with no open window, the history
    trimmed to it. A watermark alone causes no transition (stalls and their ends come with
    usage, queued and finished with pod events), so what it can publish is the queued
    alert falling due and the windows it closes.
    """
    window_ms = windows.window_s * 1000
    wait = windows.allowed_lateness_s * 1000
    due: list[int] = []
    if state.state == "finished":
        # All windows close at the finish plus the lateness; then the state is kept an hour.
        due.append(state.since + wait if state.windows else state.since + FINISHED_KEEP_MS)
    elif state.windows:
        wait += UNKNOWN_POD_GRACE_MS if state.event_ts is None else 0
        due.append(state.windows[0].start + window_ms + wait)
    if state.queued_alert_since is not None and not state.queued_alert_firing:
        due.append(state.queued_alert_since + rules.queued_alert_after_s * 1000)
    return min(due) if due else None
