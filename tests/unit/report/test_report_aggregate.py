"""The report's sums: groups add up to the records, the total to the fleet's priced GPU time,
cost per unit by its rule, steps, groups, duplicates."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_records import (
    A100,
    DAY,
    H100,
    HOUR,
    MIN,
    PRICES,
    SPOT,
    T0,
    Fleet,
    attribution,
    fleet,
    gpu,
    gpu_window,
    k8s_node,
)

from gpuwatch.report.aggregate import Aggregator, step_start
from gpuwatch.report.rows import (
    GROUP_BYS,
    NONE,
    OTHER,
    UNALLOCATED,
    GroupBy,
    Report,
    Row,
    StepName,
)
from gpuwatch.timerange import TimeRange

STEP_CHOICES: tuple[StepName | None, ...] = (None, "1h", "1d", "7d")
DAY_PERIOD = TimeRange(T0, T0 + DAY)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def aggregate(data: Fleet, by: GroupBy, step: StepName | None, top: int | None = None) -> Report:
    agg = Aggregator(data.period, by=by, step=step, prices=PRICES)
    for node in data.nodes:
        agg.add_node(node)
    for rec in data.attribution:
        agg.add_attribution(rec)
    for win in data.windows:
        agg.add_gpu_window(win)
    return agg.report(top=top)


def rows(report: Report, *kinds: str) -> list[Row]:
    return [row for row in report.rows if row.kind in kinds]


def one(report: Report, group: str) -> Row:
    (row,) = [r for r in report.rows if r.group == group and r.kind != "period_total"]
    return row


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    gpus=st.integers(1, 24),
    windows=st.integers(1, 30),
    days=st.integers(1, 16),
)
def test_groups_add_up_to_the_records_and_the_total_to_the_fleet(
    seed: int, gpus: int, windows: int, days: int
) -> None:
    data = fleet(random.Random(seed), gpus=gpus, windows=windows, days=days)
    cost = sum(r.cost_usd for r in data.attribution)
    waste = sum(r.waste_usd for r in data.attribution)
    hours = sum(r.allocated_gpu_seconds for r in data.attribution) / 3600
    used = sum(r.used_gpu_seconds for r in data.attribution) / 3600
    for by in GROUP_BYS:
        for step in STEP_CHOICES:
            report = aggregate(data, by, step)
            groups = rows(report, "group")
            assert close(sum(r.cost_usd for r in groups), cost), (by, step)
            assert close(sum(r.waste_usd for r in groups), waste), (by, step)
            assert close(sum(r.allocated_gpu_hours for r in groups), hours), (by, step)
            assert close(sum(r.used_gpu_hours for r in groups), used), (by, step)
            for name, count in data.units.items():
                assert close(sum(r.work_units.get(name, 0.0) for r in groups), count)
            totals = rows(report, "total")
            assert close(sum(r.cost_usd for r in totals), data.fleet_usd), (by, step)
            unallocated = sum(r.cost_usd for r in rows(report, "unallocated"))
            assert close(cost + unallocated, data.fleet_usd), (by, step)
            for total in totals:
                step_rows = [r for r in report.rows if r.step_start == total.step_start]
                parts = [r for r in step_rows if r.kind in ("group", "unallocated")]
                assert close(sum(r.cost_usd for r in parts), total.cost_usd)
                assert data.period.start_ms <= total.step_start < total.step_end
                assert total.step_end <= data.period.end_ms
            if len(totals) > 1:
                (period,) = rows(report, "period_total")
                assert close(period.cost_usd, data.fleet_usd)
            top = aggregate(data, by, step, top=2)
            kept = rows(top, "group", "other")
            assert close(sum(r.cost_usd for r in kept), cost), (by, step)
            assert close(sum(r.waste_usd for r in kept), waste), (by, step)
            assert close(sum(r.cost_usd for r in rows(top, "total")), data.fleet_usd)
            for total in rows(top, "total"):
                shown = [r for r in top.rows if r.step_start == total.step_start]
                assert sum(r.kind == "group" for r in shown) <= 2


def test_cost_per_step_of_a_training_pod_at_ten_steps_a_second_on_a_4_usd_gpu() -> None:
    # 600 steps per 60 s window, 4/60 USD per window: 4/36000 USD a step.
    agg = Aggregator(DAY_PERIOD)
    for k in range(30):
        agg.add_attribution(attribution(start=T0 + k * MIN, units={"steps": 600.0}))
    (row,) = rows(agg.report(), "group")
    assert abs(row.cost_usd - 30 * 4 / 60) < 1e-9
    assert row.cost_per_unit["steps"] == pytest.approx(4 / 36000, abs=1e-9)
    assert abs(row.cost_per_unit["steps"] - 4 / 36000) < 1e-12


def test_cost_per_1k_tokens_of_a_serving_pod() -> None:
    # 1,500 tokens/s on a 4 USD/h H100 beside a 3 USD/h A100: 7 USD/h for 5.4 M tokens/h.
    agg = Aggregator(DAY_PERIOD)
    for k in range(60):
        gpus = [gpu("GPU-a"), gpu("GPU-b", model=A100, usd_per_hour=3.0)]
        agg.add_attribution(attribution(start=T0 + k * MIN, gpus=gpus, units={"tokens": 9e4}))
    (row,) = rows(agg.report(), "group")
    assert row.cost_usd == pytest.approx(7.0, abs=1e-9)
    assert 1000 * row.cost_per_unit["tokens"] == pytest.approx(7 / 5400, abs=1e-12)


def test_cost_per_unit_counts_the_windows_that_report_the_unit_and_only_them() -> None:
    agg = Aggregator(DAY_PERIOD)
    agg.add_attribution(attribution(start=T0, units={"steps": 600.0}))
    agg.add_attribution(attribution(start=T0 + MIN, units={"steps": 0.0}))  # stalled: counts
    agg.add_attribution(attribution(start=T0 + 2 * MIN))  # reports no units: left out
    (row,) = rows(agg.report(), "group")
    assert row.cost_usd == pytest.approx(3 * 4 / 60)
    assert row.work_units == {"steps": 600.0}
    assert row.cost_per_unit["steps"] == pytest.approx(2 * 4 / 60 / 600, abs=1e-12)


def test_a_unit_never_done_has_no_cost_per_unit() -> None:
    agg = Aggregator(DAY_PERIOD)
    agg.add_attribution(attribution(units={"steps": 0.0}))
    (row,) = rows(agg.report(), "group")
    assert row.cost_per_unit == {"steps": None}


def test_unallocated_time_is_priced_by_the_gpus_own_price_in_the_records() -> None:
    # The worker priced GPU-a at 1.5 USD/h (a spot label the report never saw): so is its
    # unallocated half-minute; GPU-b, never held, on a node described as spot; GPU-c on a
    # node never described: the table's 4 USD/h.
    agg = Aggregator(DAY_PERIOD, prices=PRICES)
    agg.add_node(k8s_node("node-b", SPOT))
    agg.add_attribution(attribution(gpus=[gpu("GPU-a", usd_per_hour=1.5, allocated=30.0)]))
    agg.add_gpu_window(gpu_window("GPU-a", allocated=30.0))
    agg.add_gpu_window(gpu_window("GPU-b", allocated=0.0, node="node-b"))
    agg.add_gpu_window(gpu_window("GPU-c", allocated=0.0, node="node-c"))
    report = agg.report()
    unallocated = one(report, UNALLOCATED)
    assert unallocated.unallocated_gpu_hours == pytest.approx(150 / 3600)
    assert unallocated.cost_usd == pytest.approx((30 * 1.5 + 60 * 1.5 + 60 * 4.0) / 3600)
    assert agg.fleet_cost() == pytest.approx((60 * 1.5 + 60 * 1.5 + 60 * 4.0) / 3600)


def test_a_gpu_no_pod_held_takes_the_price_of_its_node_and_model() -> None:
    agg = Aggregator(DAY_PERIOD, prices=PRICES)
    agg.add_attribution(attribution(gpus=[gpu("GPU-a", usd_per_hour=1.5)]))
    agg.add_gpu_window(gpu_window("GPU-b", allocated=0.0))  # node-a, H100, like GPU-a
    agg.add_gpu_window(gpu_window("GPU-c", allocated=0.0, model=A100))  # the table's A100
    assert one(agg.report(), UNALLOCATED).cost_usd == pytest.approx((60 * 1.5 + 60 * 3) / 3600)


def test_mig_instances_no_pod_held_share_what_the_held_ones_leave_of_their_gpu() -> None:
    # An H100 (4 USD/h) in 3 instances: one held at 4/7 of it, two never held: 3/14 each.
    agg = Aggregator(DAY_PERIOD)
    held = gpu("MIG-1", usd_per_hour=4 * 4 / 7, sharing="mig")
    agg.add_attribution(attribution(gpus=[held]))
    agg.add_gpu_window(gpu_window("MIG-1", parent="GPU-p"))
    agg.add_gpu_window(gpu_window("MIG-2", allocated=0.0, parent="GPU-p"))
    agg.add_gpu_window(gpu_window("MIG-3", allocated=0.0, parent="GPU-p"))
    report = agg.report()
    assert one(report, UNALLOCATED).cost_usd == pytest.approx(2 * 60 * 4 * 3 / 14 / 3600)
    assert one(report, "total").cost_usd == pytest.approx(60 * 4 / 3600)


def test_a_record_delivered_twice_counts_once() -> None:
    agg = Aggregator(DAY_PERIOD)
    rec = attribution()
    agg.add_attribution(rec, ("attribution", 0))
    agg.add_attribution(rec, ("attribution", 0))
    agg.add_gpu_window(gpu_window(), ("gpu.windows", 1))
    agg.add_gpu_window(gpu_window(), ("gpu.windows", 1))
    report = agg.report()
    assert one(report, "vision").cost_usd == pytest.approx(4 / 60)
    assert (report.counts.pod_windows, report.counts.duplicates) == (1, 2)
    assert report.notes == ["records delivered more than once, counted once: 2"]


def test_total_lines_hold_the_pods_allocated_time_against_that_of_gpu_windows() -> None:
    # Hour 1: a pod's window and its GPU's agree. Hour 2: the GPU's window is written, the
    # pod's not yet (it closes with the slowest node's data): a gap of -100 % there.
    agg = Aggregator(TimeRange(T0, T0 + 2 * HOUR), step="1h")
    agg.add_attribution(attribution(start=T0))
    agg.add_gpu_window(gpu_window(start=T0))
    agg.add_gpu_window(gpu_window(start=T0 + HOUR))
    report = agg.report()
    first, second, period = rows(report, "total", "period_total")
    assert first.gpu_windows_allocated_gpu_hours == pytest.approx(60 / 3600)
    assert first.gpu_windows_allocated_cost_usd == pytest.approx(4 / 60)
    assert first.allocated_cost_gap == pytest.approx(0.0, abs=1e-12)
    assert (second.allocated_gpu_hours, second.allocated_cost_gap) == (0.0, pytest.approx(-1.0))
    assert period.gpu_windows_allocated_gpu_hours == pytest.approx(120 / 3600)
    assert period.allocated_cost_gap == pytest.approx(-0.5)
    assert all(r.allocated_cost_gap is None for r in rows(report, "group", "unallocated"))
    assert report.notes[-1].startswith("the pods' cost (0.07 USD) differs by -50.0 %")
    # Without gpu.windows there is nothing to hold the pods' time against.
    alone = Aggregator(DAY_PERIOD)
    alone.add_attribution(attribution())
    (total,) = alone.report().totals
    assert (total.gpu_windows_allocated_gpu_hours, total.allocated_cost_gap) == (None, None)


def test_a_window_counts_by_its_start_and_steps_are_cut_at_the_period() -> None:
    period = TimeRange(T0 + 30 * MIN, T0 + 2 * HOUR + 30 * MIN)
    agg = Aggregator(period, step="1h")
    for start in (T0 + 29 * MIN, T0 + 30 * MIN, T0 + 90 * MIN, T0 + 150 * MIN):
        agg.add_attribution(attribution(start=start))
    report = agg.report()
    totals = rows(report, "total")
    assert [(t.step_start, t.step_end) for t in totals] == [
        (T0 + 30 * MIN, T0 + HOUR),
        (T0 + HOUR, T0 + 2 * HOUR),
    ]
    assert (report.counts.pod_windows, report.counts.outside) == (2, 2)


@pytest.mark.parametrize(
    ("step", "ts", "start"),
    [
        ("1h", T0 + 3 * DAY + 61 * MIN, T0 + 3 * DAY + HOUR),
        ("1d", T0 + 3 * DAY + 61 * MIN, T0 + 3 * DAY),
        ("7d", T0 + 3 * DAY + 61 * MIN, T0),  # T0 is a Monday
        ("7d", T0 - MIN, T0 - 7 * DAY),
        (None, T0 + 3 * DAY, T0 - 5),
    ],
)
def test_steps_are_utc_hours_days_and_weeks_from_monday(
    step: StepName | None, ts: int, start: int
) -> None:
    assert step_start(ts, step, TimeRange(T0 - 5, T0 + 30 * DAY)) == start


def test_groups_name_what_the_records_name() -> None:
    recs = [
        attribution("p1", labels={}, owner={"kind": "Job", "name": "train"}),
        attribution("p2", pod="solo-0", owner=None, node=None),
        attribution("p3", namespace="ml", owner={"kind": "Job", "name": "train"}, cluster="eu"),
    ]
    expected: dict[GroupBy, set[str]] = {
        "team": {NONE, "vision"},
        "namespace": {"ml", "eu/ml"},
        "workload": {"ml/Job/train", "ml/solo-0", "eu/ml/Job/train"},
        "pod": {"ml/train-0", "ml/solo-0", "eu/ml/train-0"},
        "node": {"node-a", NONE, "eu/node-a"},
        "gpu": {"GPU-a", "eu/GPU-a"},
        "model": {H100},
        "cluster": {"default", "eu"},
    }
    for by, names in expected.items():
        agg = Aggregator(DAY_PERIOD, by=by)
        for rec in recs:
            agg.add_attribution(rec)
        assert {r.group for r in rows(agg.report(), "group")} == names, by


def test_by_gpu_splits_a_window_over_its_gpus() -> None:
    # GPU-a: 4 USD/h, idle 30 of 60 s; GPU-b: 3 USD/h, never idle. The waste is GPU-a's,
    # the units go in proportion to cost: each GPU's cost per unit is the window's.
    gpus = [gpu("GPU-a", idle=30.0), gpu("GPU-b", model=A100, usd_per_hour=3.0, idle=0.0)]
    rec = attribution(gpus=gpus, units={"steps": 700.0})
    agg = Aggregator(DAY_PERIOD, by="gpu")
    agg.add_attribution(rec)
    report = agg.report()
    a, b = one(report, "GPU-a"), one(report, "GPU-b")
    assert (a.waste_usd, b.waste_usd) == (pytest.approx(rec.waste_usd), 0.0)
    assert a.work_units["steps"] + b.work_units["steps"] == pytest.approx(700.0)
    assert a.work_units["steps"] == pytest.approx(400.0)
    per_step = rec.cost_usd / 700
    assert a.cost_per_unit["steps"] == pytest.approx(per_step)
    assert b.cost_per_unit["steps"] == pytest.approx(per_step)


def test_top_sums_the_rest_as_other() -> None:
    agg = Aggregator(DAY_PERIOD, by="pod")
    for i, usd in enumerate((1.0, 5.0, 3.0, 2.0)):
        agg.add_attribution(attribution(f"p{i}", pod=f"p{i}", gpus=[gpu(usd_per_hour=usd)]))
    report = agg.report(top=2)
    assert [r.group for r in report.rows] == ["ml/p1", "ml/p2", OTHER, UNALLOCATED, "total"]
    assert one(report, OTHER).cost_usd == pytest.approx(3.0 / 60)
    assert one(report, "total").cost_usd == pytest.approx(11.0 / 60)


def test_shares_of_a_row() -> None:
    agg = Aggregator(DAY_PERIOD)
    agg.add_attribution(attribution(gpus=[gpu(idle=15.0)]))
    agg.add_gpu_window(gpu_window(allocated=30.0))
    report = agg.report()
    group, total = one(report, "vision"), one(report, "total")
    assert group.idle_share == pytest.approx(0.25)
    assert group.waste_share == pytest.approx(0.25)
    assert total.waste_share == pytest.approx(group.waste_usd / (group.cost_usd + 30 * 4 / 3600))
    assert one(report, UNALLOCATED).idle_share is None


def test_an_empty_period_has_no_rows() -> None:
    agg = Aggregator(DAY_PERIOD, step="1d")
    agg.add_attribution(attribution(start=T0 + 2 * DAY))
    report = agg.report()
    assert report.empty
    assert report.rows == []
    assert report.counts.outside == 1


def test_unknown_group_or_step_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot group by 'owner'"):
        Aggregator(DAY_PERIOD, by="owner")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown step '2h'"):
        Aggregator(DAY_PERIOD, step="2h")  # type: ignore[arg-type]
