"""Revised windows in the report: the newest revision of each window counts, once, whatever
the order its copies come in, and the memory of what was counted stays within a horizon."""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Hashable, Iterator, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_records import (
    DAY,
    MIN,
    PRICES,
    T0,
    Fleet,
    attribution,
    fleet,
    gpu,
    gpu_window,
    revise,
    revise_window,
)
from test_report_cli import _Reader

from gpuwatch.replay.read import Hit, Plan
from gpuwatch.report import read
from gpuwatch.report.aggregate import DEDUP_HORIZON_MS, Aggregator
from gpuwatch.report.revisions import (
    MIN_HORIZON_MS,
    Copy,
    PartitionWindows,
    dedup_horizon_ms,
)
from gpuwatch.report.rows import GROUP_BYS, GroupBy, Report, StepName
from gpuwatch.timerange import TimeRange
from schemas import Attribution, GpuWindow
from schemas.settings import Settings, WindowSettings

DAY_PERIOD = TimeRange(T0, T0 + DAY)
HOUR_MS = 3_600_000
PODS = ("attribution", 0)
GPUS = ("gpu.windows", 0)
Record = Attribution | GpuWindow


def feed(
    records: Sequence[Record], by: GroupBy = "team", step: StepName | None = None
) -> Aggregator:
    """The records in this order, pod windows before GPU windows as the report reads them,
    each from its partition (by key, like the worker's producer)."""
    agg = Aggregator(DAY_PERIOD, by=by, step=step)
    for rec in records:
        if isinstance(rec, Attribution):
            agg.add_attribution(rec, ("attribution", zlib.crc32(rec.uid.encode()) % 3))
    for win in records:
        if isinstance(win, GpuWindow):
            agg.add_gpu_window(win, ("gpu.windows", zlib.crc32(win.uuid.encode()) % 3))
    return agg


def assert_same(got: Report, want: Report) -> None:
    """The same lines with the same figures (to rounding: taken back and added again; lines
    of equal cost may come in either order)."""
    lines = {(r.step_start, r.group, r.kind): r for r in got.rows}
    assert len(lines) == len(got.rows)
    assert sorted(lines) == sorted((r.step_start, r.group, r.kind) for r in want.rows)
    for b in want.rows:
        where = (b.step_start, b.group, b.kind)
        a = lines[where]
        for name in (
            "allocated_gpu_hours",
            "used_gpu_hours",
            "idle_gpu_hours",
            "unallocated_gpu_hours",
            "cost_usd",
            "waste_usd",
        ):
            assert math.isclose(getattr(a, name), getattr(b, name), abs_tol=1e-9), (where, name)
        assert a.work_units.keys() == b.work_units.keys(), where
        for unit, count in b.work_units.items():
            assert math.isclose(a.work_units[unit], count, abs_tol=1e-9), (where, unit)
            assert math.isclose(a.unit_cost_usd[unit], b.unit_cost_usd[unit], abs_tol=1e-9)
    assert (got.counts.pod_windows, got.counts.gpu_windows) == (
        want.counts.pod_windows,
        want.counts.gpu_windows,
    )


def first_and_revised() -> tuple[list[Record], list[Record]]:
    """A pod's window and its GPU's, then both revised: the pod went on 30 s longer on a
    second GPU, with units it did not report before, and the label of another team."""
    first: list[Record] = [
        attribution(gpus=[gpu(allocated=30.0, used=20.0, idle=5.0)]),
        gpu_window("GPU-a", allocated=30.0),
        gpu_window("GPU-b", allocated=0.0),
    ]
    gpus = [gpu(), gpu("GPU-b", allocated=30.0, used=0.0, idle=30.0)]
    revised: list[Record] = [
        attribution(gpus=gpus, units={"steps": 600.0}, labels={"team": "nlp"}, revision=1),
        gpu_window("GPU-a", allocated=60.0, revision=1),
        gpu_window("GPU-b", allocated=30.0, revision=1),
    ]
    return first, revised


@pytest.mark.parametrize("by", GROUP_BYS)
def test_revision_0_then_1_counts_revision_1_alone(by: GroupBy) -> None:
    first, revised = first_and_revised()
    agg = feed(first + revised, by)
    assert_same(agg.report(), feed(revised, by).report())
    assert (agg.counts.pod_windows, agg.counts.gpu_windows, agg.counts.revised) == (1, 2, 3)
    assert agg.counts.duplicates == agg.counts.superseded == 0
    assert agg.report().notes == [
        "windows revised after they closed: 3 newer revisions took the place of the one "
        "counted before; 0 older revisions read after a newer one, left out"
    ]


@pytest.mark.parametrize("by", GROUP_BYS)
def test_revision_1_then_0_leaves_revision_0_out(by: GroupBy) -> None:
    first, revised = first_and_revised()
    agg = feed(revised + first, by)
    assert_same(agg.report(), feed(revised, by).report())
    assert (agg.counts.superseded, agg.counts.revised, agg.counts.duplicates) == (3, 0, 0)


@pytest.mark.parametrize("by", GROUP_BYS)
def test_redeliveries_of_either_revision_count_once(by: GroupBy) -> None:
    first, revised = first_and_revised()
    agg = feed(first + first + revised + first + revised + revised, by)
    assert_same(agg.report(), feed(revised, by).report())
    counts = agg.counts
    assert (counts.duplicates, counts.revised, counts.superseded) == (3 + 6, 3, 3)


def test_the_group_a_window_left_when_revised_has_no_line() -> None:
    first, revised = first_and_revised()
    report = feed(first + revised).report()
    assert {r.group for r in report.rows if r.kind == "group"} == {"nlp"}
    (nlp,) = [r for r in report.rows if r.kind == "group"]
    total_cost = (60 * 4 + 30 * 4) / 3600
    assert nlp.cost_usd == pytest.approx(total_cost)
    assert nlp.cost_per_unit["steps"] == pytest.approx(total_cost / 600)


def test_units_no_revision_reports_any_more_have_no_cost_per_unit() -> None:
    with_units = attribution(units={"steps": 600.0})
    without = attribution(revision=1)
    report = feed([with_units, without]).report()
    (row,) = [r for r in report.rows if r.kind == "group"]
    assert row.work_units == {}
    assert row.cost_per_unit == {}
    assert row.cost_usd == pytest.approx(4 / 60)


def test_a_revised_gpu_window_changes_the_unallocated_time_and_its_cost() -> None:
    agg = feed(
        [
            attribution(gpus=[gpu(allocated=60.0)]),
            gpu_window("GPU-a", allocated=20.0),  # the pod's samples came late: revised
            gpu_window("GPU-a", allocated=60.0, revision=1),
        ]
    )
    report = agg.report()
    (unallocated,) = [r for r in report.rows if r.kind == "unallocated"]
    assert (unallocated.unallocated_gpu_hours, unallocated.cost_usd) == (0.0, 0.0)
    (total,) = report.totals
    assert total.cost_usd == pytest.approx(4 / 60)
    assert total.allocated_cost_gap == pytest.approx(0.0, abs=1e-12)
    assert report.notes[-1].startswith("windows revised after they closed: 1 newer")


def test_a_revised_mig_instance_no_pod_held_is_priced_once() -> None:
    # An H100 (4 USD/h) in 2 instances: one held at half of it; the other held by nobody,
    # 60 s then, revised, 60 s again: it costs the other half of the GPU's minute, once.
    agg = Aggregator(DAY_PERIOD)
    agg.add_attribution(attribution(gpus=[gpu("MIG-1", usd_per_hour=2.0, sharing="mig")]))
    agg.add_gpu_window(gpu_window("MIG-1", parent="GPU-p"), GPUS)
    agg.add_gpu_window(gpu_window("MIG-2", allocated=0.0, parent="GPU-p"), GPUS)
    agg.add_gpu_window(gpu_window("MIG-2", allocated=0.0, parent="GPU-p", revision=1), GPUS)
    agg.add_gpu_window(gpu_window("MIG-2", allocated=0.0, parent="GPU-p"), GPUS)
    report = agg.report()
    (unallocated,) = [r for r in report.rows if r.kind == "unallocated"]
    assert unallocated.cost_usd == pytest.approx(60 * 2 / 3600)
    assert unallocated.unallocated_gpu_hours == pytest.approx(60 / 3600)
    assert (agg.counts.gpu_windows, agg.counts.revised, agg.counts.superseded) == (2, 1, 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    gpus=st.integers(1, 12),
    windows=st.integers(1, 20),
    days=st.integers(1, 3),
    shape=st.tuples(st.sampled_from(GROUP_BYS), st.sampled_from((None, "1h", "1d"))),
)
def test_copies_in_any_order_within_the_horizon_count_as_the_newest_alone(
    seed: int, gpus: int, windows: int, days: int, shape: tuple[GroupBy, StepName | None]
) -> None:
    # Each window is sent 1 to 4 times at revisions 0 to 2, the newest not always last,
    # each copy up to 40 minutes (less than the horizon) after the window's first.
    by, step = shape
    rng = random.Random(seed)
    data = fleet(rng, gpus=gpus, windows=windows, days=days)
    newest: list[Record] = []
    copies: list[tuple[float, Record]] = []
    for rec in [*data.attribution, *data.windows]:
        later = rng.randint(0, 2)
        revisions = [rec] + [
            revise(rec, r, rng) if isinstance(rec, Attribution) else revise_window(rec, r, rng)
            for r in range(1, later + 1)
        ]
        newest.append(revisions[-1])
        sent = [rng.choice(revisions) for _ in range(rng.randint(0, 3))] + [revisions[-1]]
        copies += [(rec.window_start + rng.uniform(0, 40 * MIN), copy) for copy in sent]
    copies.sort(key=lambda pair: pair[0])
    arrived = [copy for _, copy in copies]
    got = _fed(data, arrived, by, step)
    want = _fed(data, sorted(newest, key=lambda r: r.window_start), by, step)
    assert_same(got, want)
    assert got.counts.late_revisions == 0


def _fed(data: Fleet, records: list[Record], by: GroupBy, step: StepName | None) -> Report:
    agg = Aggregator(data.period, by=by, step=step, prices=PRICES)
    for node in data.nodes:
        agg.add_node(node)
    for rec in records:
        if isinstance(rec, Attribution):
            agg.add_attribution(rec, _source("attribution", rec.uid))
    for win in records:
        if isinstance(win, GpuWindow):
            agg.add_gpu_window(win, _source("gpu.windows", win.uuid))
    return agg.report()


def _source(topic: str, key: str) -> Hashable:
    return (topic, zlib.crc32(key.encode()) % 3)


def test_a_revision_older_than_the_horizon_is_left_out_and_said() -> None:
    # The partition went on 2 hours past the window before its revision came: the copy
    # counted stays (counting the revision too would count the window twice).
    agg = Aggregator(DAY_PERIOD, dedup_horizon_ms=HOUR_MS)
    agg.add_attribution(attribution(start=T0, gpus=[gpu(allocated=30.0)]), PODS)
    agg.add_attribution(attribution("pod-2", start=T0 + 2 * HOUR_MS), PODS)
    agg.add_attribution(attribution(start=T0, revision=1), PODS)
    report = agg.report()
    (row,) = [r for r in report.rows if r.kind == "group"]
    assert row.cost_usd == pytest.approx((30 + 60) * 4 / 3600)
    assert (agg.counts.late_revisions, agg.counts.pod_windows) == (1, 2)
    assert "revisions of windows more than 60 min older than the newest of their partition, " \
        "left out: 1" in report.notes[0]  # fmt: skip


def test_revision_0_older_than_the_horizon_is_counted_unchecked() -> None:
    # It may be a first copy from a partition whose windows came out of order: counted, so
    # the same copy again that old is counted again (the bound on memory has this price).
    agg = Aggregator(DAY_PERIOD, dedup_horizon_ms=HOUR_MS)
    agg.add_attribution(attribution("pod-2", start=T0 + 2 * HOUR_MS), PODS)
    agg.add_attribution(attribution(start=T0), PODS)
    agg.add_attribution(attribution(start=T0), PODS)
    assert (agg.counts.pod_windows, agg.counts.duplicates) == (3, 0)


def test_windows_behind_the_horizon_are_forgotten() -> None:
    seen: PartitionWindows[tuple[int, str]] = PartitionWindows(HOUR_MS)
    for k in range(180):  # three hours of one pod's windows
        start = T0 + k * MIN
        assert seen.check(start, 1, 0) == (Copy.FIRST, None)
        seen.keep(start, 1, (0, "counted"))
    assert len(seen) == 61  # the newest and the hour behind it
    assert seen.check(T0 + 179 * MIN, 1, 1) == (Copy.NEWER, (0, "counted"))
    assert seen.check(T0 + 119 * MIN, 1, 0) == (Copy.AGAIN, None)
    assert seen.check(T0 + 119 * MIN, 1, 1) == (Copy.NEWER, (0, "counted"))
    assert seen.check(T0 + 119 * MIN, 2, 0) == (Copy.FIRST, None)  # another pod
    assert seen.check(T0 + 118 * MIN, 1, 0) == (Copy.UNCHECKED, None)
    assert seen.check(T0 + 118 * MIN, 1, 2) == (Copy.TOO_LATE, None)


def test_the_dedupe_horizon_covers_the_workers_revision_horizon() -> None:
    # The default settings: an hour of revisions, 60 s windows, 10 s lateness, 300 s skew.
    assert dedup_horizon_ms(WindowSettings()) == DEDUP_HORIZON_MS == (3600 + 430) * 1000
    longer = WindowSettings(revision_horizon_s=6 * 3600)
    assert dedup_horizon_ms(longer) == (6 * 3600 + 430) * 1000
    # Revisions off: redeliveries after a restart still want the hour.
    assert dedup_horizon_ms(WindowSettings(revision_horizon_s=0)) == MIN_HORIZON_MS


def test_the_horizon_is_widened_before_the_first_record_only() -> None:
    agg = Aggregator(DAY_PERIOD)
    agg.widen_dedup_horizon(HOUR_MS)  # never narrower than it is
    assert agg.dedup_horizon_ms == DEDUP_HORIZON_MS
    agg.widen_dedup_horizon(3 * HOUR_MS)
    assert agg.dedup_horizon_ms == 3 * HOUR_MS
    agg.add_attribution(attribution())
    with pytest.raises(RuntimeError, match="before the first record"):
        agg.widen_dedup_horizon(4 * HOUR_MS)


def test_the_reader_takes_the_horizon_and_the_margin_from_the_workers_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings.model_validate({"windows": {"revision_horizon_s": 7200}})
    margins: list[int] = []

    class Reader(_Reader):
        def read(
            self, plan: Plan, topics: Sequence[str], span: TimeRange, margin: int
        ) -> Iterator[Hit]:
            margins.append(margin)
            return super().read(plan, topics, span, margin)

    monkeypatch.setattr(read, "RangeReader", Reader({}, {}))
    agg = Aggregator(DAY_PERIOD)
    notes = read.read_period(settings, agg, margin_ms=300_000)
    assert agg.dedup_horizon_ms == (7200 + 430) * 1000
    assert margins == [300_000 + 7_200_000] * 2
    assert notes[0].startswith("records written up to 2h05m after --to were read")
