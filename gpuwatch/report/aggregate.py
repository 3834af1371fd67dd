"""The sums of `gpuwatch report`: pod windows and GPU windows added up per group and step.

Pure: decoded records in, rows out; `gpuwatch.report.read` feeds it from Kafka. One pass:
each record is added once, in any order, except that prices are learned from `attribution`
before the `gpu.windows` are priced (`gpuwatch.report.pricing`). The rules, stated in
`gpuwatch report --help` and the README too:

- A window belongs to the period, and to a step, by its `window_start`. Steps are UTC
  hours (`1h`), UTC days (`1d`) or weeks from Monday 00:00 UTC (`7d`), cut at the
  period's ends; without a step the period is one.
- Groups: `team` (the pod's `team` label), `namespace`, `workload` (the owner's
  kind/name, the pod itself without one), `pod`, `node`, `gpu` (uuid) and `model` (split
  per GPU from the record's `gpus[]`: its seconds and cost, its part of the waste in
  proportion to its idle cost, of the units in proportion to its cost) and `cluster`.
  Names of namespaces, workloads, pods, nodes and GPUs of a cluster other than `default`
  start with `<cluster>/`; a missing value is `(none)`.
- Cost per unit of a unit name = the cost of the windows that report that unit / the units
  done in them (none where no unit was done). With `--by gpu` or `model` a window's units
  go to its GPUs in proportion to their cost, so each GPU's cost per unit is the window's.
- `(unallocated)`: the GPU-seconds no pod was allocated (`unallocated_seconds` of
  `gpu.windows`), priced as the worker prices a GPU-second; so the total = the groups +
  `(unallocated)` = the fleet's priced GPU time.
- Idle share = idle / allocated GPU-seconds; waste share = waste / cost of the same row
  (for a total: the pods' idle allocated cost over the fleet's cost).
- Delivery is at least once, and a window revised after it closed comes again whole with
  a higher `revision`: per identity (cluster, pod uid or GPU uuid, `window_start`) the
  newest revision read counts, once (`gpuwatch.report.revisions`: a higher revision takes
  the lower one's figures back, a lower or equal one after it is left out; windows are
  remembered per partition within `DEDUP_HORIZON_MS` of event time of the newest one read
  from it). GPU prices are learned from each revision counted: a GPU-second's price does
  not change when its window is revised.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Final

from gpuwatch.report.pricing import FleetPrices
from gpuwatch.report.revisions import Copy, PartitionWindows, dedup_horizon_ms
from gpuwatch.report.rows import (
    GROUP_BYS,
    NONE,
    OTHER,
    STEPS,
    TOTAL,
    UNALLOCATED,
    Counts,
    GroupBy,
    Report,
    Row,
    RowKind,
    StepName,
)
from gpuwatch.report.sums import (
    FleetSums,
    Gpu,
    Part,
    Pod,
    Sums,
    take_back_gpu,
    take_back_pod,
)
from gpuwatch.timerange import TimeRange
from schemas.attribution import Attribution, GpuAttribution
from schemas.fields import DEFAULT_CLUSTER
from schemas.gpu_window import GpuWindow
from schemas.k8s_node import K8sNode
from schemas.prices import BUILTIN_PRICES, PriceTable
from schemas.settings import WindowSettings

__all__ = ["DEDUP_HORIZON_MS", "Aggregator", "step_start"]

TEAM_LABEL: Final = "team"  # the pod label `gpuwatch top --team` and the metrics use
HOUR_S: Final = 3600.0
WEEK_ORIGIN_MS: Final = 4 * 86_400_000  # 1970-01-05 00:00 UTC, a Monday: weeks as ISO 8601
DEDUP_HORIZON_MS: Final = dedup_horizon_ms(WindowSettings())  # the worker's revision
# horizon at its default (an hour) and some minutes: see `gpuwatch.report.revisions`

_FIRST: Final = Copy.FIRST
_UNCHECKED: Final = Copy.UNCHECKED


def step_start(ts: int, step: StepName | None, period: TimeRange) -> int:
    """The start of the step that holds `ts` (before cutting at the period's start)."""
    if step is None:
        return period.start_ms
    size = STEPS[step]
    return ts - (ts - WEEK_ORIGIN_MS) % size


def _row(
    span: tuple[int, int],
    group: str,
    kind: RowKind,
    sums: Sums,
    fleet: FleetSums,
    *,
    compare: bool = False,
) -> Row:
    """A line; `compare`: with the allocated GPU time of `gpu.windows` beside the pods'."""
    start, end = span
    checked = fleet.allocated_cost if compare else 0.0
    return Row(
        step_start=start,
        step_end=end,
        group=group,
        kind=kind,
        allocated_gpu_hours=sums.allocated_s / HOUR_S,
        used_gpu_hours=sums.used_s / HOUR_S,
        idle_gpu_hours=sums.idle_s / HOUR_S,
        unallocated_gpu_hours=fleet.unallocated_s / HOUR_S,
        cost_usd=sums.cost + fleet.unallocated_cost,
        waste_usd=sums.waste,
        work_units=dict(sorted(sums.units.items())),
        unit_cost_usd=dict(sorted(sums.unit_cost.items())),
        gpu_windows_allocated_gpu_hours=fleet.allocated_s / HOUR_S if compare else None,
        gpu_windows_allocated_cost_usd=fleet.allocated_cost if compare else None,
        allocated_cost_gap=sums.cost / checked - 1 if checked > 0 else None,
    )


def _scoped(cluster: str, name: str) -> str:
    return name if cluster == DEFAULT_CLUSTER else f"{cluster}/{name}"


def _team(rec: Attribution) -> str:
    return rec.labels.get(TEAM_LABEL) or NONE


def _namespace(rec: Attribution) -> str:
    return _scoped(rec.cluster, rec.namespace)


def _workload(rec: Attribution) -> str:
    owner = rec.owner
    name = f"{rec.namespace}/{rec.pod}" if owner is None else f"{owner.kind}/{owner.name}"
    return _scoped(rec.cluster, name if owner is None else f"{rec.namespace}/{name}")


def _pod(rec: Attribution) -> str:
    return _scoped(rec.cluster, f"{rec.namespace}/{rec.pod}")


def _node(rec: Attribution) -> str:
    return _scoped(rec.cluster, rec.node or NONE)


def _cluster(rec: Attribution) -> str:
    return rec.cluster


_WHOLE: Final[dict[GroupBy, Callable[[Attribution], str]]] = {
    "team": _team,
    "namespace": _namespace,
    "workload": _workload,
    "pod": _pod,
    "node": _node,
    "cluster": _cluster,
}
_PER_GPU: Final[dict[GroupBy, Callable[[str, GpuAttribution], str]]] = {
    "gpu": lambda cluster, gpu: _scoped(cluster, gpu.uuid),
    "model": lambda cluster, gpu: gpu.model or NONE,
}


def _parts(weights: list[float], fallback: list[float]) -> list[float]:
    """Weights normalised to sum to 1: `weights`, else `fallback`, else equal parts."""
    for candidate in (weights, fallback):
        total = sum(candidate)
        if total > 0:
            return [w / total for w in candidate]
    return [1.0 / len(weights)] * len(weights)


class Aggregator:
    """Adds decoded records up per group and step; `report()` gives the rows.

    Feed `attribution` records (and `k8s.nodes`) before `gpu.windows`: the GPU windows'
    unallocated seconds are priced with the prices the attribution records show
    (`gpuwatch.report.pricing`). `source` names where a record was read (topic and
    partition): copies of a window (redeliveries, revisions) are looked for within one
    source, where its key puts them all.
    """

    def __init__(
        self,
        period: TimeRange,
        *,
        by: GroupBy = "team",
        step: StepName | None = None,
        prices: PriceTable = BUILTIN_PRICES,
        dedup_horizon_ms: int = DEDUP_HORIZON_MS,
    ) -> None:
        if by not in GROUP_BYS:
            raise ValueError(f"cannot group by {by!r}: one of {', '.join(GROUP_BYS)}")
        if step is not None and step not in STEPS:
            raise ValueError(f"unknown step {step!r}: one of {', '.join(STEPS)}")
        self.period, self.by, self.step = period, by, step
        self.counts = Counts()
        self.prices = FleetPrices(prices)
        self._start, self._end = period.start_ms, period.end_ms
        self._horizon = dedup_horizon_ms
        self._whole = _WHOLE.get(by)
        self._per_gpu = _PER_GPU.get(by)
        self._sums: dict[tuple[int, str], Sums] = {}
        self._fleet: dict[int, FleetSums] = {}
        self._pods_seen: dict[Hashable, PartitionWindows[Pod]] = {}
        self._gpus_seen: dict[Hashable, PartitionWindows[Gpu]] = {}
        self._mig: dict[tuple[int, str, str, str, str], FleetSums] = {}
        self._instances: dict[tuple[str, str], set[str]] = {}
        self._step = self._step_function()

    @property
    def dedup_horizon_ms(self) -> int:
        """How far behind its partition's newest window a copy of a window is checked."""
        return self._horizon

    def widen_dedup_horizon(self, horizon_ms: int) -> None:
        """Remember windows at least `horizon_ms` behind each partition's newest (the
        horizon of the worker's settings, `revisions.dedup_horizon_ms`); before any record."""
        if self._pods_seen or self._gpus_seen:
            raise RuntimeError("the dedupe horizon is set before the first record")
        self._horizon = max(self._horizon, horizon_ms)

    def _step_function(self) -> Callable[[int], int]:
        step, period = self.step, self.period
        return lambda ts: step_start(ts, step, period)

    def _left_out(self, copy: Copy) -> bool:
        """Count a copy the rules leave out; False for one that is counted."""
        counts = self.counts
        if copy is Copy.AGAIN:
            counts.duplicates += 1
        elif copy is Copy.OLDER:
            counts.superseded += 1
        elif copy is Copy.TOO_LATE:
            counts.late_revisions += 1
        else:
            return False
        return True

    def add_attribution(self, rec: Attribution, source: Hashable = None) -> None:
        """One pod's window (a copy of it: see the module doc)."""
        start = rec.window_start
        if not self._start <= start < self._end:
            self.counts.outside += 1
            return
        seen = self._pods_seen.get(source)
        if seen is None:
            seen = self._pods_seen[source] = PartitionWindows(self._horizon)
        identity, revision = hash((rec.cluster, rec.uid)), rec.revision
        copy, before = seen.check(start, identity, revision)
        if copy is not _FIRST and self._left_out(copy):
            return
        if before is None:
            self.counts.pod_windows += 1
        else:
            self.counts.revised += 1
            take_back_pod(before)
        learn = self.prices.learn
        for gpu in rec.gpus:
            learn(rec.cluster, rec.node, gpu)
        step = self._step(start)
        whole = self._whole
        if whole is not None:
            part = self._whole_part(step, whole(rec), rec)
            part[0].add(part)
            added: Pod = (revision, *part)
        else:
            parts = self._split(step, rec)
            for part in parts:
                part[0].add(part)
            added = (revision, *(item for part in parts for item in part))
        if copy is not _UNCHECKED:
            seen.keep(start, identity, added)

    def _part(
        self,
        step: int,
        group: str,
        of: Attribution | GpuAttribution,
        *,
        units: Mapping[str, float],
        share: float,
        waste: float,
    ) -> Part:
        """What a pod's window (or its part on one GPU, `of`) adds to a group."""
        key = (step, group)
        sums = self._sums.get(key)
        if sums is None:
            sums = self._sums[key] = Sums()
        return (
            sums,
            of.allocated_gpu_seconds,
            of.used_gpu_seconds,
            of.idle_gpu_seconds,
            of.cost_usd,
            waste,
            units or None,
            share,
        )

    def _whole_part(self, step: int, group: str, rec: Attribution) -> Part:
        """A pod's window, whole, to one group."""
        return self._part(step, group, rec, units=rec.work_units, share=1.0, waste=rec.waste_usd)

    def _split(self, step: int, rec: Attribution) -> tuple[Part, ...]:
        """A pod's window split over its GPUs (`--by gpu`, `--by model`)."""
        gpus = rec.gpus
        name_of = self._per_gpu
        assert name_of is not None  # set where _whole is None
        if len(gpus) <= 1:  # most pods: the window is its GPU's
            group = name_of(rec.cluster, gpus[0]) if gpus else NONE
            return (self._whole_part(step, group, rec),)
        costs = [g.cost_usd for g in gpus]
        idle_cost = [
            g.cost_usd * g.idle_gpu_seconds / g.allocated_gpu_seconds
            if g.allocated_gpu_seconds > 0
            else 0.0
            for g in gpus
        ]
        waste_parts = _parts(idle_cost, costs)
        unit_parts = _parts(costs, [g.allocated_gpu_seconds for g in gpus])
        return tuple(
            self._part(
                step,
                name_of(rec.cluster, gpu),
                gpu,
                units=rec.work_units,
                share=unit_part,
                waste=rec.waste_usd * waste_part,
            )
            for gpu, waste_part, unit_part in zip(gpus, waste_parts, unit_parts, strict=True)
        )

    def add_node(self, node: K8sNode) -> None:
        """A node's labels, for the price overrides by node label."""
        self.counts.nodes += 1
        self.prices.node_labels(node.cluster, node.node, node.labels)

    def add_gpu_window(self, win: GpuWindow, source: Hashable = None) -> None:
        """One GPU's window (a copy of it: see the module doc), its seconds priced."""
        start = win.window_start
        if not self._start <= start < self._end:
            self.counts.outside += 1
            return
        cluster = win.cluster
        seen = self._gpus_seen.get(source)
        if seen is None:
            seen = self._gpus_seen[source] = PartitionWindows(self._horizon)
        identity, revision = hash((cluster, win.uuid)), win.revision
        copy, before = seen.check(start, identity, revision)
        if copy is not _FIRST and self._left_out(copy):
            return
        if before is None:
            self.counts.gpu_windows += 1
        else:
            self.counts.revised += 1
            take_back_gpu(before)
        step = self._step(start)
        fleet = self._fleet.get(step)
        if fleet is None:
            fleet = self._fleet[step] = FleetSums()
        allocated, unallocated = win.allocated_seconds, win.unallocated_seconds
        fleet.allocated_s += allocated
        fleet.unallocated_s += unallocated
        parent = win.parent_uuid
        mig: FleetSums | None = None
        if parent is not None:
            self._instances.setdefault((cluster, parent), set()).add(win.uuid)
            if self.prices.learned(cluster, win.uuid) is None:  # priced when all are known
                key = (step, cluster, win.node, win.model, parent)
                mig = self._mig.get(key)
                if mig is None:
                    mig = self._mig[key] = FleetSums()
                mig.allocated_s += allocated
                mig.unallocated_s += unallocated
        if mig is None:
            price = self.prices.usd_per_second(
                cluster, win.node, win.uuid, win.model, mig=parent is not None
            )
            allocated_cost, unallocated_cost = allocated * price, unallocated * price
            fleet.allocated_cost += allocated_cost
            fleet.unallocated_cost += unallocated_cost
            added: Gpu = (
                revision, fleet, None, allocated, unallocated, allocated_cost, unallocated_cost
            )  # fmt: skip
        else:
            added = (revision, fleet, mig, allocated, unallocated, 0.0, 0.0)
        if copy is not _UNCHECKED:
            seen.keep(start, identity, added)

    def _price_mig(self) -> None:
        """The MIG instances no pod held, priced now that every instance was seen (rule 4)."""
        for (step, cluster, node, model, parent), pending in self._mig.items():
            instances = self._instances[(cluster, parent)]
            price = self.prices.mig_remainder(cluster, node, model, instances)
            fleet = self._fleet[step]
            fleet.allocated_cost += pending.allocated_s * price
            fleet.unallocated_cost += pending.unallocated_s * price
        self._mig.clear()

    def fleet_cost(self) -> float:
        """The fleet's priced GPU time: every GPU window's seconds at the GPU's price."""
        self._price_mig()
        return sum(f.allocated_cost + f.unallocated_cost for f in self._fleet.values())

    def report(self, top: int | None = None) -> Report:
        """The rows: per step, the groups by cost (the `top` most costly, the rest as
        `(other)`), `(unallocated)`, the step's total; a period total after several steps."""
        self._price_mig()
        by_step: dict[int, dict[str, Sums]] = {step: {} for step in self._fleet}
        for (step, group), sums in self._sums.items():
            if sums.windows:  # none: every window it held went to another group when revised
                by_step.setdefault(step, {})[group] = sums
        rows: list[Row] = []
        period_sums, period_fleet = Sums(), FleetSums()
        nothing = FleetSums()
        compare = self.counts.gpu_windows > 0
        for step in sorted(by_step):
            start = max(step, self._start)
            end = self._end if self.step is None else min(step + STEPS[self.step], self._end)
            groups = sorted(by_step[step].items(), key=lambda item: (-item[1].cost, item[0]))
            kept, rest = (groups, []) if top is None else (groups[:top], groups[top:])
            rows.extend(_row((start, end), name, "group", sums, nothing) for name, sums in kept)
            total = Sums()
            for _, sums in groups:
                total.merge(sums)
            if rest:
                other = Sums()
                for _, sums in rest:
                    other.merge(sums)
                rows.append(_row((start, end), OTHER, "other", other, nothing))
            fleet = self._fleet.get(step, nothing)
            rows.append(_row((start, end), UNALLOCATED, "unallocated", Sums(), fleet))
            rows.append(_row((start, end), TOTAL, "total", total, fleet, compare=compare))
            period_sums.merge(total)
            period_fleet.unallocated_s += fleet.unallocated_s
            period_fleet.unallocated_cost += fleet.unallocated_cost
            period_fleet.allocated_s += fleet.allocated_s
            period_fleet.allocated_cost += fleet.allocated_cost
        if len(by_step) > 1:
            span = (self._start, self._end)
            rows.append(
                _row(span, TOTAL, "period_total", period_sums, period_fleet, compare=compare)
            )
        report = Report(self.period, self.by, self.step, rows, self.counts)
        report.notes.extend(self._notes(period_sums, period_fleet))
        return report

    def _notes(self, pods: Sums, fleet: FleetSums) -> list[str]:
        notes = []
        counts = self.counts
        if counts.duplicates:
            notes.append(f"records delivered more than once, counted once: {counts.duplicates}")
        if counts.revised or counts.superseded:
            notes.append(
                f"windows revised after they closed: {counts.revised} newer revisions took "
                f"the place of the one counted before; {counts.superseded} older revisions "
                "read after a newer one, left out"
            )
        if counts.late_revisions:
            notes.append(
                f"revisions of windows more than {self._horizon // 60_000} min older than "
                f"the newest of their partition, left out: {counts.late_revisions} (the "
                "window's earlier copy is counted; the worker revises windows for longer "
                "than the settings given to the report say: GPUWATCH_REVISION_HORIZON_S)"
            )
        if self.counts.pod_windows and not self.counts.gpu_windows:
            notes.append(
                "no gpu.windows records in the period: (unallocated) is 0 and the total is "
                "the pods' cost only"
            )
        elif self.counts.gpu_windows and fleet.allocated_cost > 0:
            gap = pods.cost / fleet.allocated_cost - 1
            if abs(gap) > 0.01:  # float noise is far below; a missing window of a pod is not
                notes.append(
                    f"the pods' cost ({pods.cost:.2f} USD) differs by {100 * gap:+.1f} % from "
                    f"the allocated GPU time of gpu.windows priced the same way "
                    f"({fleet.allocated_cost:.2f} USD): the two topics disagree on the "
                    "allocated GPU time (a GPU's window closes with its node's data, its pods' "
                    "with the slowest node's: the last windows before the data ends may be in "
                    "gpu.windows only; or records missing from one: retention, a worker down; "
                    "allocated_cost_gap per step in --format json)"
                )
        return notes
