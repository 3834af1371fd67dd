"""What `gpuwatch top` shows: rows, filtering, sorting and what the tables leave out.

Pure: plain rows in, the rows to show out. Reading the rows from Redis is
`gpuwatch/top/live.py`; the tables are `gpuwatch/top/text.py` (cells written by
`gpuwatch/top/cells.py`), the JSON `gpuwatch/top/as_json.py`; keeping them apart lets every
column be tested on hand-made rows. The capacity line and a blocked pod's reason are
formatted by `gpuwatch/top/capacity.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpuwatch.top.capacity import BLOCKED_ALERT, CapacityRow
from gpuwatch.top.workloads import WorkloadRow, queued
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
    "capacity_rows",
    "clusters",
    "filters",
    "gpu_faults",
    "kueue_rows",
    "notes",
    "queued_block",
    "select",
]

Sort = Literal["waste", "vram", "cost", "share", "state", "name"]
SORTS: Final[tuple[Sort, ...]] = ("waste", "vram", "cost", "share", "state", "name")

STATE_ORDER: Final[Mapping[str, int]] = {"stalled": 0, "queued": 1, "running": 2, "finished": 3}
"""`--sort state`: the states that want attention first, finished last."""

TEAM_LABEL: Final = "team"  # the one pod label shown, as in the Prometheus metrics
_SEVERITY_ORDER: Final[Mapping[str, int]] = {"critical": 0, "warning": 1, "info": 2}


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


def clusters(snapshot: Snapshot) -> list[str]:
    """The clusters of the snapshot's pods, GPUs, alerts and capacity, in order."""
    rows: list[PodRow | GpuRow | AlertRow | CapacityRow | WorkloadRow] = [
        *snapshot.pods, *snapshot.gpus, *snapshot.alerts, *snapshot.capacity, *snapshot.workloads
    ]  # fmt: skip
    return sorted({row.cluster for row in rows})


def queued_block(pod: PodRow, blocked: Mapping[str, AlertRow]) -> AlertRow | None:
    """The pod's fragmentation block, while it is queued (a block outliving the queue is
    about to resolve: not the pod's reason any more)."""
    return blocked.get(pod.uid) if pod.state == "queued" else None


def kueue_rows(snapshot: Snapshot, query: Query) -> list[WorkloadRow]:
    """The workloads waiting in Kueue's queues, longest first, of the cluster, namespace
    and team asked for."""
    return [
        r
        for r in queued(snapshot.workloads)
        if query.cluster in (None, r.cluster)
        and query.namespace in (None, r.namespace)
        and query.team in (None, r.team)
    ]


def capacity_rows(snapshot: Snapshot, query: Query) -> list[CapacityRow]:
    """The capacity rows of the cluster asked for (all without --cluster); the other
    filters narrow pods, not the fleet's capacity."""
    return [r for r in snapshot.capacity if query.cluster is None or r.cluster == query.cluster]


def filters(query: Query) -> dict[str, str | None]:
    """The filters of the query by flag name (None: not given)."""
    return {
        "cluster": query.cluster,
        "namespace": query.namespace,
        "team": query.team,
        "state": query.state,
    }


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
