"""GPU windows: integrals bucketed by (uuid, window), closed by stream time into gpu.window."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.harness.examples import GPU_0, POD_UID, example
from schemas.codec import Codec
from schemas.gpu_window import GpuWindow, PodWindowShare
from schemas.nvml_sample import NvmlSample
from schemas.prices import BUILTIN_PRICES
from streams.core.integrals import PriceBook, integrate_sample
from streams.core.node.gpu_windows import GpuWindowAcc, GpuWindows

MIN = 60_000
LATE = 10_000
T0 = 1_764_412_320_000  # a window start: 1764412320000 % 60000 == 0
IDLE_PCT = 5.0
SAMPLES = Codec(NvmlSample)
WINDOWS = Codec(GpuWindow)


def design_sample(ts: int, interval_ms: int = 1000, **gpu: Any) -> NvmlSample:
    """The docs/DESIGN.md §3.1 sample at another time, decoded through the codec."""
    raw = example("gpuwatch.nvml.sample/v1")
    raw["ts"], raw["interval_ms"] = ts, interval_ms
    raw["gpus"][0].update(gpu)
    return SAMPLES.decode(msgspec.json.encode(raw))


def feed(windows: GpuWindows, samples: list[NvmlSample]) -> list[bool]:
    prices = PriceBook(BUILTIN_PRICES)
    return [windows.add(integrate_sample(s, IDLE_PCT, prices)) for s in samples]


def test_a_minute_of_the_design_sample() -> None:
    windows = GpuWindows(MIN, LATE)
    feed(windows, [design_sample(T0 + i * 1000) for i in range(60)])
    assert windows.close(T0 + MIN + LATE - 1) == []  # lateness not over yet
    (window,) = windows.close(T0 + MIN + LATE)
    # 60 x 1 s at 87 %, held by one pod: busy and allocated all minute, 0.87 x 60 = 52.2
    # used seconds, all of the use explained by the pod.
    assert WINDOWS.decode(WINDOWS.encode(window)) == window  # valid against the contract
    assert (window.uuid, window.node, window.window_start, window.window_end, window.ts) == (
        GPU_0,
        "gpu-node-17",
        T0,
        T0 + MIN,
        T0 + MIN,
    )
    assert window.util_mean_pct == pytest.approx(87.0)
    assert (window.busy_seconds, window.idle_seconds) == pytest.approx((60.0, 0.0))
    assert (window.allocated_seconds, window.unallocated_seconds) == pytest.approx((60.0, 0.0))
    assert window.allocated_idle_seconds == 0.0
    assert (window.attributed_ratio, window.unattributed_ratio) == pytest.approx((1.0, 0.0))
    (pod,) = window.pods
    assert (pod.uid, pod.namespace, pod.pod) == (POD_UID, "ml", "train-0")
    assert pod.allocated_seconds == pytest.approx(60.0)
    assert pod.used_gpu_seconds == pytest.approx(52.2)
    assert (pod.idle_seconds, pod.vram_peak_bytes) == (0.0, 60129542144)
    assert pod.share_mean == pytest.approx(0.87)
    assert windows.store == {}


def test_a_sample_straddling_a_boundary_puts_half_in_each_window() -> None:
    windows = GpuWindows(MIN, LATE)
    feed(windows, [design_sample(T0 + 59_500, util_pct=2.0)])
    first, second = windows.close(T0 + 2 * MIN + LATE)
    assert (first.window_start, second.window_start) == (T0, T0 + MIN)
    for window in (first, second):
        assert window.idle_seconds == pytest.approx(0.5)
        assert window.allocated_idle_seconds == pytest.approx(0.5)
        assert window.pods[0].idle_seconds == pytest.approx(0.5)
        assert window.pods[0].vram_peak_bytes == 60129542144  # a peak is not cut


def test_data_for_a_closed_window_is_late_and_left_out() -> None:
    windows = GpuWindows(MIN, LATE)
    assert feed(windows, [design_sample(T0)]) == [False]
    assert len(windows.close(T0 + MIN + LATE)) == 1
    # The first half lands in the closed window (late, dropped), the second in an open one.
    assert feed(windows, [design_sample(T0 + 59_500), design_sample(T0 + 30_000)]) == [True, True]
    assert list(windows.store) == [(GPU_0, T0 + MIN)]
    (window,) = windows.close(T0 + 2 * MIN + LATE)
    assert window.busy_seconds == pytest.approx(0.5)


@pytest.mark.parametrize(("sm_pct", "share_mean"), [(None, None), (85.0, 0.85)])
def test_unknown_utilization_leaves_ratios_null(
    sm_pct: float | None, share_mean: float | None
) -> None:
    # A MIG instance: no device reading. Its pod's share is unknown unless NVML gave the
    # process's SM %, and the device-level ratios stay null either way.
    process = {**example("gpuwatch.nvml.sample/v1")["gpus"][0]["processes"][0], "sm_pct": sm_pct}
    windows = GpuWindows(MIN, LATE)
    reading: dict[str, Any] = {"util_pct": None, "sharing": "mig", "processes": [process]}
    feed(windows, [design_sample(T0, mig_profile="7g.80gb", **reading)])
    (window,) = windows.close(T0 + MIN + LATE)
    assert (window.util_mean_pct, window.attributed_ratio, window.unattributed_ratio) == (
        None,
        None,
        None,
    )
    assert (window.busy_seconds, window.idle_seconds, window.allocated_seconds) == (0, 0, 1.0)
    assert window.pods[0].share_mean == share_mean


def test_time_sliced_gpu_idle_pod_and_unattributed_use_and_a_nameless_leak() -> None:
    raw = example("gpuwatch.nvml.sample/v1")
    raw["ts"] = T0
    g = raw["gpus"][0]
    g["sharing"], g["util_pct"] = "time-slicing", 80.0
    base = g["processes"][0]
    g["processes"] = [
        {**base, "sm_pct": 50.0, "pod_uid": "pod-a"},
        {**base, "sm_pct": 20.0, "pod_uid": "pod-leak"},
    ]
    idle_holder = copy.deepcopy(raw["allocations"][0])
    idle_holder.update(pod_uid="pod-idle", pod="idle-0")
    raw["allocations"][0].update(pod_uid="pod-a", pod="a-0")
    raw["allocations"].append(idle_holder)
    windows = GpuWindows(MIN, LATE)
    feed(windows, [SAMPLES.decode(msgspec.json.encode(raw))])
    (window,) = windows.close(T0 + MIN + LATE)
    # 80 % explained: a 0.5, the leak 0.2 -> 0.7 of 0.8 = 0.875 attributed, 0.125 not.
    assert window.attributed_ratio == pytest.approx(0.875)
    assert window.unattributed_ratio == pytest.approx(0.125)
    assert window.allocated_idle_seconds == 0.0  # the device is busy
    pods: dict[str, PodWindowShare] = {p.uid: p for p in window.pods}
    assert [p.uid for p in window.pods] == sorted(pods)
    assert (pods["pod-idle"].pod, pods["pod-idle"].idle_seconds) == ("idle-0", 0.5)
    assert pods["pod-a"].allocated_seconds == 0.5
    leak = pods["pod-leak"]
    assert (leak.namespace, leak.pod, leak.allocated_seconds) == ("", "", 0.0)
    assert leak.used_gpu_seconds == pytest.approx(0.2)


def test_buckets_are_plain_data_and_survive_a_restart() -> None:
    samples = [design_sample(T0 + i * 1000, util_pct=float(i)) for i in range(30)]
    live = GpuWindows(MIN, LATE)
    feed(live, samples[:20])
    saved = {key: msgspec.json.encode(acc) for key, acc in live.store.items()}
    restored = GpuWindows(
        MIN, LATE, {k: msgspec.json.decode(v, type=GpuWindowAcc) for k, v in saved.items()}
    )
    for windows in (live, restored):
        feed(windows, samples[20:])
    assert restored.close(T0 + 2 * MIN) == live.close(T0 + 2 * MIN)


# --- properties -------------------------------------------------------------------------

READING = st.fixed_dictionaries(
    {
        "util_pct": st.none() | st.floats(0, 100),
        "sharing": st.sampled_from(["exclusive", "time-slicing"]),
        "interval_ms": st.integers(1, 5000),
    }
)


def run(readings: list[dict[str, Any]], window_ms: int) -> list[GpuWindow]:
    ts, samples = T0 + 7_000, []
    for r in readings:
        interval = r["interval_ms"]
        samples.append(design_sample(ts, interval, util_pct=r["util_pct"], sharing=r["sharing"]))
        ts += interval
    windows = GpuWindows(window_ms, LATE)
    feed(windows, samples)
    return windows.close(ts + window_ms + LATE)


TOTALS = ("busy_seconds", "idle_seconds", "allocated_seconds", "unallocated_seconds")


@settings(max_examples=50, deadline=None)
@given(st.lists(READING, min_size=1, max_size=40))
def test_smaller_windows_do_not_change_totals(readings: list[dict[str, Any]]) -> None:
    minutes, tens = run(readings, MIN), run(readings, 10_000)
    for name in TOTALS:
        assert sum(getattr(w, name) for w in tens) == pytest.approx(
            sum(getattr(w, name) for w in minutes)
        )
    used = [sum(p.used_gpu_seconds for w in ws for p in w.pods) for ws in (minutes, tens)]
    assert used[0] == pytest.approx(used[1])
    seconds = sum(r["interval_ms"] for r in readings) / 1000
    for w in minutes:
        assert w.allocated_seconds + w.unallocated_seconds <= MIN / 1000 + 1e-9
        assert sum(p.allocated_seconds for p in w.pods) == pytest.approx(w.allocated_seconds)
    assert sum(w.allocated_seconds for w in minutes) == pytest.approx(seconds)


@settings(max_examples=25, deadline=None)
@given(st.lists(READING, min_size=1, max_size=20))
def test_same_input_twice_gives_identical_windows(readings: list[dict[str, Any]]) -> None:
    first, second = run(readings, MIN), run(readings, MIN)
    assert [WINDOWS.encode(w) for w in first] == [WINDOWS.encode(w) for w in second]
