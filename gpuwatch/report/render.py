"""The report printed: an aligned table for people, CSV and JSON (raw figures) for programs.

Pure formatting over `gpuwatch.report.aggregate.Report`; times are UTC. The table rounds
(hours to 1-2 decimals, dollars to 2-4, cost per unit to 4 significant digits, per 1k or
1M units where a unit costs under a cent); CSV and JSON keep every digit and the cost per
single unit.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

from gpuwatch.report.rows import Report, Row
from gpuwatch.tables import table_lines
from gpuwatch.timerange import format_time

__all__ = [
    "CHECK_FIELDS",
    "FIELDS",
    "iso",
    "to_csv",
    "to_json",
    "to_table",
    "unit_cost_text",
    "waste_trend",
]

FIELDS: Final = (
    "step_start",
    "step_end",
    "by",
    "group",
    "kind",
    "allocated_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "idle_share",
    "unallocated_gpu_hours",
    "cost_usd",
    "waste_usd",
    "waste_share",
)
"""The columns of the CSV before the unit columns (`work_units.NAME`,
`cost_per_unit_usd.NAME`), and the keys of a JSON row besides `work_units`,
`cost_per_unit_usd` and `CHECK_FIELDS`."""
CHECK_FIELDS: Final = (
    "gpu_windows_allocated_gpu_hours",
    "gpu_windows_allocated_cost_usd",
    "allocated_cost_gap",
)
"""The keys of a JSON row that hold the pods' allocated time against that of `gpu.windows`
(set on total lines, null on the others)."""

TREND_STEPS: Final = 12  # the last steps shown in the table's trend line: a line's width
UNIT_SCALES: Final = ((1, ""), (1_000, "1k"), (1_000_000, "1M"))
CENT: Final = 0.01


def iso(ms: int) -> str:
    """`2025-11-01T00:00:00Z`, with milliseconds only when there are some."""
    text = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{ms % 1000:03d}Z" if ms % 1000 else "Z")


def _fields(report: Report, row: Row) -> dict[str, Any]:
    return {
        "step_start": iso(row.step_start),
        "step_end": iso(row.step_end),
        "by": report.by,
        "group": row.group,
        "kind": row.kind,
        "allocated_gpu_hours": row.allocated_gpu_hours,
        "used_gpu_hours": row.used_gpu_hours,
        "idle_gpu_hours": row.idle_gpu_hours,
        "idle_share": row.idle_share,
        "unallocated_gpu_hours": row.unallocated_gpu_hours,
        "cost_usd": row.cost_usd,
        "waste_usd": row.waste_usd,
        "waste_share": row.waste_share,
    }


def to_json(report: Report) -> str:
    """A JSON list of row objects, figures unrounded, cost per unit per single unit; total
    lines hold the allocated time of `gpu.windows` beside the pods' (`CHECK_FIELDS`)."""
    rows = [
        {
            **_fields(report, row),
            "work_units": row.work_units,
            "cost_per_unit_usd": row.cost_per_unit,
            **{name: getattr(row, name) for name in CHECK_FIELDS},
        }
        for row in report.rows
    ]
    return json.dumps(rows, indent=1) + "\n"


def to_csv(report: Report) -> str:
    """CSV with a header row; a unit's count and cost per unit in two columns each."""
    units = report.unit_names
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = [*FIELDS]
    for name in units:
        header += [f"work_units.{name}", f"cost_per_unit_usd.{name}"]
    writer.writerow(header)
    for row in report.rows:
        values = list(_fields(report, row).values())
        per_unit = row.cost_per_unit
        for name in units:
            values += [row.work_units.get(name), per_unit.get(name)]
        writer.writerow(["" if v is None else v for v in values])
    return out.getvalue()


def unit_cost_text(name: str, usd: float | None) -> str:
    """`steps $0.1111/1k`: per 1k or 1M units where a unit costs under a cent."""
    if usd is None:
        return f"{name} -"
    scale, label = next(((s, name) for s, name in UNIT_SCALES if usd * s >= CENT), UNIT_SCALES[-1])
    return f"{name} ${usd * scale:.4g}" + (f"/{label}" if label else "")


def waste_trend(report: Report) -> list[tuple[int, float | None, float | None]]:
    """Per step of the fleet: (start, waste share, unallocated share of the cost)."""
    unallocated = {r.step_start: r.cost_usd for r in report.rows if r.kind == "unallocated"}
    out = []
    for row in report.totals:
        share = unallocated[row.step_start] / row.cost_usd if row.cost_usd > 0 else None
        out.append((row.step_start, row.waste_share, share))
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _decimals(values: Sequence[float], big: float, wide: int, narrow: int) -> str:
    return f",.{wide if max(values, default=0.0) < big else narrow}f"


def _step_label(report: Report, row: Row) -> str:
    if row.kind == "period_total":
        return "period"
    text = format_time(row.step_start)
    if report.step == "1h" or not text.endswith("00:00:00"):
        return text[:16]
    return text[:10]


def to_table(report: Report) -> str:
    """Aligned columns a person reads: the rows, the fleet's waste trend, the rules."""
    period = report.period
    title = (
        f"gpuwatch report  {format_time(period.start_ms)} -> {format_time(period.end_ms)} UTC"
        f"  by {report.by}  " + (f"step {report.step}" if report.step else "(one step)")
    )
    rows = report.rows
    hours = _decimals(
        [r.allocated_gpu_hours for r in rows] + [r.unallocated_gpu_hours for r in rows], 10, 2, 1
    )
    money = _decimals([r.cost_usd for r in rows], 100, 4, 2)
    header = ["GPU-H ALLOC", "GPU-H USED", "IDLE", "GPU-H UNALLOC", "COST USD", "WASTE USD"]
    header = [report.by.upper(), *header, "WASTE", "COST PER UNIT"]
    table: list[list[str]] = [(["STEP"] if report.step else []) + header]
    last_step: int | None = None
    for row in rows:
        label = _step_label(report, row)
        first = row.step_start != last_step or row.kind == "period_total"
        if first and last_step is not None:
            table.append([])
        last_step = row.step_start
        pods = row.kind != "unallocated"
        cells = [
            row.group,
            format(row.allocated_gpu_hours, hours) if pods else "",
            format(row.used_gpu_hours, hours) if pods else "",
            _pct(row.idle_share) if pods else "",
            "" if row.kind in ("group", "other") else format(row.unallocated_gpu_hours, hours),
            format(row.cost_usd, money),
            format(row.waste_usd, money) if pods else "",
            _pct(row.waste_share) if pods else "",
            ", ".join(unit_cost_text(n, usd) for n, usd in row.cost_per_unit.items()),
        ]
        table.append(([label if first else ""] if report.step else []) + cells)
    lines = [title, "", *_aligned(table, left=2 if report.step else 1)]
    if report.empty:
        lines.append("(nothing recorded in the period)")
    lines += ["", *_trend_lines(report), *_rules()]
    return "\n".join(lines).rstrip("\n") + "\n"


def _aligned(table: list[list[str]], left: int) -> list[str]:
    """Text columns (the first `left`, and the last) to the left, figures to the right; an
    empty row is a blank line between steps."""
    header, *rows = table
    return table_lines(header, rows, right=range(left, len(header) - 1))


def _trend_lines(report: Report) -> list[str]:
    trend = waste_trend(report)
    if not trend:
        return []
    shown = trend[-TREND_STEPS:]
    more = "... " if len(trend) > len(shown) else ""
    waste = " -> ".join(_pct(w) for _, w, _ in shown)
    unallocated = " -> ".join(_pct(u) for _, _, u in shown)
    per = "per step" if report.step else "over the period"
    return [
        f"fleet waste share {per} (idle allocated cost / cost): {more}{waste}",
        f"fleet unallocated share {per} (unallocated cost / cost): {more}{unallocated}",
    ]


def _rules() -> list[str]:
    return [
        "(unallocated): GPU time no pod was allocated, priced as the worker prices GPU time; "
        "total = the groups + (unallocated) = the fleet's priced GPU time.",
        "cost per unit = cost of the windows that report the unit / the units done in them.",
    ]
