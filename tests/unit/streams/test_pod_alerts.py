"""Pod alerts: PodQueuedTooLong and PodStalled, firing and resolved at event time."""

from __future__ import annotations

import hashlib

import msgspec
from test_pod_fixtures import RULES, UID, WINDOWS, container, events, pod, usage

from schemas.alert import TOPIC as ALERTS
from schemas.alert import Alert
from streams.core.alert_identity import fingerprint
from streams.core.pod.pod_alerts import alert_labels
from streams.core.pod.pod_state import PodState
from streams.core.pod.pod_step import step_pod_event, step_usage, step_watermark

S = 1000
T0 = 1_764_400_000_000  # creation of the test pod in these examples


def brief(alerts: list[Alert]) -> list[tuple[str, str, int, int, float | None]]:
    """(name, status, ts, since, value) of each alert."""
    return [(a.name, a.status, a.ts, a.since, a.value) for a in alerts]


def pending() -> PodState:
    state, out = step_pod_event(None, pod("Pending", ts=T0, rv=1, created_at=T0), RULES, WINDOWS)
    assert out.alerts == []
    return state


def test_fingerprint_is_sha1_of_name_kind_id_16_hex() -> None:
    expected = hashlib.sha1(f"PodStalled|pod|{UID}".encode()).hexdigest()[:16]
    assert fingerprint("PodStalled", "pod", UID) == expected
    assert len(expected) == 16
    assert int(expected, 16) >= 0
    assert fingerprint("PodQueuedTooLong", "pod", UID) != expected


def test_queued_too_long_fires_on_a_watermark_tick_at_queued_since_plus_600_s() -> None:
    state = pending()
    state, out = step_watermark(state, T0 + 599_999, RULES, WINDOWS)
    assert out.alerts == []
    state, out = step_watermark(state, T0 + 650 * S, RULES, WINDOWS)  # the tick is later
    (alert,) = out.alerts
    assert brief([alert]) == [("PodQueuedTooLong", "firing", T0 + 600 * S, T0, 600.0)]
    assert alert.severity == "warning"
    assert alert.fingerprint == fingerprint("PodQueuedTooLong", "pod", UID)
    assert (alert.subject.kind, alert.subject.uid, alert.subject.uuid) == ("pod", UID, None)
    assert alert.labels == {
        "namespace": "ml",
        "pod": "train-0",
        "team": "vision",
        "node": "gpu-node-17",
    }
    assert alert.summary == "ml/train-0 queued for 600 s (ContainerCreating)"
    assert ALERTS.decode(ALERTS.encode(alert)) == alert
    state, out = step_watermark(state, T0 + 700 * S, RULES, WINDOWS)
    assert out.alerts == []  # fires once
    state, out = step_pod_event(state, pod("Running", ts=T0 + 800 * S, rv=2), RULES, WINDOWS)
    (resolved,) = out.alerts
    assert brief([resolved]) == [("PodQueuedTooLong", "resolved", T0 + 800 * S, T0, 800.0)]
    assert resolved.fingerprint == alert.fingerprint
    assert resolved.summary == "ml/train-0 no longer queued (running) after 800 s"


def test_queued_too_long_found_by_the_event_that_ends_it() -> None:
    _, out = step_pod_event(pending(), pod("Running", ts=T0 + 700 * S, rv=2), RULES, WINDOWS)
    assert brief(out.alerts) == [
        ("PodQueuedTooLong", "firing", T0 + 600 * S, T0, 600.0),
        ("PodQueuedTooLong", "resolved", T0 + 700 * S, T0, 700.0),
    ]
    _, out = step_pod_event(pending(), pod("Running", ts=T0 + 600 * S, rv=2), RULES, WINDOWS)
    assert out.alerts == []  # left exactly at the threshold: never queued past it


def test_kueue_gated_pod_queued_too_long() -> None:
    created = 1741090000000
    state = None
    fired = []
    for message in events("kueue-gated"):
        state, out = step_pod_event(state, message, RULES, WINDOWS)
        fired += out.alerts
        if message.type == "RESYNC":  # still gated at the tick of 650 s
            state, out = step_watermark(state, created + 650 * S, RULES, WINDOWS)
            fired += out.alerts
    # Queued until it runs: ContainerCreating after admission is queued still.
    assert [(a.status, a.ts - created) for a in fired] == [
        ("firing", 600 * S),
        ("resolved", 930 * S),
    ]
    assert fired[0].summary == "ml/sweep-lr-3-0 queued for 600 s (WaitingForQuota)"
    assert "node" not in fired[0].labels
    assert fired[1].labels["node"] == "gpu-node-05"


def test_a_pod_first_seen_long_queued_fires_at_once() -> None:
    late = pod("Pending", ts=T0 + 2000 * S, rv=5, created_at=T0)
    _, out = step_pod_event(None, late, RULES, WINDOWS)
    assert brief(out.alerts) == [("PodQueuedTooLong", "firing", T0 + 600 * S, T0, 600.0)]


def test_pod_stalled_fires_when_idle_300_s_and_resolves_on_activity() -> None:
    state, _ = step_pod_event(None, pod("Running", ts=T0, rv=1), RULES, WINDOWS)
    idle_from = T0 + 1000 * S
    state, out = step_usage(
        state, usage(T0 + 990 * S, T0 + 1290 * S, idle_since=idle_from), RULES, WINDOWS
    )
    assert out.alerts == []
    state, out = step_usage(
        state, usage(T0 + 1290 * S, T0 + 1305 * S, idle_since=idle_from), RULES, WINDOWS
    )
    (alert,) = out.alerts
    assert brief([alert]) == [("PodStalled", "firing", T0 + 1300 * S, idle_from, 300.0)]
    assert alert.summary == "ml/train-0 stalled: idle on all its GPUs for 300 s"
    again, out = step_usage(
        state, usage(T0 + 1290 * S, T0 + 1305 * S, idle_since=idle_from), RULES, WINDOWS
    )
    assert out.alerts == []
    assert again == state
    state, out = step_usage(state, usage(T0 + 1305 * S, T0 + 1310 * S), RULES, WINDOWS)
    assert brief(out.alerts) == [("PodStalled", "resolved", T0 + 1305 * S, idle_from, 305.0)]
    assert out.alerts[0].summary == "ml/train-0 no longer stalled (running)"


def test_crash_loop_stall_fires_and_finishing_resolves_it() -> None:
    state, _ = step_pod_event(None, pod("Running", ts=T0, rv=1), RULES, WINDOWS)
    looping = [container("waiting", "CrashLoopBackOff", exit_code=1, restarts=2)]
    state, out = step_pod_event(
        state, pod(ts=T0 + 60 * S, rv=2, containers=looping), RULES, WINDOWS
    )
    assert brief(out.alerts) == [("PodStalled", "firing", T0 + 60 * S, T0 + 60 * S, 0.0)]
    assert out.alerts[0].summary == "ml/train-0 stalled: CrashLoopBackOff"
    state, out = step_pod_event(state, pod("Failed", ts=T0 + 90 * S, rv=3), RULES, WINDOWS)
    assert brief(out.alerts) == [("PodStalled", "resolved", T0 + 90 * S, T0 + 60 * S, 30.0)]
    assert state.stalled_alert_since is None


def test_labels_without_team_or_node() -> None:
    bare = PodState(uid=UID, namespace="ml", name="p")
    assert alert_labels(bare) == {"namespace": "ml", "pod": "p"}


def test_a_deletion_the_watcher_did_not_see_finishes_the_pod_at_the_relist_and_resolves() -> None:
    # Stalled (crash loop) when the watcher went down; it found the pod gone from its first
    # list after the restart: the last value it knew, DELETED, at the relist's time.
    state, _ = step_pod_event(None, pod("Running", ts=T0, rv=1), RULES, WINDOWS)
    looping = [container("waiting", "CrashLoopBackOff", exit_code=1, restarts=2)]
    last = pod(ts=T0 + 60 * S, rv=2, containers=looping)
    state, out = step_pod_event(state, last, RULES, WINDOWS)
    assert brief(out.alerts) == [("PodStalled", "firing", T0 + 60 * S, T0 + 60 * S, 0.0)]
    relisted_at = T0 + 3600 * S
    gone = msgspec.structs.replace(last, type="DELETED", ts=relisted_at, final_state_unknown=True)
    state, out = step_pod_event(state, gone, RULES, WINDOWS)
    assert [(c.from_state, c.to_state, c.reason, c.ts) for c in out.lifecycle] == [
        ("stalled", "finished", "DeletedFinalStateUnknown", relisted_at)
    ]
    assert brief(out.alerts) == [("PodStalled", "resolved", relisted_at, T0 + 60 * S, 3540.0)]
    assert (state.state, state.stalled_alert_since) == ("finished", None)
