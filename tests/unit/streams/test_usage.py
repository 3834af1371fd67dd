"""Node-side pod usage: per-pod messages per flush period, idle_since across them, no drift."""

from __future__ import annotations

import copy
from itertools import pairwise
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.harness.examples import GPU_0, POD_UID, example
from schemas.codec import Codec
from schemas.ids import GpuUuid
from schemas.nvml_sample import NvmlSample
from schemas.pod_usage import PodUsage
from schemas.prices import BUILTIN_PRICES
from schemas.settings import WindowSettings
from streams.core.integrals import PriceBook, integrate_sample
from streams.core.node.usage import GpuUsageAcc, PodTrack, UsageAggregator
from streams.core.pod.pod_attribution import add_usage
from streams.core.windows import split_interval

MIN = 60_000
T0 = 1_764_412_320_000  # a window start
IDLE_PCT = 5.0
SAMPLES = Codec(NvmlSample)
USAGE = Codec(PodUsage)
PRICES = PriceBook(BUILTIN_PRICES)


def design_sample(ts: int, interval_ms: int = 1000, util: float | None = 87.0) -> NvmlSample:
    """The docs/DESIGN.md §3.1 sample (one pod alone on an H100) at another time and reading."""
    raw = example("gpuwatch.nvml.sample/v1")
    raw["ts"], raw["interval_ms"] = ts, interval_ms
    raw["gpus"][0]["util_pct"] = util
    return SAMPLES.decode(msgspec.json.encode(raw))


def two_gpu_sample(ts: int, utils: tuple[float, float]) -> NvmlSample:
    """The pod holds two GPUs, at the two readings."""
    raw = example("gpuwatch.nvml.sample/v1")
    raw["ts"] = ts
    second = copy.deepcopy(raw["gpus"][0])
    second.update(uuid="GPU-second", index=1)
    raw["gpus"].append(second)
    for gpu, util in zip(raw["gpus"], utils, strict=True):
        gpu["util_pct"] = util
    raw["allocations"][0]["device_ids"].append("GPU-second")
    return SAMPLES.decode(msgspec.json.encode(raw))


def feed(agg: UsageAggregator, samples: list[NvmlSample]) -> list[PodUsage]:
    out: list[PodUsage] = []
    for sample in samples:
        out += agg.add(integrate_sample(sample, IDLE_PCT, PRICES))
    return out


def test_one_message_per_pod_per_flush_period() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    out = feed(agg, [design_sample(T0 + i * 1000) for i in range(25)])
    assert [(m.ts - T0, m.end_ts - T0, m.samples) for m in out] == [
        (0, 10_000, 10),
        (10_000, 20_000, 10),
    ]
    assert agg.flush(T0 + 29_999) == []  # the 20..30 s period is not over
    (last,) = agg.flush(T0 + 30_000)
    assert (last.ts - T0, last.end_ts - T0, last.samples) == (20_000, 25_000, 5)
    first = out[0]
    assert USAGE.decode(USAGE.encode(first)) == first  # valid against the contract
    (gpu,) = first.gpus
    # 10 s alone on an H100 at 87 %: 8.7 used s, $4/h x 10 s = $0.0111, 512.3 W x 10 s x
    # 0.87 = 4457.01 J, 60129542144 B x 10 s of VRAM; busy, so no idle seconds nor waste.
    assert (first.uid, first.node, first.idle_since) == (POD_UID, "gpu-node-17", None)
    assert (gpu.uuid, gpu.model, gpu.sharing, gpu.method) == (
        GPU_0,
        "NVIDIA H100 80GB HBM3",
        "exclusive",
        "exclusive",
    )
    assert gpu.allocated_seconds == pytest.approx(10.0)
    assert gpu.used_gpu_seconds == pytest.approx(8.7)
    assert gpu.cost_usd == pytest.approx(4.0 / 360)
    assert gpu.energy_joules == pytest.approx(4457.01)
    assert gpu.vram_byte_seconds == pytest.approx(60129542144 * 10)
    assert (gpu.idle_seconds, gpu.waste_usd, gpu.vram_peak_bytes) == (0.0, 0.0, 60129542144)
    assert gpu.share_mean == pytest.approx(0.87)


def test_idle_since_is_carried_across_messages_and_the_run_end_is_cut() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    utils = [50.0] * 3 + [1.0] * 22 + [60.0] * 5  # idle from 3 s to 25 s
    out = feed(agg, [design_sample(T0 + i * 1000, util=u) for i, u in enumerate(utils)])
    assert [(m.ts - T0, m.end_ts - T0, m.idle_since) for m in out] == [
        (0, 10_000, T0 + 3_000),
        (10_000, 20_000, T0 + 3_000),
        (20_000, 25_000, T0 + 3_000),  # cut where the run ends: its last idle instant
        (25_000, 30_000, None),
    ]
    # Idle while allocated: 7 + 10 + 5 idle seconds, each wasting $4/h.
    assert [m.gpus[0].idle_seconds for m in out] == pytest.approx([7.0, 10.0, 5.0, 0.0])
    assert out[1].gpus[0].waste_usd == pytest.approx(out[1].gpus[0].cost_usd)


def test_idle_on_every_allocated_gpu_or_not_idle() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    out = feed(agg, [two_gpu_sample(T0 + i * 1000, (1.0, 90.0)) for i in range(10)])
    assert out[0].idle_since is None  # idle on one of its two GPUs only
    assert [g.idle_seconds for g in out[0].gpus] == [10.0, 0.0]
    out = feed(agg, [two_gpu_sample(T0 + 10_000 + i * 1000, (1.0, 2.0)) for i in range(10)])
    assert out[0].idle_since == T0 + 10_000


def unknown_sample(ts: int) -> NvmlSample:
    """The design sample with neither a device reading nor the process's SM %."""
    raw = example("gpuwatch.nvml.sample/v1")
    raw["ts"] = ts
    raw["gpus"][0]["util_pct"] = None
    raw["gpus"][0]["processes"][0]["sm_pct"] = None
    return SAMPLES.decode(msgspec.json.encode(raw))


def test_unknown_utilization_is_not_idle() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    samples = [design_sample(T0 + i * 1000, util=1.0) for i in range(5)]
    out = feed(agg, [*samples, unknown_sample(T0 + 5_000)]) + agg.flush(T0 + 10_000)
    assert [(m.ts - T0, m.end_ts - T0, m.idle_since) for m in out] == [
        (0, 5_000, T0),  # idle until the reading went missing
        (5_000, 6_000, None),
    ]
    unknown = out[1].gpus[0]
    assert (unknown.method, unknown.share_mean, unknown.idle_seconds) == ("unknown", None, 0.0)
    assert unknown.allocated_seconds == 1.0
    assert unknown.cost_usd == pytest.approx(4.0 / 3600)  # still paid for, but not waste
    assert unknown.waste_usd == 0.0


def test_method_is_the_least_precise_and_share_mean_over_known_seconds() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    feed(agg, [unknown_sample(T0), design_sample(T0 + 1_000), design_sample(T0 + 2_000)])
    (message,) = agg.flush(T0 + 10_000)
    assert message.gpus[0].method == "unknown"
    assert message.gpus[0].share_mean == pytest.approx(0.87)  # over the 2 known seconds
    assert message.samples == 3


def test_a_sample_straddling_a_window_boundary_is_cut_there() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    start = T0 + 500  # ticks half a second off the grid: every 60th sample straddles
    out = feed(agg, [design_sample(start + i * 1000) for i in range(70)])
    out += agg.flush(T0 + 2 * MIN)
    assert all(a.end_ts == b.ts for a, b in pairwise(out))  # contiguous
    # Flush boundaries (every 10 s) that fall mid-sample are not cut; the window end is.
    assert [(m.ts - T0, m.end_ts - T0) for m in out] == [
        (500, 10_500),
        (10_500, 20_500),
        (20_500, 30_500),
        (30_500, 40_500),
        (40_500, 50_500),
        (50_500, 60_000),
        (60_000, 70_500),
    ]
    for m in out:
        assert (m.ts - T0) // MIN == (m.end_ts - 1 - T0) // MIN  # inside one window
    assert sum(m.gpus[0].allocated_seconds for m in out) == pytest.approx(70.0)
    assert sum(m.samples for m in out) == 71  # the straddling sample counts in both


def test_a_long_sample_across_a_window_end_is_one_message_the_pod_side_cuts_to_the_bit() -> None:
    # History sampled every 57 s: nearly every sample crosses a minute. Cut on this side,
    # each would be two messages; whole, it is one, and the pod side's windows get the
    # bits the cut gave (each piece: the interval's integral x its fraction, added once).
    agg = UsageAggregator(MIN, flush_ms=10_000)
    samples = [design_sample(T0 + 30_000 + i * 57_000, 57_000, util=10.0 + i) for i in range(5)]
    out = feed(agg, samples)
    assert [(m.ts, m.end_ts, m.samples) for m in out] == [
        (s.ts, s.ts + s.interval_ms, 1) for s in samples
    ]
    state = None
    for message in out:
        state, outcome = add_usage(state, message, WindowSettings(window_s=60))
        assert outcome == "added"
    assert state is not None
    by_window: dict[int, list[float]] = {}
    for sample in samples:
        pod = integrate_sample(sample, IDLE_PCT, PRICES).gpus[0][1].pods[0]
        for part in split_interval(sample.ts, sample.interval_ms, MIN):
            sums = by_window.setdefault(part.window_start, [0.0, 0.0, 0.0])
            for i, name in enumerate(("used_gpu_seconds", "cost_usd", "vram_byte_seconds")):
                sums[i] += getattr(pod, name) * part.fraction
    got = {
        w.start: [w.gpus[0].used_gpu_seconds, w.gpus[0].cost_usd, w.gpus[0].vram_byte_seconds]
        for w in state.windows
    }
    assert got == by_window  # equal, not approximately


def test_a_long_sample_with_units_of_work_is_still_cut_at_the_window_end() -> None:
    # The units go whole to the window of the sample's start; the pod side would spread them.
    raw = example("gpuwatch.nvml.sample/v1")
    raw["ts"], raw["interval_ms"] = T0 + 30_000, 57_000
    raw["work"] = [{"pod_uid": POD_UID, "units": {"steps": 12.0}}]
    sample = SAMPLES.decode(msgspec.json.encode(raw))
    agg = UsageAggregator(MIN, flush_ms=10_000)
    out = agg.add(integrate_sample(sample, IDLE_PCT, PRICES), work=sample.work)
    assert [(m.ts - T0, m.end_ts - T0, m.units) for m in out] == [
        (30_000, 60_000, {"steps": 12.0}),
        (60_000, 87_000, {}),
    ]


def test_a_gap_ends_the_message_and_the_idle_run() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    out = feed(agg, [design_sample(T0 + i * 1000, util=0.0) for i in (0, 1, 2, 5, 6)])
    assert [(m.ts - T0, m.end_ts - T0, m.idle_since) for m in out] == [(0, 3_000, T0)]
    (rest,) = agg.flush(T0 + 10_000)
    assert (rest.ts, rest.end_ts, rest.idle_since) == (T0 + 5_000, T0 + 7_000, T0 + 5_000)


def test_a_redelivered_sample_is_dropped_not_counted_twice() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    samples = [design_sample(T0 + i * 1000) for i in range(4)]
    feed(agg, samples + samples[2:3])
    assert agg.overlapping == 1
    (message,) = agg.flush(T0 + 10_000)
    assert message.samples == 4
    assert message.gpus[0].allocated_seconds == pytest.approx(4.0)


def test_silent_pods_are_flushed_then_forgotten() -> None:
    agg = UsageAggregator(MIN, flush_ms=10_000)
    feed(agg, [design_sample(T0, util=0.0)])
    assert len(agg.flush(T0 + 10_000)) == 1
    assert list(agg.store) == [POD_UID]  # still carried: its next sample may come
    assert agg.flush(T0 + 60_999) == []
    assert list(agg.store) == [POD_UID]
    # Silent a whole window since its last sample ended; looked for once per flush period.
    agg.flush(T0 + 71_000)
    assert list(agg.store) == []
    (back,) = feed(agg, [design_sample(T0 + 80_000 + i * 1000, util=0.0) for i in range(10)])
    assert back.idle_since == T0 + 80_000  # a new run: nothing carried over the silence


def test_tracks_are_plain_data_and_survive_a_restart() -> None:
    samples = [design_sample(T0 + i * 1000, util=float(i % 7)) for i in range(30)]
    live = UsageAggregator(MIN, flush_ms=10_000)
    feed(live, samples[:14])
    saved = {uid: msgspec.json.encode(track) for uid, track in live.store.items()}
    store = {uid: msgspec.json.decode(raw, type=PodTrack) for uid, raw in saved.items()}
    restored = UsageAggregator(MIN, flush_ms=10_000, store=store)
    assert feed(restored, samples[14:]) == feed(live, samples[14:])
    assert restored.flush(T0 + MIN) == live.flush(T0 + MIN)


# --- properties -------------------------------------------------------------------------

STEP = st.fixed_dictionaries(
    {
        "util": st.none() | st.sampled_from([0.0, 3.0, 50.0, 100.0]),
        "interval_ms": st.integers(100, 4_000) | st.sampled_from([57_000, 90_000]),
        "gap_ms": st.sampled_from([0, 0, 0, 0, 1_500]),
    }
)


def samples_of(steps: list[dict[str, Any]]) -> list[NvmlSample]:
    ts, out = T0 + 12_345, []
    for step in steps:
        ts += step["gap_ms"]
        out.append(design_sample(ts, step["interval_ms"], step["util"]))
        ts += step["interval_ms"]
    return out


def reference_idle_since(samples: list[NvmlSample]) -> int | None:
    since, end = None, None
    for s in samples:
        if end is not None and s.ts != end:
            since = None
        util = s.gpus[0].util_pct
        since = (since if since is not None else s.ts) if util is not None and util < 5 else None
        end = s.ts + s.interval_ms
    return since


@settings(max_examples=60, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60), st.sampled_from([1_000, 10_000, 60_000]))
def test_messages_keep_every_integral_and_the_idle_run(
    steps: list[dict[str, Any]], flush_ms: int
) -> None:
    samples = samples_of(steps)
    end = samples[-1].ts + samples[-1].interval_ms
    agg = UsageAggregator(MIN, flush_ms=flush_ms)
    out = feed(agg, samples) + agg.flush(end + 2 * MIN)
    integrals = [integrate_sample(s, IDLE_PCT, PRICES).gpus[0][1].pods[0] for s in samples]
    for name in ("allocated_seconds", "used_gpu_seconds", "idle_seconds", "cost_usd"):
        want = sum(getattr(p, name) for p in integrals)
        assert sum(getattr(m.gpus[0], name) for m in out) == pytest.approx(want)
    covered = sum(m.end_ts - m.ts for m in out)
    assert covered == sum(s.interval_ms for s in samples)
    for a, b in pairwise(out):
        assert a.end_ts <= b.ts  # no overlap, in order
    for m in out:
        if (m.ts - T0) // MIN != (m.end_ts - 1 - T0) // MIN:  # across a window end:
            assert m.samples == 1  # one whole sample (the pod side cuts it)
            assert any((s.ts, s.ts + s.interval_ms) == (m.ts, m.end_ts) for s in samples)
        assert m.gpus[0].waste_usd <= m.gpus[0].cost_usd
    last = [m for m in out if m.end_ts == out[-1].end_ts][-1]
    assert last.idle_since == reference_idle_since(samples)
    again = UsageAggregator(MIN, flush_ms=flush_ms)
    assert feed(again, samples) + again.flush(end + 2 * MIN) == out


FLOATS = st.floats(0, 1e12) | st.just(-0.0)


@given(st.lists(st.tuples(FLOATS, FLOATS, st.integers(0, 1 << 40)), min_size=1, max_size=5))
def test_a_whole_interval_adds_as_a_fraction_of_one_does_to_the_bit(
    parts: list[tuple[float, float, int]],
) -> None:
    # The usage is sent byte for byte: the shortcut for a whole interval must sum the same.
    pod = integrate_sample(design_sample(T0), IDLE_PCT, PRICES).gpus[0][1].pods[0]
    whole, scaled = (
        GpuUsageAcc(uuid=GpuUuid(GPU_0), model="m", sharing="exclusive", method="exclusive")
        for _ in range(2)
    )
    for a, b, peak in parts:
        p = msgspec.structs.replace(
            pod, used_gpu_seconds=a, energy_joules=b, vram_peak_bytes=peak, method="process"
        )
        whole.add_whole(p)
        scaled.add(p, 1.0)
    assert msgspec.json.encode(whole) == msgspec.json.encode(scaled)
    assert whole.method == "process"
    assert whole.vram_peak_bytes == max(peak for _, _, peak in parts)
