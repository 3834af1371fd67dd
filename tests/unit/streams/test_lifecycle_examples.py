"""Worked examples of the lifecycle state machine, computed by hand."""

from __future__ import annotations

import msgspec
from test_pod_fixtures import RULES, container, moves, pod, usage

from schemas.settings import RuleSettings
from streams.core.pod import lifecycle
from streams.core.pod.pod_state import PodState

S = 1000  # ms per second: the examples are written in seconds


def running_since(ts: int) -> PodState:
    """The test pod, created at 0 and running since `ts`."""
    state, _ = lifecycle.on_pod_event(None, pod("Pending", ts=0, rv=1), RULES)
    state, _ = lifecycle.on_pod_event(state, pod("Running", ts=ts, rv=2), RULES)
    return state


def test_queued_120_s_then_running() -> None:
    created = pod("Pending", ts=10 * S, rv=7, created_at=10 * S)
    state, first = lifecycle.on_pod_event(None, created, RULES)
    state, second = lifecycle.on_pod_event(state, pod("Running", ts=130 * S, rv=9), RULES)
    assert moves(first) == [(None, "queued", "ContainerCreating", 10 * S)]
    assert (first[0].queued_ms, first[0].running_ms, first[0].stalled_ms) == (0, 0, 0)
    assert moves(second) == [("queued", "running", None, 130 * S)]
    assert (second[0].queued_ms, second[0].running_ms, second[0].stalled_ms) == (120000, 0, 0)
    assert (state.state, state.since) == ("running", 130 * S)


def test_a_pod_first_seen_pending_has_been_queued_since_its_creation() -> None:
    state, first = lifecycle.on_pod_event(None, pod("Pending", ts=10 * S, rv=7), RULES)
    state, second = lifecycle.on_pod_event(state, pod("Running", ts=130 * S, rv=9), RULES)
    assert moves(first) == [(None, "queued", "ContainerCreating", 0)]
    assert second[0].queued_ms == 130000


def test_idle_for_stall_after_s_stalls_at_idle_since_plus_300_s() -> None:
    state = running_since(500 * S)
    # Idle since 1000 s on every GPU; usage flushed every 10 s.
    for start in range(1000, 1290, 10):
        state, out = lifecycle.on_usage(
            state, usage(start * S, (start + 10) * S, idle_since=1000 * S), RULES
        )
        assert out == [], start
    state, out = lifecycle.on_usage(state, usage(1290 * S, 1305 * S, idle_since=1000 * S), RULES)
    assert moves(out) == [("running", "stalled", "Idle", 1300 * S)]
    assert (out[0].running_ms, out[0].stalled_ms) == (800000, 0)
    # Activity in the next flush: running again from the start of that interval.
    state, out = lifecycle.on_usage(state, usage(1305 * S, 1310 * S, idle_since=None), RULES)
    assert moves(out) == [("stalled", "running", None, 1305 * S)]
    assert (out[0].running_ms, out[0].stalled_ms) == (800000, 5000)


def test_idle_stall_needs_usage_through_the_stall_and_keeps_the_event_time() -> None:
    state = running_since(500 * S)
    state, _ = lifecycle.on_usage(state, usage(1000 * S, 1010 * S, idle_since=1000 * S), RULES)
    # A watermark past 1300 s does not show that the pod stayed idle until then.
    state, out = lifecycle.on_watermark(state, 1400 * S, RULES)
    assert out == []
    # The usage that does, read later: stalled at 1300 s, however late it is noticed.
    state, out = lifecycle.on_usage(state, usage(1010 * S, 1400 * S, idle_since=1000 * S), RULES)
    assert moves(out) == [("running", "stalled", "Idle", 1300 * S)]
    assert lifecycle.on_watermark(state, 1500 * S, RULES)[1] == []


def test_a_pod_event_ahead_of_the_usage_does_not_stall_a_pod_idle_too_briefly() -> None:
    # A relist at 1000 s, read before the usage it follows (a replayed backlog).
    state = running_since(0)
    relist = msgspec.structs.replace(pod("Running", ts=1000 * S, rv=2), type="RESYNC")
    state, out = lifecycle.on_pod_event(state, relist, RULES)
    assert out == []
    # Idle from 0 s to 200 s, then busy: 200 s idle, under stall_after_s (300 s).
    state, out = lifecycle.on_usage(state, usage(0, 200 * S, idle_since=0), RULES)
    assert out == []
    state, out = lifecycle.on_usage(state, usage(200 * S, 210 * S, idle_since=None), RULES)
    assert out == []
    assert (state.state, state.running_ms, state.stalled_ms) == ("running", 0, 0)


def test_a_later_idle_since_ends_the_stall_and_can_start_another() -> None:
    state = running_since(0)
    state, _ = lifecycle.on_usage(state, usage(0, 400 * S, idle_since=50 * S), RULES)
    assert (state.state, state.since) == ("stalled", 350 * S)
    # Active somewhere in [400, 450) s, idle again since 450 s; this flush reaches 760 s.
    state, out = lifecycle.on_usage(state, usage(400 * S, 760 * S, idle_since=450 * S), RULES)
    assert moves(out) == [
        ("stalled", "running", None, 400 * S),
        ("running", "stalled", "Idle", 750 * S),
    ]


def test_idle_but_not_long_enough_stays_running() -> None:
    state = running_since(0)
    state, out = lifecycle.on_usage(state, usage(0, 299 * S, idle_since=0), RULES)
    assert out == []
    assert state.state == "running"
    short = RuleSettings(stall_after_s=60)
    assert moves(
        lifecycle.on_usage(running_since(0), usage(0, 299 * S, idle_since=0), short)[1]
    ) == [("running", "stalled", "Idle", 60 * S)]


def test_crash_loop_stalls_and_ends_when_running_and_ready() -> None:
    state = running_since(100 * S)
    unready = [
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": None}
    ]
    ready = [{"type": "Ready", "status": "True", "reason": None, "message": None}]
    looping = [container("waiting", "CrashLoopBackOff", exit_code=1, restarts=3)]
    state, out = lifecycle.on_pod_event(
        state, pod(ts=200 * S, rv=3, containers=looping, conditions=unready), RULES
    )
    assert moves(out) == [("running", "stalled", "CrashLoopBackOff", 200 * S)]
    # Restarted, not ready yet: still stalled; ready: running.
    restarted = [container("running", restarts=4)]
    state, out = lifecycle.on_pod_event(
        state, pod(ts=210 * S, rv=4, containers=restarted, conditions=unready), RULES
    )
    assert out == []
    state, out = lifecycle.on_pod_event(
        state, pod(ts=215 * S, rv=5, containers=restarted, conditions=ready), RULES
    )
    assert moves(out) == [("stalled", "running", None, 215 * S)]
    assert (out[0].running_ms, out[0].stalled_ms) == (100000, 15000)


def test_crash_loop_ending_while_idle_stays_stalled_as_idle() -> None:
    state = running_since(0)
    state, _ = lifecycle.on_usage(state, usage(0, 100 * S, idle_since=0), RULES)
    looping = [container("waiting", "CrashLoopBackOff", restarts=1)]
    state, out = lifecycle.on_pod_event(state, pod(ts=100 * S, rv=3, containers=looping), RULES)
    assert moves(out) == [("running", "stalled", "CrashLoopBackOff", 100 * S)]
    state, _ = lifecycle.on_usage(state, usage(100 * S, 400 * S, idle_since=0), RULES)
    state, out = lifecycle.on_pod_event(state, pod(ts=400 * S, rv=4), RULES)
    assert moves(out) == [("stalled", "stalled", "Idle", 400 * S)]  # a reason change only
    assert state.since == 100 * S


def test_usage_before_the_first_pod_event_is_kept() -> None:
    state, out = lifecycle.on_usage(None, usage(0, 400 * S, idle_since=0), RULES)
    assert out == []
    assert state.state is None
    assert state.idle_since == 0
    state, out = lifecycle.on_pod_event(state, pod("Running", ts=50 * S, rv=2), RULES)
    assert moves(out) == [(None, "running", None, 50 * S), ("running", "stalled", "Idle", 300 * S)]


def test_stale_and_repeated_events_change_nothing() -> None:
    state = running_since(100 * S)
    assert lifecycle.on_pod_event(state, pod("Pending", ts=0, rv=1), RULES) == (state, [])
    assert lifecycle.on_pod_event(state, pod("Running", ts=100 * S, rv=2), RULES)[1] == []
    resync = pod("Pending", ts=900 * S, rv=1, type_="RESYNC")  # an old state re-sent late
    assert lifecycle.on_pod_event(state, resync, RULES) == (state, [])
    # Without comparable resource versions the event times decide.
    older = msgspec.structs.replace(pod("Pending", ts=50 * S, rv=1), resource_version="x")
    assert lifecycle.on_pod_event(state, older, RULES) == (state, [])
    newer = msgspec.structs.replace(pod("Succeeded", ts=150 * S, rv=1), resource_version="x")
    assert moves(lifecycle.on_pod_event(state, newer, RULES)[1])[0][1] == "finished"


def test_resync_is_applied_like_modified() -> None:
    state, _ = lifecycle.on_pod_event(None, pod("Pending", ts=0, rv=1), RULES)
    state, out = lifecycle.on_pod_event(
        state, pod("Running", ts=10 * S, rv=5, type_="RESYNC"), RULES
    )
    assert moves(out) == [("queued", "running", None, 10 * S)]


def test_deleted_finishes_even_with_the_last_version() -> None:
    """A relist that misses a pod sends DELETED with the last value, version unchanged."""
    state = running_since(100 * S)
    state, out = lifecycle.on_pod_event(
        state, pod("Running", ts=200 * S, rv=2, type_="DELETED"), RULES
    )
    assert moves(out) == [("running", "finished", "Deleted", 200 * S)]
    assert lifecycle.on_pod_event(state, pod("Running", ts=300 * S, rv=9), RULES) == (state, [])


def test_clock_going_back_clamps_durations() -> None:
    state = running_since(100 * S)
    state, out = lifecycle.on_pod_event(state, pod("Succeeded", ts=40 * S, rv=3), RULES)
    assert moves(out) == [("running", "finished", "Completed", 100 * S)]
    assert (out[0].queued_ms, out[0].running_ms) == (100000, 0)


def test_phase_unknown_keeps_the_state() -> None:
    state = running_since(100 * S)
    unknown = pod("Unknown", ts=200 * S, rv=3, containers=[])
    state, out = lifecycle.on_pod_event(state, unknown, RULES)
    assert out == []
    assert state.state == "running"
    fresh, out = lifecycle.on_pod_event(None, unknown, RULES)
    assert out == []
    assert fresh.state is None


def test_state_at() -> None:
    state = running_since(100 * S)
    assert lifecycle.state_at(state, 50 * S) == "queued"
    assert lifecycle.state_at(state, 100 * S) == "running"
    assert lifecycle.state_at(PodState(uid=state.uid), 0) is None


def test_crash_loop_ending_before_the_idle_stall_is_due_runs_in_between() -> None:
    state = running_since(0)
    looping = [container("waiting", "CrashLoopBackOff", restarts=1)]
    state, _ = lifecycle.on_pod_event(state, pod(ts=50 * S, rv=3, containers=looping), RULES)
    state, out = lifecycle.on_usage(state, usage(0, 600 * S, idle_since=200 * S), RULES)
    assert out == []  # crash-looping still: the reason stays
    state, out = lifecycle.on_pod_event(state, pod(ts=300 * S, rv=4), RULES)
    assert moves(out) == [
        ("stalled", "running", None, 300 * S),
        ("running", "stalled", "Idle", 500 * S),
    ]
    assert (out[1].running_ms, out[1].stalled_ms) == (250000, 250000)
