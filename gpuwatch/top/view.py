"""What `gpuwatch top` shows: rows, filtering, sorting and the text and JSON renderings.

Pure: plain rows in, text out, with `now` passed in. Reading the rows from Redis is
`gpuwatch/top/live.py`; keeping the two apart lets every column be tested on hand-made rows.
The capacity line and a blocked pod's reason are formatted by `gpuwatch/top/capacity.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from gpuwatch.top.capacity import (
    BLOCKED_ALERT,
    CapacityRow,
    blocked_text,
    capacity_json,
    capacity_line,
)
from gpuwatch.top.workloads import WorkloadRow, queued, workload_json
from schemas.fields import DEFAULT_CLUSTER

__all__ = [
    "SORTS",
    "STATE_ORDER",
    "AlertRow",
    "CapacityRow",
    "GpuRow",
    "Header",
    "PodRow",
    "Query",
    "Snapshot",
    "View",
    "blocks",
    "fit_screen",
    "fmt_age",
    "fmt_bytes",
    "fmt_pct",
    "fmt_usd",
    "notes",
    "render_json",
    "render_text",
    "select",
    "short_uuid",
]

Sort = Literal["waste", "vram", "cost", "share", "state", "name"]
SORTS: Final[tuple[Sort, ...]] = ("waste", "vram", "cost", "share", "state", "name")

STATE_ORDER: Final[Mapping[str, int]] = {"stalled": 0, "queued": 1, "running": 2, "finished": 3}
"""`--sort state`: the states that want attention first, finished last."""

TEAM_LABEL: Final = "team"  # the one pod label shown, as in the Prometheus metrics
_SEVERITY_ORDER: Final[Mapping[str, int]] = {"critical": 0, "warning": 1, "info": 2}
_GPUS_LISTED: Final = 2  # uuids listed per pod row; the rest is counted ("+6")
_NONE: Final = "-"


@dataclass(frozen=True, slots=True)
class PodRow:
    """One pod as its `pod:{uid}` hash describes it; None where the hash has no value."""

    uid: str
    namespace: str
    pod: str
    state: str
    state_since: int | None = None
    reason: str = ""
    node: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()
    share: float | None = None
    vram_bytes: int | None = None
    cost_usd: float = 0.0
    waste_usd: float = 0.0
    cluster: str = DEFAULT_CLUSTER
    cost_per_unit: Mapping[str, float | None] = field(default_factory=dict)
    """Cost of a unit of work by unit name, over the pod's windows so far (none: it
    reports no units)."""

    @property
    def name(self) -> str:
        """`namespace/pod`."""
        return f"{self.namespace}/{self.pod}"

    @property
    def team(self) -> str | None:
        """The pod's `team` label, if it has one."""
        return self.labels.get(TEAM_LABEL)


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU as its `gpu:{uuid}` hash describes it; `owners` are pod uids."""

    uuid: str
    node: str = ""
    model: str = ""
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    owners: tuple[str, ...] = ()
    idle_since: int | None = None
    updated_at: int | None = None
    cluster: str = DEFAULT_CLUSTER


@dataclass(frozen=True, slots=True)
class AlertRow:
    """One firing alert of the `alerts:firing` hash."""

    fingerprint: str
    name: str
    severity: str
    since: int
    summary: str
    subject_kind: str
    subject_uid: str | None = None
    subject_uuid: str | None = None
    subject_node: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    value: float | None = None
    cluster: str = DEFAULT_CLUSTER


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything read from Redis in one refresh, before filtering.

    `state_counts` are the sizes of the state sets (all pods, read or not);
    `pods_left_out` the pods of the states read that did not fit under the cap `max_rows`
    (likewise `gpus_left_out`).
    `pod_names` maps uid -> `namespace/pod` for every pod known, also GPU owners that were
    not read as rows. `capacity` holds the latest capacity record of each (cluster, model,
    resource).
    """

    pods: tuple[PodRow, ...] = ()
    gpus: tuple[GpuRow, ...] = ()
    alerts: tuple[AlertRow, ...] = ()
    capacity: tuple[CapacityRow, ...] = ()
    workloads: tuple[WorkloadRow, ...] = ()
    """Kueue's workloads, as the Redis sink last saw each."""
    pod_names: Mapping[str, str] = field(default_factory=dict)
    state_counts: Mapping[str, int] = field(default_factory=dict)
    pods_left_out: int = 0
    gpus_total: int = 0
    gpus_left_out: int = 0
    max_rows: int = 0

    @property
    def empty(self) -> bool:
        """Nothing at all under the prefix that top reads: no pods, GPUs, alerts, capacity
        or workloads."""
        return not (
            sum(self.state_counts.values())
            or self.gpus_total
            or self.alerts
            or self.capacity
            or self.workloads
        )


@dataclass(frozen=True, slots=True)
class Query:
    """The command line's choice of rows: filters, order and how many."""

    sort: Sort = "waste"
    namespace: str | None = None
    team: str | None = None
    state: str | None = None
    limit: int | None = None
    cluster: str | None = None

    @property
    def filtered(self) -> bool:
        """Whether a filter of pods narrows the pods (and with them the GPUs and alerts);
        `cluster` narrows every table by its own cluster."""
        return any(v is not None for v in (self.namespace, self.team, self.state))


@dataclass(frozen=True, slots=True)
class View:
    """The rows to show, in order, with the counts before the limit cut them."""

    pods: tuple[PodRow, ...]
    gpus: tuple[GpuRow, ...]
    alerts: tuple[AlertRow, ...]
    pods_matched: int
    gpus_matched: int
    alerts_matched: int


@dataclass(frozen=True, slots=True)
class Header:
    """Where the rows came from, for the title line."""

    target: str  # the Redis URL, password redacted
    prefix: str


# -- selection --------------------------------------------------------------------------------


def _pod_key(sort: Sort) -> Callable[[PodRow], tuple[Any, ...]]:
    """Sort key of `--sort`: largest first for the numbers, ties by name then uid."""
    keys: dict[Sort, Callable[[PodRow], tuple[Any, ...]]] = {
        "waste": lambda p: (-p.waste_usd, -p.cost_usd),
        "cost": lambda p: (-p.cost_usd, -p.waste_usd),
        "vram": lambda p: (p.vram_bytes is None, -(p.vram_bytes or 0)),
        "share": lambda p: (p.share is None, -(p.share or 0.0)),
        "state": lambda p: (
            STATE_ORDER.get(p.state, len(STATE_ORDER)),
            p.state_since if p.state_since is not None else float("inf"),
        ),
        "name": lambda p: (),
    }
    first = keys[sort]
    return lambda p: (*first(p), p.namespace, p.pod, p.uid)


def _pod_matches(pod: PodRow, query: Query) -> bool:
    return (
        (query.cluster is None or pod.cluster == query.cluster)
        and (query.namespace is None or pod.namespace == query.namespace)
        and (query.team is None or pod.team == query.team)
        and (query.state is None or pod.state == query.state)
    )


def _alert_matches(alert: AlertRow, query: Query, pod_uids: set[str]) -> bool:
    """A pod's alert follows its pod; others need matching namespace/team labels."""
    if query.cluster is not None and alert.cluster != query.cluster:
        return False
    if not query.filtered:
        return True
    if alert.subject_kind == "pod" and alert.subject_uid in pod_uids:
        return True
    if not pod_uids.isdisjoint(_named_uids(alert)):
        return True  # a GPU alert naming a pod shown (a fault of the GPU it holds)
    if query.namespace is None and query.team is None:
        return False  # only --state: alerts of other subjects have no state
    return (query.namespace is None or alert.labels.get("namespace") == query.namespace) and (
        query.team is None or alert.labels.get(TEAM_LABEL) == query.team
    )


def _named_uids(alert: AlertRow) -> list[str]:
    """The pods a GPU alert names by uid (`pod_uid`, or `pod_uids` for several holders)."""
    labels = alert.labels
    if "pod_uid" in labels:
        return [labels["pod_uid"]]
    return [uid for uid in labels.get("pod_uids", "").split(",") if uid]


_FAULTS: dict[str, Callable[[AlertRow], str]] = {
    "GpuXidError": lambda a: f"Xid {a.labels.get('xid', '?')}",
    "GpuEccUncorrectable": lambda a: "ECC error",
    "GpuRowRemapFailure": lambda a: "row remap failed",
    "GpuThrottled": lambda a: "throttled",
}


def gpu_faults(snapshot: Snapshot) -> dict[str, list[str]]:
    """The GPU faults firing on each pod's GPUs, by pod uid (`Xid 79`, `throttled`...)."""
    out: dict[str, list[str]] = {}
    for alert in snapshot.alerts:
        what = _FAULTS.get(alert.name)
        if what is not None:
            for uid in _named_uids(alert):
                faults = out.setdefault(uid, [])
                if what(alert) not in faults:
                    faults.append(what(alert))
    return {uid: sorted(faults) for uid, faults in out.items()}


def blocks(snapshot: Snapshot) -> dict[str, AlertRow]:
    """The firing PodBlockedByFragmentation alert of each pod it names, by pod uid."""
    return {
        alert.subject_uid: alert
        for alert in snapshot.alerts
        if alert.name == BLOCKED_ALERT and alert.subject_kind == "pod" and alert.subject_uid
    }


def select(snapshot: Snapshot, query: Query) -> View:
    """Filter, sort and cut the snapshot's rows as the query says.

    With a filter of pods, the GPUs shown are those owned by a matching pod; `cluster`
    keeps the pods, GPUs and alerts of that cluster. `limit` cuts each
    table. GPUs go by node then uuid; alerts by severity, then oldest first.
    """
    pods = sorted((p for p in snapshot.pods if _pod_matches(p, query)), key=_pod_key(query.sort))
    uids = {p.uid for p in pods}
    gpus = sorted(
        (
            g
            for g in snapshot.gpus
            if (query.cluster is None or g.cluster == query.cluster)
            and (not query.filtered or uids.intersection(g.owners))
        ),
        key=lambda g: (g.cluster, g.node, g.uuid),
    )
    alerts = sorted(
        (a for a in snapshot.alerts if _alert_matches(a, query, uids)),
        key=lambda a: (_SEVERITY_ORDER.get(a.severity, 9), a.since, a.name, a.fingerprint),
    )
    n = query.limit
    return View(
        pods=tuple(pods[:n]),
        gpus=tuple(gpus[:n]),
        alerts=tuple(alerts[:n]),
        pods_matched=len(pods),
        gpus_matched=len(gpus),
        alerts_matched=len(alerts),
    )


# -- cell formats ------------------------------------------------------------------------------


def fmt_age(ms: int) -> str:
    """A duration in milliseconds as `42s`, `3m05s`, `2h07m`, `3d04h`; negative is 0s."""
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"


def _since(now_ms: int, since: int | None) -> str:
    return _NONE if since is None else fmt_age(now_ms - since)


def fmt_bytes(n: int | None) -> str:
    """Bytes in binary units with one decimal: `57.0Gi`, `512.0Mi`; `-` when unknown."""
    if n is None:
        return _NONE
    value = float(n)
    for unit in ("", "Ki", "Mi", "Gi"):
        if value < 1024:
            return f"{value:.0f}" if unit == "" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}Ti"


def fmt_pct(value: float | None) -> str:
    """A percentage 0..100 as `87%`; `-` when unknown."""
    return _NONE if value is None else f"{value:.0f}%"


def fmt_usd(usd: float) -> str:
    """Dollars: four decimals under $1 (a few minutes of a GPU), two from there on."""
    return f"{usd:.4f}" if abs(usd) < 1 else f"{usd:.2f}"


def fmt_per_unit(per_unit: Mapping[str, float | None]) -> str:
    """Cost per unit of work: `$0.000111/steps`; tokens per thousand (`$0.000741/1k
    tokens`), as serving is priced; `-` for a pod that reports none."""
    cells = []
    for unit, usd in sorted(per_unit.items()):
        if usd is None:
            cells.append(f"-/{unit}")
        elif "token" in unit:
            cells.append(f"${usd * 1000:.3g}/1k {unit}")
        else:
            cells.append(f"${usd:.3g}/{unit}")
    return " ".join(cells) or _NONE


def short_uuid(uuid: str) -> str:
    """`GPU-8f3c2a1e-5b7d-...` as `GPU-8f3c2a1e`, the form alert summaries use."""
    return uuid[:12]


def _gpus_cell(gpus: Sequence[str]) -> str:
    if not gpus:
        return "0"
    listed = ",".join(short_uuid(g) for g in gpus[:_GPUS_LISTED])
    more = f",+{len(gpus) - _GPUS_LISTED}" if len(gpus) > _GPUS_LISTED else ""
    return f"{len(gpus)} {listed}{more}"


def _vram_cell(used: int | None, total: int | None) -> str:
    if used is None:
        return _NONE
    return f"{fmt_bytes(used)}/{fmt_bytes(total)}"


def _owner_name(uid: str, names: Mapping[str, str]) -> str:
    return names.get(uid, uid[:8])


def _subject(alert: AlertRow, names: Mapping[str, str]) -> str:
    if alert.subject_kind == "pod" and alert.subject_uid:
        return f"pod {_owner_name(alert.subject_uid, names)}"
    if alert.subject_kind == "gpu" and alert.subject_uuid:
        node = f"@{alert.subject_node}" if alert.subject_node else ""
        return f"gpu {short_uuid(alert.subject_uuid)}{node}"
    if alert.subject_kind == "workload":
        parts = (alert.labels.get("namespace"), alert.labels.get("workload"))
        return f"workload {'/'.join(p for p in parts if p) or _NONE}"
    return f"{alert.subject_kind} {alert.subject_node or _NONE}"


# -- tables ------------------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Columns two spaces apart; the `right` columns right-aligned; no trailing blanks."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def clusters(snapshot: Snapshot) -> list[str]:
    """The clusters of the snapshot's pods, GPUs, alerts and capacity, in order."""
    rows: list[PodRow | GpuRow | AlertRow | CapacityRow | WorkloadRow] = [
        *snapshot.pods, *snapshot.gpus, *snapshot.alerts, *snapshot.capacity, *snapshot.workloads
    ]  # fmt: skip
    return sorted({row.cluster for row in rows})


def _with_cluster(
    shown: bool, headers: list[str], rows: list[list[str]], right: set[int], of: Sequence[Any]
) -> tuple[list[str], list[list[str]], set[int]]:
    """The table with a CLUSTER column first when the snapshot holds more than one."""
    if not shown:
        return headers, rows, right
    return (
        ["CLUSTER", *headers],
        [[row.cluster, *cells] for row, cells in zip(of, rows, strict=True)],
        {i + 1 for i in right},
    )


def _blocked(pod: PodRow, blocked: Mapping[str, AlertRow]) -> AlertRow | None:
    """The pod's fragmentation block, while it is queued (a block outliving the queue is
    about to resolve: not the pod's reason any more)."""
    return blocked.get(pod.uid) if pod.state == "queued" else None


def _reason_cell(
    pod: PodRow, faults: Mapping[str, list[str]], blocked: Mapping[str, AlertRow] = {}
) -> str:
    """The state's reason, a queued pod's fragmentation block (`blocked: wants 4, best node
    2, 6 free`) and the faults of the pod's GPUs (`GPU: Xid 79, throttled`)."""
    gpu, block = faults.get(pod.uid), _blocked(pod, blocked)
    parts = [pod.reason] if pod.reason else []
    parts += [blocked_text(block.labels)] if block else []
    parts += [f"GPU: {', '.join(gpu)}"] if gpu else []
    return "; ".join(parts) or _NONE


def _pods_table(
    view: View,
    now_ms: int,
    by_cluster: bool = False,
    faults: Mapping[str, list[str]] = {},
    blocked: Mapping[str, AlertRow] = {},
) -> list[str]:
    headers = ["POD", "TEAM", "STATE", "REASON", "FOR", "SHARE", "VRAM", "COST $", "WASTE $"]
    rows = [
        [
            p.name,
            p.team or _NONE,
            p.state,
            _reason_cell(p, faults, blocked),
            _since(now_ms, p.state_since),
            fmt_pct(None if p.share is None else p.share * 100),
            fmt_bytes(p.vram_bytes),
            fmt_usd(p.cost_usd),
            fmt_usd(p.waste_usd),
            _gpus_cell(p.gpus),
        ]
        for p in view.pods
    ]
    headers.append("GPUS")
    if any(p.cost_per_unit for p in view.pods):  # only where some pod reports units of work
        headers.append("$/UNIT")
        for row, p in zip(rows, view.pods, strict=True):
            row.append(fmt_per_unit(p.cost_per_unit))
    return _table(*_with_cluster(by_cluster, headers, rows, {4, 5, 6, 7, 8}, view.pods))


def _gpus_table(
    view: View, names: Mapping[str, str], now_ms: int, by_cluster: bool = False
) -> list[str]:
    headers = ["GPU", "NODE", "MODEL", "UTIL", "VRAM USED/TOTAL", "IDLE FOR", "SEEN", "OWNERS"]
    rows = [
        [
            short_uuid(g.uuid),
            g.node or _NONE,
            g.model or _NONE,
            fmt_pct(g.util_pct),
            _vram_cell(g.mem_used_bytes, g.mem_total_bytes),
            _since(now_ms, g.idle_since),
            _NONE if g.updated_at is None else f"{fmt_age(now_ms - g.updated_at)} ago",
            ",".join(_owner_name(uid, names) for uid in g.owners) or _NONE,
        ]
        for g in view.gpus
    ]
    return _table(*_with_cluster(by_cluster, headers, rows, {3, 4, 5, 6}, view.gpus))


def _alerts_table(
    view: View, names: Mapping[str, str], now_ms: int, by_cluster: bool = False
) -> list[str]:
    headers = ["ALERT", "SEVERITY", "SUBJECT", "FOR", "SUMMARY"]
    rows = [
        [a.name, a.severity, _subject(a, names), fmt_age(now_ms - a.since), a.summary]
        for a in view.alerts
    ]
    return _table(*_with_cluster(by_cluster, headers, rows, {3}, view.alerts))


def _kueue_rows(snapshot: Snapshot, query: Query) -> list[WorkloadRow]:
    """The workloads waiting in Kueue's queues, longest first, of the cluster, namespace
    and team asked for."""
    return [
        r
        for r in queued(snapshot.workloads)
        if query.cluster in (None, r.cluster)
        and query.namespace in (None, r.namespace)
        and query.team in (None, r.team)
    ]


def _kueue_lines(snapshot: Snapshot, query: Query, now_ms: int, by_cluster: bool) -> list[str]:
    """The QUEUED IN KUEUE section: a job Kueue holds has no pod to show it; none where
    nothing waits (and no Kueue)."""
    rows = _kueue_rows(snapshot, query)
    if not rows:
        return []
    headers = ["WORKLOAD", "QUEUE", "TEAM", "PODS", "GPUS", "REASON", "FOR", "OWNER"]
    cells = [
        [
            f"{r.namespace}/{r.name}",
            r.queue or _NONE,
            r.team or _NONE,
            str(r.pods),
            str(r.gpus),
            r.reason or _NONE,
            fmt_age(now_ms - r.since),
            r.owner or _NONE,
        ]
        for r in rows
    ]
    table = _table(*_with_cluster(by_cluster, headers, cells, {3, 4, 6}, rows))
    return [f"QUEUED IN KUEUE ({len(rows)})", *table, ""]


def _section(title: str, lines: list[str], shown: int, matched: int) -> list[str]:
    body = lines if shown else [*lines, "(none)"]
    more = [f"({matched - shown} more; raise --limit)"] if matched > shown else []
    return [f"{title} ({matched})", *body, *more]


def _capacity_rows(snapshot: Snapshot, query: Query) -> list[CapacityRow]:
    """The capacity rows of the cluster asked for (all without --cluster); the other
    filters narrow pods, not the fleet's capacity."""
    return [r for r in snapshot.capacity if query.cluster is None or r.cluster == query.cluster]


def _capacity_lines(snapshot: Snapshot, query: Query, by_cluster: bool) -> list[str]:
    """A capacity line per cluster with capacity records, named when there are several."""
    rows = _capacity_rows(snapshot, query)
    names = sorted({r.cluster for r in rows})
    return [
        capacity_line((r for r in rows if r.cluster == name), name if by_cluster else None)
        for name in names
    ]


def notes(snapshot: Snapshot, header: Header) -> list[str]:
    """Lines about what the tables leave out, and the hint when Redis holds nothing."""
    lines = []
    if snapshot.empty:
        lines.append(
            f"nothing written under {header.prefix!r} in {header.target} yet: "
            "is the worker running (`gpuwatch worker`)?"
        )
    cap = f"read at most {snapshot.max_rows} per refresh (--max-rows)"
    if snapshot.pods_left_out:
        lines.append(f"{snapshot.pods_left_out} pods left out: {cap}")
    if snapshot.gpus_left_out:
        lines.append(f"{snapshot.gpus_left_out} GPUs left out: {cap}")
    return lines


def render_text(snapshot: Snapshot, query: Query, header: Header, now_ms: int) -> str:
    """The plain-text tables: title, pods, GPUs, firing alerts and notes."""
    view = select(snapshot, query)
    seen = clusters(snapshot)
    by_cluster = len(seen) > 1
    at = datetime.fromtimestamp(now_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    counts = "  ".join(f"{s} {snapshot.state_counts.get(s, 0)}" for s in STATE_ORDER)
    filters = [f"--{k} {v}" for k, v in _filters(query).items() if v is not None]
    lines = [
        f"gpuwatch top  {header.target}  prefix {header.prefix}  {at}",
        f"pods: {counts}  |  gpus {snapshot.gpus_total}  |  alerts firing "
        f"{len(snapshot.alerts)}  |  sort {query.sort}" + "".join(f"  {f}" for f in filters),
        *([f"clusters: {' '.join(seen)}"] if by_cluster else []),
        *_capacity_lines(snapshot, query, by_cluster),
        "",
        *_kueue_lines(snapshot, query, now_ms, by_cluster),
        *_section(
            "PODS",
            _pods_table(view, now_ms, by_cluster, gpu_faults(snapshot), blocks(snapshot)),
            len(view.pods),
            view.pods_matched,
        ),
        "",
        *_section(
            "GPUS",
            _gpus_table(view, snapshot.pod_names, now_ms, by_cluster),
            len(view.gpus),
            view.gpus_matched,
        ),
        "",
        *_section(
            "ALERTS FIRING",
            _alerts_table(view, snapshot.pod_names, now_ms, by_cluster),
            len(view.alerts),
            view.alerts_matched,
        ),
    ]
    extra = notes(snapshot, header)
    if extra:
        lines += ["", *(f"note: {n}" for n in extra)]
    return "\n".join(lines) + "\n"


def _filters(query: Query) -> dict[str, str | None]:
    return {
        "cluster": query.cluster,
        "namespace": query.namespace,
        "team": query.team,
        "state": query.state,
    }


def render_json(snapshot: Snapshot, query: Query, header: Header, now_ms: int) -> str:
    """The same rows as one JSON object (times in epoch ms, money in USD, sizes in bytes)."""
    view = select(snapshot, query)
    names = snapshot.pod_names
    faults, blocked = gpu_faults(snapshot), blocks(snapshot)
    doc = {
        "at": now_ms,
        "redis": header.target,
        "prefix": header.prefix,
        "sort": query.sort,
        "filters": _filters(query),
        "limit": query.limit,
        "clusters": clusters(snapshot),
        "counts": {
            "states": {s: snapshot.state_counts.get(s, 0) for s in STATE_ORDER},
            "pods_matched": view.pods_matched,
            "pods_left_out": snapshot.pods_left_out,
            "gpus": snapshot.gpus_total,
            "gpus_matched": view.gpus_matched,
            "gpus_left_out": snapshot.gpus_left_out,
            "alerts_firing": len(snapshot.alerts),
            "alerts_matched": view.alerts_matched,
        },
        "pods": [
            {
                "uid": p.uid,
                "cluster": p.cluster,
                "namespace": p.namespace,
                "pod": p.pod,
                "team": p.team,
                "labels": dict(p.labels),
                "state": p.state,
                "reason": p.reason or None,
                "gpu_faults": faults.get(p.uid, []),
                "blocked": _blocked_json(_blocked(p, blocked)),
                "state_since": p.state_since,
                "state_for_s": _seconds(now_ms, p.state_since),
                "node": p.node or None,
                "gpus": list(p.gpus),
                "share": p.share,
                "vram_bytes": p.vram_bytes,
                "cost_usd": p.cost_usd,
                "waste_usd": p.waste_usd,
                "cost_per_unit": dict(p.cost_per_unit),
            }
            for p in view.pods
        ],
        "gpus": [
            {
                "uuid": g.uuid,
                "cluster": g.cluster,
                "node": g.node or None,
                "model": g.model or None,
                "util_pct": g.util_pct,
                "mem_used_bytes": g.mem_used_bytes,
                "mem_total_bytes": g.mem_total_bytes,
                "owners": [{"uid": u, "name": names.get(u)} for u in g.owners],
                "idle_since": g.idle_since,
                "idle_for_s": _seconds(now_ms, g.idle_since),
                "updated_at": g.updated_at,
            }
            for g in view.gpus
        ],
        "alerts": [
            {
                "fingerprint": a.fingerprint,
                "cluster": a.cluster,
                "name": a.name,
                "severity": a.severity,
                "since": a.since,
                "firing_for_s": _seconds(now_ms, a.since),
                "subject": {
                    "kind": a.subject_kind,
                    "uid": a.subject_uid,
                    "uuid": a.subject_uuid,
                    "node": a.subject_node,
                    "name": _subject(a, names),
                },
                "summary": a.summary,
                "labels": dict(a.labels),
                "value": a.value,
            }
            for a in view.alerts
        ],
        "capacity": [
            capacity_json(r)
            for r in sorted(
                _capacity_rows(snapshot, query), key=lambda r: (r.cluster, r.model, r.resource)
            )
        ],
        "kueue_queued": [workload_json(r, now_ms) for r in _kueue_rows(snapshot, query)],
        "notes": notes(snapshot, header),
    }
    return json.dumps(doc, sort_keys=False) + "\n"


def _blocked_json(alert: AlertRow | None) -> dict[str, Any] | None:
    """A queued pod's fragmentation block for `--json`: its alert's figures, numbers as
    numbers; None when the pod is not blocked."""
    if alert is None:
        return None
    labels = alert.labels
    numbers = {k: _int_or_none(labels.get(k)) for k in ("wanted", "best_free", "fleet_free")}
    return {
        "resource": labels.get("resource"),
        "models": labels.get("models"),
        "best_node": labels.get("best_node"),
        **numbers,
        "since": alert.since,
        "summary": alert.summary,
    }


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _seconds(now_ms: int, since: int | None) -> float | None:
    """Seconds from `since` to now, clamped at 0 (clocks go backwards); None when unknown."""
    return None if since is None else max(0, now_ms - since) / 1000


def fit_screen(text: str, columns: int, rows: int) -> str:
    """`text` cut to a terminal: lines to `columns`, and to `rows` with a last line that says
    how many were cut (so a redraw never scrolls)."""
    lines = [line[:columns] for line in text.rstrip("\n").split("\n")]
    if len(lines) >= rows:
        cut = len(lines) - (rows - 2)
        lines = [*lines[: max(0, rows - 2)], f"... {cut} more lines: use --limit"[:columns]]
    return "\n".join(lines) + "\n"
