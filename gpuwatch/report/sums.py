"""What `gpuwatch report` adds up: per group and step, and per step of the fleet; and what
one window added, kept so that a newer revision of the window can take it back.

Pure accumulators over plain numbers, fed by `gpuwatch.report.aggregate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeAlias

__all__ = [
    "PART",
    "FleetSums",
    "Gpu",
    "Part",
    "Pod",
    "Sums",
    "take_back_gpu",
    "take_back_pod",
]


class Sums:
    """What one group spent in one step: seconds, dollars, and units with their cost; and
    how many windows (parts of windows, split per GPU) it holds, so that a window's figures
    taken back for a newer revision leave no trace (`take_back`)."""

    __slots__ = (
        "allocated_s",
        "cost",
        "idle_s",
        "unit_cost",
        "unit_windows",
        "units",
        "used_s",
        "waste",
        "windows",
    )

    def __init__(self) -> None:
        self.allocated_s = self.used_s = self.idle_s = 0.0
        self.cost = self.waste = 0.0
        self.windows = 0
        self.units: dict[str, float] = {}
        self.unit_cost: dict[str, float] = {}
        self.unit_windows: dict[str, int] = {}

    def add(self, part: Part) -> None:
        """One window's part (the sums in `part[0]` are these)."""
        _, allocated, used, idle, cost, waste, units, share = part
        self.windows += 1
        self.allocated_s += allocated
        self.used_s += used
        self.idle_s += idle
        self.cost += cost
        self.waste += waste
        if units:
            counts, costs, windows = self.units, self.unit_cost, self.unit_windows
            for name, count in units.items():
                windows[name] = windows.get(name, 0) + 1
                counts[name] = counts.get(name, 0.0) + count * share
                costs[name] = costs.get(name, 0.0) + cost

    def take_back(self, part: Part) -> None:
        """A window's part added before (a newer revision of the window came)."""
        _, allocated, used, idle, cost, waste, units, share = part
        self.windows -= 1
        if self.windows == 0:  # exactly nothing, not what rounding leaves of a - a
            self.allocated_s = self.used_s = self.idle_s = self.cost = self.waste = 0.0
        else:
            self.allocated_s -= allocated
            self.used_s -= used
            self.idle_s -= idle
            self.cost -= cost
            self.waste -= waste
        if units:
            counts, costs, windows = self.units, self.unit_cost, self.unit_windows
            for name, count in units.items():
                left = windows[name] - 1
                if left == 0:  # no window reports the unit any more: no cost per unit
                    del counts[name], costs[name], windows[name]
                    continue
                windows[name] = left
                counts[name] -= count * share
                costs[name] -= cost

    def merge(self, other: Sums) -> None:
        """Add another group's sums (the `(other)` and total lines)."""
        self.allocated_s += other.allocated_s
        self.used_s += other.used_s
        self.idle_s += other.idle_s
        self.cost += other.cost
        self.waste += other.waste
        self.windows += other.windows
        for name, count in other.units.items():
            self.units[name] = self.units.get(name, 0.0) + count
            self.unit_cost[name] = self.unit_cost.get(name, 0.0) + other.unit_cost[name]
            self.unit_windows[name] = self.unit_windows.get(name, 0) + other.unit_windows[name]


class FleetSums:
    """The GPU windows of one step: allocated and unallocated seconds, and their price."""

    __slots__ = ("allocated_cost", "allocated_s", "unallocated_cost", "unallocated_s")

    def __init__(self) -> None:
        self.allocated_s = self.unallocated_s = 0.0
        self.allocated_cost = self.unallocated_cost = 0.0


Part: TypeAlias = tuple[Sums, float, float, float, float, float, Mapping[str, float] | None, float]
"""What a pod's window adds to one group: the group's sums, allocated, used and idle
GPU-seconds, cost, waste, units (None: none reported) and the part of the units."""
PART: Final = 8  # the items of a Part
Pod: TypeAlias = tuple[Any, ...]
"""What a pod's window added, remembered to take it back: its revision, then the items of
one `Part` per group it went to (one per GPU with `--by gpu`), in one flat tuple: an hour of
windows of a partition is held."""
Gpu: TypeAlias = tuple[int, FleetSums, FleetSums | None, float, float, float, float]
"""What a GPU window added: its revision; to its step's fleet sums, to the MIG instances
priced at the end (None: priced at once); allocated and unallocated seconds, their cost."""


def take_back_pod(added: Pod) -> None:
    """What a pod's window added (`Aggregator.add_attribution`), taken back."""
    for k in range(1, len(added), PART):
        part = added[k : k + PART]
        part[0].take_back(part)


def take_back_gpu(added: Gpu) -> None:
    """What a GPU window added (`Aggregator.add_gpu_window`), taken back."""
    _, fleet, mig, allocated, unallocated, allocated_cost, unallocated_cost = added
    fleet.allocated_s -= allocated
    fleet.unallocated_s -= unallocated
    fleet.allocated_cost -= allocated_cost
    fleet.unallocated_cost -= unallocated_cost
    if mig is not None:
        mig.allocated_s -= allocated
        mig.unallocated_s -= unallocated
