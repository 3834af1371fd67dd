"""One step of the pod processor: lifecycle, attribution windows and alerts for one input.

The worker keeps one `PodState` per pod uid. An input ahead of the pod side's watermark
is held (by the processor, in release order: `Held.order`); `release` applies the held
inputs the watermark has reached in event-time order, whatever order they came in,
closing windows and firing queued alerts in between exactly when their time comes, then
steps the pod to the watermark. `step_pod_event`, `step_usage` and `step_watermark` are
the single steps. Each returns the next state and everything to publish; nothing here
reads a clock or touches Kafka. The rules passed in are the worker's; each step uses the
ones in force in the pod's cluster (`RuleSettings.of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.k8s_pod import K8sPod
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from schemas.settings import RuleSettings, WindowSettings
from streams.core.pod import lifecycle, pod_alerts, pod_attribution
from streams.core.pod.pod_attribution import UNKNOWN_POD_GRACE_MS
from streams.core.pod.pod_state import ClosedWindow, Held, PodState

# A finished pod's state is kept this long (event time) after it finished, so a late pod
# event or usage still finds it finished instead of starting a new, unnamed pod.
FINISHED_KEEP_MS: Final = 3_600_000

__all__ = [
    "FINISHED_KEEP_MS",
    "PodOutputs",
    "next_due",
    "release",
    "rules_of",
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
    """1 when a usage message had a part for a window closed past the revision horizon
    (left out)."""
    revisions: int = 0
    """Records among `attributions` that revise a window emitted before."""


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


def rules_of(state: PodState, rules: RuleSettings) -> RuleSettings:
    """The thresholds in force in the pod's cluster (`RuleSettings.of`)."""
    return rules.of(state.cluster_name()) if rules.clusters else rules


def step_pod_event(
    state: PodState | None, event: K8sPod, rules: RuleSettings, windows: WindowSettings
) -> tuple[PodState, PodOutputs]:
    """A `k8s.pods` message: transitions, a finished pod's last windows, alerts."""
    rules = rules.of(event.cluster)
    after, transitions = lifecycle.on_pod_event(state, event, rules)
    return _finish(state, after, transitions, rules=rules, windows=windows, now_ms=None)


def step_usage(
    state: PodState | None, usage: PodUsage, rules: RuleSettings, windows: WindowSettings
) -> tuple[PodState, PodOutputs]:
    """A `pod.usage` message: counted into windows; it may stall the pod or end a stall."""
    rules = rules.of(usage.cluster)
    revised: list[ClosedWindow] = []
    counted, outcome = pod_attribution.add_usage(state, usage, windows, revised)
    after, transitions = lifecycle.on_usage(counted, usage, rules)
    after, out = _finish(state, after, transitions, rules=rules, windows=windows, now_ms=None)
    if revised:
        out.attributions[:0] = pod_attribution.revision_records(after, revised, windows)
    late = int(outcome == "late")  # built whole: NamedTuple._replace costs more than the step
    return after, PodOutputs(out.lifecycle, out.attributions, out.alerts, late, len(revised))


def step_watermark(
    state: PodState, now_ms: int, rules: RuleSettings, windows: WindowSettings
) -> tuple[PodState, PodOutputs]:
    """A stream-time tick: queued alerts due by `now_ms`, windows it closes."""
    rules = rules_of(state, rules)
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
    due: list[int] = []
    if state.state == "finished":
        # Its windows close together (with usage or not: later usage is late); then the
        # state is kept an hour.
        last = state.since - 1  # the pod's last running instant
        finish_window_end = last - last % window_ms + window_ms
        closing = state.windows or state.closed_until < finish_window_end
        close_at = pod_attribution.finish_closes_at(state, windows)
        due.append(close_at if closing else state.since + FINISHED_KEEP_MS)
    elif state.windows:
        grace = UNKNOWN_POD_GRACE_MS if state.event_ts is None else 0
        due.append(state.windows[0].start + window_ms + grace)
    if state.queued_alert_since is not None and not state.queued_alert_firing:
        after_s = rules_of(state, rules).queued_alert_after_s
        due.append(state.queued_alert_since + after_s * 1000)
    return min(due) if due else None


def release(
    state: PodState,
    ready: Sequence[Held],
    until: int,
    rules: RuleSettings,
    windows: WindowSettings,
) -> tuple[PodState, PodOutputs]:
    """Apply held inputs the watermark `until` reached (in `Held.order`), then step to it.

    Before each input at time `k` the pod is stepped to `k - 1`: what falls due before an
    input (a window closing, the queued alert) happens
    before it, as it would had the watermark passed between the two, so the records do
    not depend on how far each tick moved the watermark.
    """
    lifecycle_: list[PodLifecycle] = []
    attributions: list[Attribution] = []
    alerts: list[Alert] = []
    late = revisions = 0

    def keep(out: PodOutputs) -> None:
        nonlocal late, revisions
        lifecycle_.extend(out.lifecycle)
        attributions.extend(out.attributions)
        alerts.extend(out.alerts)
        late += out.late_usage
        revisions += out.revisions

    for item in ready:
        # Even with nothing due, a step moves what the watermark has closed (a pod with no
        # window open has its closed windows marked): usage for them after it is late.
        state, out = step_watermark(state, item.key - 1, rules, windows)
        keep(out)
        if item.event is not None:
            state, out = step_pod_event(state, item.event, rules, windows)
        else:
            assert item.usage is not None  # a held input is one or the other
            state, out = step_usage(state, item.usage, rules, windows)
        keep(out)
    state, out = step_watermark(state, until, rules, windows)
    keep(out)
    return state, PodOutputs(lifecycle_, attributions, alerts, late, revisions)
