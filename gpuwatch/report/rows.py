"""The report's rows and names: what `gpuwatch.report.aggregate` gives and the renderers print."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from gpuwatch.timerange import TimeRange

__all__ = [
    "GROUP_BYS",
    "NONE",
    "OTHER",
    "STEPS",
    "TOTAL",
    "UNALLOCATED",
    "Counts",
    "GroupBy",
    "Report",
    "Row",
    "RowKind",
    "StepName",
]

GroupBy = Literal["team", "namespace", "workload", "pod", "node", "gpu", "model", "cluster"]
GROUP_BYS: Final[tuple[GroupBy, ...]] = get_args(GroupBy)
StepName = Literal["1h", "1d", "7d"]
STEPS: Final[dict[StepName, int]] = {"1h": 3_600_000, "1d": 86_400_000, "7d": 604_800_000}
RowKind = Literal["group", "other", "unallocated", "total", "period_total"]

NONE: Final = "(none)"
OTHER: Final = "(other)"
UNALLOCATED: Final = "(unallocated)"
TOTAL: Final = "total"


@dataclass(frozen=True)
class Row:
    """One line of the report: a group (or `(other)`, `(unallocated)`, a total) in a step."""

    step_start: int
    step_end: int
    group: str
    kind: RowKind
    allocated_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    unallocated_gpu_hours: float
    cost_usd: float
    waste_usd: float
    work_units: dict[str, float]
    unit_cost_usd: dict[str, float]
    """Per unit name: the cost of the windows that report it (the numerator of its cost
    per unit)."""
    gpu_windows_allocated_gpu_hours: float | None = None
    """On a total line (when `gpu.windows` were read): the allocated GPU-hours of the GPU
    windows, which `allocated_gpu_hours` (the pods') should equal; None on other lines."""
    gpu_windows_allocated_cost_usd: float | None = None
    """On a total line: those GPU-hours priced as the worker prices them."""
    allocated_cost_gap: float | None = None
    """On a total line: the pods' cost over `gpu_windows_allocated_cost_usd`, minus 1 (0 when
    the two topics agree; the report notes a gap over 1 % on stderr); None without it."""

    @property
    def idle_share(self) -> float | None:
        """Idle over allocated GPU-hours; None without allocated time."""
        hours = self.allocated_gpu_hours
        return self.idle_gpu_hours / hours if hours > 0 else None

    @property
    def waste_share(self) -> float | None:
        """Waste over cost; None without cost."""
        return self.waste_usd / self.cost_usd if self.cost_usd > 0 else None

    @property
    def cost_per_unit(self) -> dict[str, float | None]:
        """USD per unit by unit name; None where no unit was done."""
        return {
            name: (self.unit_cost_usd[name] / count if count > 0 else None)
            for name, count in sorted(self.work_units.items())
        }


@dataclass
class Counts:
    """What was read: records added, and those left out and why."""

    pod_windows: int = 0
    gpu_windows: int = 0
    nodes: int = 0
    duplicates: int = 0
    """Copies of a window read again at the revision counted, left out."""
    revised: int = 0
    """Copies of a window at a higher revision than the one counted, which took its place."""
    superseded: int = 0
    """Copies of a window at a lower revision than the one counted, left out."""
    late_revisions: int = 0
    """Revisions of windows older than the dedupe horizon of their partition, left out."""
    outside: int = 0
    """Records of windows that start outside the period (read for the margins)."""
    undecodable: int = 0
    """Records that did not decode (counted by the reader, skipped)."""


@dataclass
class Report:
    """The rows of a period, by group and step, and what the reading noticed."""

    period: TimeRange
    by: GroupBy
    step: StepName | None
    rows: list[Row]
    counts: Counts
    notes: list[str] = field(default_factory=list)

    @property
    def totals(self) -> list[Row]:
        """The total line of each step, in time order."""
        return [row for row in self.rows if row.kind == "total"]

    @property
    def unit_names(self) -> list[str]:
        """Every unit name in the report, sorted."""
        return sorted({name for row in self.rows for name in row.work_units})

    @property
    def empty(self) -> bool:
        """Nothing recorded in the period."""
        return not self.rows
