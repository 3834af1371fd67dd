"""`gpuwatch report --plot`: cost and waste per group over the steps, as stacked bars.

matplotlib, an optional extra (`gpuwatch[plot]`), is imported only when a plot is drawn,
with the Agg backend (no display), by `gpuwatch/plotting.py`. The title carries the fleet's
waste share in the last two steps (`waste 30.0 % -> 20.0 %`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from gpuwatch.plotting import pyplot
from gpuwatch.report.render import waste_trend
from gpuwatch.report.rows import OTHER, UNALLOCATED, Report
from gpuwatch.timerange import format_time

__all__ = ["PLOT_GROUPS", "plot", "title"]

PLOT_GROUPS: Final = 10  # groups drawn in colour; the rest as (other): a legend one reads
UNALLOCATED_COLOUR: Final = "#bbbbbb"
OTHER_COLOUR: Final = "#777777"


def title(report: Report) -> str:
    """What the plot shows, and the waste share's trend between the last two steps."""
    period = report.period
    trend = [w for _, w, _ in waste_trend(report)]
    shares = " -> ".join("-" if w is None else f"{100 * w:.1f} %" for w in trend[-2:])
    return (
        f"cost and waste by {report.by}, {format_time(period.start_ms)} -> "
        f"{format_time(period.end_ms)} UTC" + (f" - waste {shares}" if shares else "")
    )


def _series(report: Report) -> tuple[list[int], dict[str, list[float]], dict[str, list[float]]]:
    """Step starts, and per drawn group its cost and waste in each step."""
    steps = [row.step_start for row in report.totals]
    index = {step: i for i, step in enumerate(steps)}
    spent: dict[str, float] = {}
    for row in report.rows:
        if row.kind == "group":
            spent[row.group] = spent.get(row.group, 0.0) + row.cost_usd
    drawn = sorted(spent, key=lambda g: (-spent[g], g))[:PLOT_GROUPS]
    cost: dict[str, list[float]] = {g: [0.0] * len(steps) for g in (*drawn, OTHER, UNALLOCATED)}
    waste: dict[str, list[float]] = {g: [0.0] * len(steps) for g in (*drawn, OTHER)}
    for row in report.rows:
        if row.kind not in ("group", "other", "unallocated"):
            continue
        name = row.group if row.group in cost else OTHER
        i = index[row.step_start]
        cost[name][i] += row.cost_usd
        if name in waste:
            waste[name][i] += row.waste_usd
    return steps, cost, waste


def plot(report: Report, path: Path) -> int:
    """Draw cost (groups and unallocated) and waste per group, stacked per step; the
    number of steps drawn."""
    plt = pyplot()
    steps, cost, waste = _series(report)
    labels = [format_time(s)[:16] if report.step == "1h" else format_time(s)[:10] for s in steps]
    xs = list(range(len(steps)))
    fig: Any
    fig, (cost_ax, waste_ax) = plt.subplots(2, 1, sharex=True, figsize=(11, 7), dpi=100)
    try:
        for ax, series in ((cost_ax, cost), (waste_ax, waste)):
            bottom = [0.0] * len(steps)
            for name, values in series.items():
                if not any(values):
                    continue
                colour = {UNALLOCATED: UNALLOCATED_COLOUR, OTHER: OTHER_COLOUR}.get(name)
                ax.bar(xs, values, bottom=bottom, label=name, color=colour, width=0.8)
                bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        cost_ax.set_ylabel("cost (USD)")
        waste_ax.set_ylabel("waste (USD)")
        waste_ax.set_xlabel("step (UTC)" if report.step else "period")
        every = max(1, len(xs) // 12)  # a dozen labels at most: they stay readable
        waste_ax.set_xticks(xs[::every], labels[::every], rotation=30, ha="right")
        cost_ax.set_title(title(report), fontsize="medium")
        if cost_ax.get_legend_handles_labels()[0]:
            cost_ax.legend(loc="upper left", fontsize="small", ncol=3)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return len(steps)
