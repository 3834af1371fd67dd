"""The report printed: CSV and JSON that parse back to the figures, a table people read, a PNG."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from report_records import A100, DAY, HOUR, MIN, T0, attribution, gpu, gpu_window

from gpuwatch.report.aggregate import Aggregator
from gpuwatch.report.plot import plot, title
from gpuwatch.report.render import (
    CHECK_FIELDS,
    FIELDS,
    iso,
    to_csv,
    to_json,
    to_table,
    unit_cost_text,
)
from gpuwatch.report.rows import Report, StepName
from gpuwatch.timerange import TimeRange

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def two_days(step: StepName | None = "1d") -> Report:
    """vision trains (steps) both days, 30 % idle then 10 %; nlp serves (tokens) on day 2
    on an A100; each GPU is unallocated 15 s of each minute recorded."""
    agg = Aggregator(TimeRange(T0, T0 + 2 * DAY), step=step)
    for day, idle in ((0, 18.0), (1, 6.0)):
        for k in range(60):
            start = T0 + day * DAY + k * MIN
            agg.add_attribution(
                attribution("v", start, gpus=[gpu(allocated=45.0, idle=idle * 0.75, used=20.0)],
                            units={"steps": 450.0})
            )  # fmt: skip
            agg.add_gpu_window(gpu_window("GPU-a", start, allocated=45.0))
            if day == 1:
                nlp = gpu("GPU-b", model=A100, usd_per_hour=3.0, idle=0.0)
                agg.add_attribution(
                    attribution("n", start, gpus=[nlp], labels={"team": "nlp"},
                                units={"tokens": 9e4})
                )  # fmt: skip
                agg.add_gpu_window(gpu_window("GPU-b", start, model=A100))
    return agg.report()


def test_csv_parses_back_with_dictreader() -> None:
    report = two_days()
    parsed = list(csv.DictReader(io.StringIO(to_csv(report))))
    header = [*FIELDS, "work_units.steps", "cost_per_unit_usd.steps"]
    header += ["work_units.tokens", "cost_per_unit_usd.tokens"]
    assert list(parsed[0]) == header
    assert len(parsed) == len(report.rows)
    vision = [r for r in parsed if r["group"] == "vision"]
    assert [r["step_start"] for r in vision] == ["2025-12-01T00:00:00Z", "2025-12-02T00:00:00Z"]
    assert float(vision[0]["cost_usd"]) == pytest.approx(60 * 45 * 4 / 3600)
    assert float(vision[0]["idle_share"]) == pytest.approx(0.3)
    assert float(vision[0]["cost_per_unit_usd.steps"]) == pytest.approx(45 * 4 / 3600 / 450)
    assert vision[0]["work_units.tokens"] == ""  # no tokens: empty, not 0
    assert sum(float(r["cost_usd"]) for r in parsed if r["kind"] == "total") == pytest.approx(
        sum(row.cost_usd for row in report.totals)
    )
    (period,) = [r for r in parsed if r["kind"] == "period_total"]
    assert float(period["unallocated_gpu_hours"]) == pytest.approx(2 * 60 * 15 / 3600)


def test_json_is_a_list_of_objects_with_raw_figures() -> None:
    report = two_days()
    parsed = json.loads(to_json(report))
    assert isinstance(parsed, list)
    assert len(parsed) == len(report.rows)
    nlp = next(r for r in parsed if r["group"] == "nlp")
    assert set(nlp) == {*FIELDS, "work_units", "cost_per_unit_usd", *CHECK_FIELDS}
    assert [nlp[name] for name in CHECK_FIELDS] == [None, None, None]  # totals only
    assert nlp["by"] == "team"
    assert nlp["work_units"] == {"tokens": 60 * 9e4}
    assert nlp["cost_per_unit_usd"]["tokens"] == pytest.approx(3 / 3600 * 60 / 9e4)
    unallocated = [r for r in parsed if r["kind"] == "unallocated"]
    assert [r["unallocated_gpu_hours"] for r in unallocated] == pytest.approx([0.25, 0.25])
    # The pods' allocated time against that of gpu.windows: the same, day by day.
    totals = [r for r in parsed if r["kind"] in ("total", "period_total")]
    assert [r["gpu_windows_allocated_gpu_hours"] for r in totals] == pytest.approx(
        [0.75, 1.75, 2.5]
    )
    assert [r["allocated_gpu_hours"] for r in totals] == pytest.approx([0.75, 1.75, 2.5])
    assert totals[1]["gpu_windows_allocated_cost_usd"] == pytest.approx(3.0 + 3.0)
    assert [r["allocated_cost_gap"] for r in totals] == pytest.approx([0, 0, 0], abs=1e-12)


def test_the_table_aligns_rounds_and_ends_with_the_waste_trend() -> None:
    text = to_table(two_days())
    lines = text.splitlines()
    assert lines[0].startswith("gpuwatch report  2025-12-01 00:00:00 -> 2025-12-03 00:00:00 UTC")
    header = lines[2]
    assert header.split()[:3] == ["STEP", "TEAM", "GPU-H"]
    vision = next(line for line in lines if "vision" in line)
    assert vision.startswith("2025-12-01  vision")
    assert "30.0 %" in vision  # idle share
    assert "3.0000" in vision  # 45 GPU-min at 4 USD/h: under 100, four decimals
    assert "steps $0.1111/1k" in vision  # 4/36000 USD a step
    nlp = next(line for line in lines if " nlp " in line)
    assert "tokens $0.5556/1M" in nlp
    # Figures are right-aligned: the cost column ends at the same place on every row.
    cost_end = header.index("COST USD") + len("COST USD")
    table = [line for line in lines[3 : lines.index("", 3 + 9)] if line]
    assert len(table) == 8  # 3 rows of the first day, 4 of the second, the period total
    for line in table:
        assert line[cost_end - 1] != " "
        assert line[cost_end : cost_end + 2] in ("  ", "")  # (unallocated) ends there
    assert "fleet waste share per step (idle allocated cost / cost): 22.5 % -> 4.3 %" in text
    assert "total = the groups + (unallocated) = the fleet's priced GPU time" in text


def test_an_empty_table_has_its_header_and_says_so() -> None:
    report = Aggregator(TimeRange(T0, T0 + HOUR)).report()
    text = to_table(report)
    assert "COST USD" in text
    assert "(nothing recorded in the period)" in text
    assert json.loads(to_json(report)) == []
    assert list(csv.reader(io.StringIO(to_csv(report)))) == [list(FIELDS)]


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (4 / 36000, "steps $0.1111/1k"),
        (0.25, "steps $0.25"),
        (7e-7, "steps $0.7/1M"),
        (1e-10, "steps $0.0001/1M"),
        (None, "steps -"),
    ],
)
def test_a_cost_per_unit_is_scaled_to_read(usd: float | None, text: str) -> None:
    assert unit_cost_text("steps", usd) == text


def test_times_are_iso_8601_utc_with_milliseconds_when_there_are_some() -> None:
    assert iso(T0) == "2025-12-01T00:00:00Z"
    assert iso(T0 + 1_800) == "2025-12-01T00:00:01.800Z"
    assert iso(T0 - 1) == "2025-11-30T23:59:59.999Z"


def test_the_plot_is_a_png_with_the_waste_trend_in_its_title(tmp_path: Path) -> None:
    report = two_days()
    path = tmp_path / "cost.png"
    assert plot(report, path) == 2
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 1000
    assert title(report).endswith("waste 22.5 % -> 4.3 %")


def test_an_empty_report_still_plots(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    assert plot(Aggregator(TimeRange(T0, T0 + HOUR)).report(), path) == 0
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_csv_and_json_are_byte_for_byte_what_scripts_read() -> None:
    here = Path(__file__).parent
    report = two_days()
    assert to_csv(report) == (here / "expected_report.csv").read_text(encoding="utf-8")
    assert to_json(report) == (here / "expected_report.json").read_text(encoding="utf-8")
