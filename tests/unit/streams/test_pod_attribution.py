"""Per-pod attribution windows: bucketing, splitting, closing, late usage, the last window."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_pod_fixtures import GPU_A, GPU_B, RULES, WINDOWS, gpu, pod, usage

from schemas.attribution import TOPIC as ATTRIBUTION
from schemas.attribution import Attribution
from schemas.ids import GpuUuid
from schemas.settings import WindowSettings
from streams.core.pod import pod_attribution
from streams.core.pod.pod_attribution import add_usage, close_windows, least_precise
from streams.core.pod.pod_state import PodState
from streams.core.pod.pod_step import step_pod_event, step_usage, step_watermark

S = 1000


def running(ts: int = 0) -> PodState:
    """The test pod, running since `ts`."""
    state, _ = step_pod_event(None, pod("Running", ts=ts, rv=1), RULES, WINDOWS)
    return state


def feed(state: PodState, spans: list[tuple[int, int]], **kw: object) -> PodState:
    """Usage over each `(start_s, end_s)`, counted as added."""
    for start, end in spans:
        state, out = step_usage(state, usage(start * S, end * S, **kw), RULES, WINDOWS)  # type: ignore[arg-type]
        assert out.late_usage == 0
    return state


def test_a_window_closes_when_the_usage_frontier_reaches_its_end() -> None:
    """The watermark is the node side's usage frontier: its lateness is allowed for there."""
    state = feed(running(), [(t, t + 10) for t in range(0, 60, 10)])
    state, out = step_watermark(state, 59_999, RULES, WINDOWS)
    assert out.attributions == []
    state, out = step_watermark(state, 60_000, RULES, WINDOWS)
    (record,) = out.attributions
    assert (record.window_start, record.window_end, record.ts) == (0, 60 * S, 60 * S)
    assert (record.uid, record.namespace, record.pod, record.node) == (
        state.uid,
        "ml",
        "train-0",
        "gpu-node-17",
    )
    assert record.labels == {"team": "vision", "project": "llm"}
    assert record.owner is not None
    assert record.owner.name == "train"
    assert record.state == "running"
    assert record.method == "exclusive"
    assert record.allocated_gpu_seconds == pytest.approx(60.0)
    assert record.used_gpu_seconds == pytest.approx(30.0)
    assert record.idle_gpu_seconds == pytest.approx(6.0)
    assert record.cost_usd == pytest.approx(0.06)
    assert record.waste_usd == pytest.approx(0.006)
    assert record.energy_joules == pytest.approx(24_000.0)
    assert record.vram_byte_seconds == pytest.approx(60e9)
    assert record.vram_peak_bytes == 40 * 2**30
    assert [g.uuid for g in record.gpus] == [GPU_A]
    assert state.windows == ()
    assert state.closed_until == 60 * S
    assert ATTRIBUTION.decode(ATTRIBUTION.encode(record)) == record  # a valid message


def test_usage_across_a_boundary_is_split_in_proportion() -> None:
    state = feed(running(), [(50, 70)])  # 20 s: 10 s in each window
    state, out = step_watermark(state, 200 * S, RULES, WINDOWS)
    first, second = out.attributions
    assert (first.window_start, second.window_start) == (0, 60 * S)
    assert first.allocated_gpu_seconds == pytest.approx(10.0)
    assert second.allocated_gpu_seconds == pytest.approx(10.0)
    assert first.cost_usd == pytest.approx(0.01)
    assert second.cost_usd == pytest.approx(0.01)
    # A peak is no integral: each piece keeps the interval's peak.
    assert first.vram_peak_bytes == second.vram_peak_bytes == 40 * 2**30


def test_late_usage_revises_the_closed_window_it_belongs_to() -> None:
    """Usage after its window closed (its node away) re-emits the whole window, revised."""
    state = feed(running(), [(0, 30)])
    state, out = step_watermark(state, 80 * S, RULES, WINDOWS)
    (closed,) = out.attributions
    assert (closed.revision, closed.allocated_gpu_seconds) == (0, pytest.approx(30.0))
    assert [c.window.start for c in state.revisable] == [0]  # usage had stopped at 30 s
    state, out = step_usage(state, usage(30 * S, 65 * S), RULES, WINDOWS)
    assert (out.late_usage, out.revisions) == (0, 1)
    (revised,) = out.attributions
    assert (revised.window_start, revised.window_end, revised.revision) == (0, 60 * S, 1)
    assert revised.allocated_gpu_seconds == pytest.approx(60.0)  # 30 + 30 s: the whole
    assert revised.cost_usd == pytest.approx(0.06)
    assert revised.state == closed.state
    # The same identity as the first copy, and the same record as had it all come on time.
    on_time = feed(running(), [(0, 30), (30, 65)])
    _, out = step_watermark(on_time, 80 * S, RULES, WINDOWS)
    (whole,) = out.attributions
    assert msgspec.structs.replace(revised, revision=0) == whole
    state, out = step_watermark(state, 200 * S, RULES, WINDOWS)
    (later,) = out.attributions
    assert later.window_start == 60 * S  # the part after the window, in its own
    assert later.allocated_gpu_seconds == pytest.approx(5.0)


def test_usage_older_than_the_revision_horizon_is_late_and_left_out() -> None:
    short = WindowSettings(window_s=60, allowed_lateness_s=10, revision_horizon_s=60)
    state = running()
    state, _ = step_usage(state, usage(0, 30 * S), RULES, short)
    state, out = step_watermark(state, 200 * S, RULES, short)  # closed through 180 s
    assert len(out.attributions) == 1
    assert state.revisable == ()  # its end, 60 s, is past the horizon: nothing kept
    state, out = step_usage(state, usage(30 * S, 65 * S), RULES, short)
    assert (out.late_usage, out.revisions, out.attributions) == (1, 0, [])


def test_without_revisions_late_usage_is_counted_and_the_window_not_re_emitted() -> None:
    off = WindowSettings(window_s=60, allowed_lateness_s=10, revision_horizon_s=0)
    state = running()
    state, _ = step_usage(state, usage(0, 30 * S), RULES, off)
    state, out = step_watermark(state, 80 * S, RULES, off)
    (closed,) = out.attributions
    state, out = step_usage(state, usage(30 * S, 65 * S), RULES, off)
    assert (out.late_usage, out.revisions) == (1, 0)
    state, out = step_watermark(state, 200 * S, RULES, off)
    (later,) = out.attributions
    assert later.window_start == 60 * S  # only the on-time part, in its own window
    assert later.allocated_gpu_seconds == pytest.approx(5.0)
    assert closed.allocated_gpu_seconds == pytest.approx(30.0)


def test_a_window_the_usage_covered_to_its_end_is_not_kept() -> None:
    state = feed(running(), [(0, 60), (60, 70)])
    state, out = step_watermark(state, 60 * S, RULES, WINDOWS)
    assert len(out.attributions) == 1
    assert state.revisable == ()


def test_a_window_with_no_usage_yet_is_closed_all_the_same() -> None:
    state, out = step_watermark(running(), 80 * S, RULES, WINDOWS)
    assert out.attributions == []
    _, out = step_usage(state, usage(10 * S, 20 * S), RULES, WINDOWS)
    # Its first copy comes with the usage that came after it closed.
    (first,) = out.attributions
    assert (first.window_start, first.revision, out.late_usage) == (0, 0, 0)
    assert first.allocated_gpu_seconds == pytest.approx(10.0)


def test_repeated_usage_is_counted_once() -> None:
    state = feed(running(), [(0, 10), (10, 20)])
    again, outcome = add_usage(state, usage(0, 10 * S), WINDOWS)
    assert outcome == "duplicate"
    assert again == state
    overlap, outcome = add_usage(state, usage(15 * S, 25 * S), WINDOWS)  # only [20, 25) is new
    assert outcome == "added"
    assert overlap.windows[0].gpus[0].allocated_seconds == pytest.approx(25.0)  # 20 + 10 / 2


def test_a_finished_pods_last_window_ends_at_the_finish() -> None:
    state = feed(running(), [(t, t + 10) for t in range(0, 80, 10)])
    state, out = step_pod_event(state, pod("Succeeded", ts=95 * S, rv=2), RULES, WINDOWS)
    assert [t.to_state for t in out.lifecycle] == ["finished"]
    assert out.attributions == []  # the node side may still flush its last seconds
    # Until its usage reaches the finish, the windows wait (up to the finish window's end).
    assert step_watermark(state, 119 * S, RULES, WINDOWS)[1].attributions == []
    # Usage flushed after the finish event counts; once it reaches the finish, they close
    # at the finish (the watermark is a usage frontier: the lateness is in it).
    state, out = step_usage(state, usage(80 * S, 95 * S), RULES, WINDOWS)
    assert out.late_usage == 0
    assert step_watermark(state, 95 * S - 1, RULES, WINDOWS)[1].attributions == []
    state, out = step_watermark(state, 95 * S, RULES, WINDOWS)
    first, last = out.attributions
    assert (first.window_start, first.window_end, first.state) == (0, 60 * S, "running")
    assert (last.window_start, last.window_end, last.ts) == (60 * S, 95 * S, 95 * S)
    assert last.state == "finished"
    assert last.allocated_gpu_seconds == pytest.approx(35.0)
    # Usage after that is late; no window is emitted again.
    state, out = step_usage(state, usage(95 * S, 100 * S), RULES, WINDOWS)
    assert out.late_usage == 1
    assert step_watermark(state, 10_000 * S, RULES, WINDOWS)[1].attributions == []


def test_state_at_window_end_follows_the_transitions() -> None:
    state = feed(running(), [(0, 50)], idle_since=0)
    state = feed(state, [(50, 310)], idle_since=0)  # stalled at 300 s
    state, out = step_watermark(state, 400 * S, RULES, WINDOWS)
    states = [(r.window_start // S, r.state) for r in out.attributions]
    # The state in force at the instant window_end: the stall at 300 s counts for [240, 300).
    assert states == [
        (0, "running"),
        (60, "running"),
        (120, "running"),
        (180, "running"),
        (240, "stalled"),
        (300, "stalled"),
    ]


def test_record_method_is_the_least_precise_and_totals_are_sums() -> None:
    gpus = (gpu(GPU_B, seconds=10, method="memory_share"), gpu(GPU_A, seconds=10))
    state = feed(running(), [(0, 10)], gpus=gpus)
    (record,) = step_watermark(state, 100 * S, RULES, WINDOWS)[1].attributions
    assert [g.uuid for g in record.gpus] == [GPU_A, GPU_B]
    assert [g.method for g in record.gpus] == ["exclusive", "memory_share"]
    assert record.method == "memory_share"
    assert record.allocated_gpu_seconds == pytest.approx(20.0)
    assert record.vram_peak_bytes == 2 * 40 * 2**30
    assert least_precise([]) == "unknown"
    assert least_precise(["process", "exclusive"]) == "process"
    assert least_precise(["unknown", "memory_share"]) == "unknown"


TOTALS = {  # record field -> GpuTotals field
    "allocated_gpu_seconds": "allocated_seconds",
    "used_gpu_seconds": "used_gpu_seconds",
    "idle_gpu_seconds": "idle_seconds",
    "vram_byte_seconds": "vram_byte_seconds",
    "vram_peak_bytes": "vram_peak_bytes",
    "energy_joules": "energy_joules",
    "cost_usd": "cost_usd",
    "waste_usd": "waste_usd",
}


@given(
    st.lists(
        st.tuples(st.floats(0.001, 1e6), st.floats(0, 1e3), st.floats(0, 1e3)),
        min_size=1,
        max_size=3,
    )
)
def test_a_records_totals_are_the_sums_of_its_gpus_to_the_bit(
    readings: list[tuple[float, float, float]],
) -> None:
    # One GPU (nearly every window) has its totals without summing: they must be what
    # summing the one GPU gives, to the bit (records are compared byte for byte).
    gpus = tuple(
        gpu(GpuUuid(f"GPU-{i}"), seconds=seconds, cost_usd=cost, waste_usd=min(waste, cost))
        for i, (seconds, cost, waste) in enumerate(readings)
    )
    state = feed(running(), [(0, 10)], gpus=gpus)
    (window,) = state.windows
    (record,) = step_watermark(state, 100 * S, RULES, WINDOWS)[1].attributions
    got = [getattr(record, name) for name in TOTALS]
    want = [sum(getattr(g, field) for g in window.gpus) for field in TOTALS.values()]
    assert msgspec.json.encode(got) == msgspec.json.encode(want)


def test_usage_lands_in_its_open_window_wherever_it_is_among_them() -> None:
    # Usage comes in order, so it lands in the last open window or a new last one; an open
    # window before the last (a state whose usage end is unknown) is found all the same,
    # and the windows stay by start.
    m = 60 * S
    state, _ = add_usage(running(), usage(2 * m, 2 * m + 10 * S), WINDOWS)
    for start_s in (10, 0, 90, 100):  # into a new first, the same, a new middle, the middle
        state = msgspec.structs.replace(state, attributed_until=None)
        state, outcome = add_usage(state, usage(start_s * S, start_s * S + 10 * S), WINDOWS)
        assert outcome == "added"
    assert [w.start for w in state.windows] == [0, m, 2 * m]
    assert [w.gpus[0].allocated_seconds for w in state.windows] == [20.0, 20.0, 10.0]


def test_usage_of_a_pod_not_described_yet_waits_for_its_pod_event() -> None:
    state, out = step_usage(None, usage(0, 30 * S), RULES, WINDOWS)
    assert out.late_usage == 0
    assert state.node == "gpu-node-17"
    state, out = step_watermark(state, 100 * S, RULES, WINDOWS)
    assert out.attributions == []  # held for the grace period
    state, _ = step_pod_event(state, pod("Running", ts=90 * S, rv=1), RULES, WINDOWS)
    state, out = step_watermark(state, 101 * S, RULES, WINDOWS)
    (record,) = out.attributions
    assert (record.namespace, record.pod, record.state) == ("ml", "train-0", "running")


def test_a_pod_never_described_is_emitted_after_the_grace() -> None:
    state, _ = step_usage(None, usage(0, 30 * S), RULES, WINDOWS)
    due = 60 * S + pod_attribution.UNKNOWN_POD_GRACE_MS
    assert step_watermark(state, due - 1, RULES, WINDOWS)[1].attributions == []
    (record,) = step_watermark(state, due, RULES, WINDOWS)[1].attributions
    assert (record.namespace, record.pod, record.state, record.node) == (
        "",
        "",
        "running",
        "gpu-node-17",
    )


def test_reprocessing_yields_the_same_records() -> None:
    def run() -> list[Attribution]:
        state = feed(running(), [(0, 25), (25, 70), (70, 130)], idle_since=None)
        return step_watermark(state, 500 * S, RULES, WINDOWS)[1].attributions

    assert run() == run()
    assert [r.window_start for r in run()] == [0, 60 * S, 120 * S]


@pytest.mark.parametrize("horizon_s", [0, 600])
def test_history_is_trimmed_as_windows_close(horizon_s: int) -> None:
    """To what windows still open or revisable need: those within the horizon."""
    windows = WindowSettings(window_s=60, allowed_lateness_s=10, revision_horizon_s=horizon_s)
    state, changes = running(), 0
    for t in range(300, 3000, 100):  # active 50 s, then stalled (idle 300 s already)
        for start, idle in ((t, None), (t + 50, t + 50 - 300)):
            state, out = step_usage(
                state, usage(start * S, (start + 50) * S, idle_since=idle), RULES, windows
            )
            changes += len(out.lifecycle)
        state, _ = step_watermark(state, (t + 100) * S, RULES, windows)
    assert changes == 2 * 27 - 1  # the first spell starts running already
    # Two changes every 100 s: those of the horizon's 600 s, and the one before it.
    assert len(state.history) <= 4 + 2 * horizon_s // 100


def test_close_windows_without_stream_time_closes_nothing() -> None:
    short = WindowSettings(window_s=5, allowed_lateness_s=0)
    state, _ = add_usage(running(), usage(0, 10 * S), short)
    assert close_windows(state, short) == (state, [])
    _, records = close_windows(state, short, now_ms=10 * S)
    assert [(r.window_start, r.window_end) for r in records] == [(0, 5 * S), (5 * S, 10 * S)]
