"""The stream's firing alerts as series: `gpuwatch_alert_firing` and its `_since_seconds`.

The shipped rules (deploy/prometheus/gpuwatch-rules.yml) read these series with no `for`,
so an alert the worker fired is in Prometheus' `ALERTS` one scrape and one rule evaluation
later. An alert's series appear with its firing message and go with its resolved one.

Labels are fixed: `ALERT_LABELS`, values cleaned; absent ones are empty (Prometheus reads
an empty label as none). `cluster` is the alert's own (`default` when it names none), so
node alerts of two clusters with one node name are two series. `alertname` is the alert's
name, so the rule of the same name that reads it (and sets `alertname` on its alerts)
keeps it. A GPU alert (GpuIdleAllocated, the health alerts) of a GPU shared by several
pods (its `pods` label, `ns/pod,...`, and `pod_uids` in the same order where the alert has
it) has one series per pod, with that pod's uid, as the metric-threshold rule had one alert
per holder: each routes by its own namespace. `xid` (GpuXidError: an alert per GPU and
code, two codes on one GPU are two alerts), `reasons` (GpuThrottled) and the holders' workload
owner (`owner`, from the alert's `owner` or its entry of `owners`) pass through.

Order per alert (fingerprint): a message counts when its (ts, status) is later than the
last one counted, a resolved message after a firing one of the same ts (as the Redis
firing set orders them); so a replayed firing message does not revive a resolved alert
(resolutions are remembered for the latest `max_series` alerts), and a later firing
message (a refresh) replaces the series. `forget` drops an alert with its order, so the
firing message observed again afterwards shows it again.

Restarts and moves: the stream sends a firing message once and does not refresh it
(streams/SEMANTICS-alerts.md), and these series live in the process. The worker that
gives a partition up forgets its alerts; the worker that loads the partition's state
(after a restart, or taking it over) is handed the alerts that state says are firing,
rebuilt with the sent messages' `ts`, and shows them again. In between (from the revoke
until the partition's first message on the new owner) they are absent; the shipped rules
keep them firing over that gap (`keep_firing_for`) without the exporting worker's label.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from schemas.alert import Alert
from sinks.prometheus.collector import ALERT_LABELS, clean, label_text

__all__ = ["AlertRow", "FiringAlerts", "NodeRef", "NodeSet"]

AlertRow = tuple[Sequence[str], str, float]
"""label values, their exposition text, when the condition began (epoch seconds)."""

NodeRef = str | tuple[str, str]
"""A node as `(cluster, node)`, or a bare node name: that name in every cluster."""


class NodeSet:
    """Nodes given as `NodeRef`s; holds `(cluster, node)` when either form names it."""

    def __init__(self, nodes: Iterable[NodeRef] = ()) -> None:
        self._pairs: set[tuple[str, str]] = set()
        self._names: set[str] = set()
        for node in nodes:
            if isinstance(node, str):
                self._names.add(node)
            else:
                self._pairs.add(node)

    def __bool__(self) -> bool:
        return bool(self._pairs or self._names)

    def __contains__(self, node: object) -> bool:
        if not isinstance(node, tuple) or len(node) != 2:
            return False
        return node in self._pairs or node[1] in self._names


@dataclass(frozen=True, slots=True)
class _Firing:
    """One firing alert: its order mark, what `forget` matches, its rows."""

    mark: int
    pod: str | None  # the subject pod's uid (pod alerts)
    node: tuple[str, str] | None  # the subject's (cluster, node) (GPU and node alerts)
    gpu: str | None  # the subject GPU's uuid (GPU alerts)
    rows: tuple[AlertRow, ...]


def _mark(alert: Alert) -> int:
    """The message's place in its alert's history: by ts, resolved after firing at one ts."""
    return alert.ts * 2 + (alert.status == "resolved")


def _holders(
    labels: dict[str, str], uid: str | None
) -> list[tuple[str, str, str | None, str | None]]:
    """(namespace, pod, uid, owner) per series: the alert's own, or one per entry of `pods`,
    with its uid and owner where `pod_uids` and `owners` name one per pod (the GPU health
    alerts)."""
    if "pods" in labels and "pod" not in labels:
        named = [entry.partition("/") for entry in labels["pods"].split(",") if entry]
        uids: list[str | None] = [u for u in labels.get("pod_uids", "").split(",") if u]
        if len(uids) != len(named):
            uids = [uid] * len(named)
        owners: list[str | None] = [o or None for o in labels.get("owners", "").split(",")]
        if len(owners) != len(named):
            owners = [None] * len(named)
        rows = zip(named, uids, owners, strict=True)
        found = [(ns, pod, u, o) if pod else ("", ns, u, o) for (ns, _, pod), u, o in rows]
        return found or [("", "", uid, None)]
    return [(labels.get("namespace", ""), labels.get("pod", ""), uid, labels.get("owner"))]


def _rows(alert: Alert) -> tuple[AlertRow, ...]:
    labels, subject = dict(alert.labels), alert.subject
    node = labels.get("node") or subject.node
    gpu = labels.get("gpu") or subject.uuid
    since = alert.since / 1000
    rows = []
    for namespace, pod, uid, owner in _holders(labels, labels.get("pod_uid") or subject.uid):
        values = tuple(
            clean(v)
            for v in (alert.name, alert.severity, namespace, pod, labels.get("team"), node, gpu,
                      labels.get("model"), uid, labels.get("xid"), labels.get("reasons"),
                      alert.cluster, owner, labels.get("workload"), labels.get("queue"))
        )  # fmt: skip
        rows.append((values, label_text(ALERT_LABELS, values), since))
    return tuple(rows)


class FiringAlerts:
    """The firing alerts of one worker, at most `max_series` series; not thread-safe."""

    def __init__(self, max_series: int) -> None:
        self._max = max_series
        self._firing: dict[str, _Firing] = {}
        self._resolved: OrderedDict[str, int] = OrderedDict()  # fingerprint -> mark
        self._series = 0

    def __len__(self) -> int:
        """The number of series."""
        return self._series

    def observe(self, alert: Alert) -> int:
        """Apply a firing or resolved message; the number of series refused by the cap."""
        key, mark = alert.fingerprint, _mark(alert)
        old = self._firing.get(key)
        last = old.mark if old is not None else self._resolved.get(key)
        if last is not None and mark <= last:
            return 0  # a replay, or older than what is shown
        if old is not None:
            del self._firing[key]
            self._series -= len(old.rows)
        if alert.status == "resolved":
            self._resolved[key] = mark
            self._resolved.move_to_end(key)
            if len(self._resolved) > self._max:
                self._resolved.popitem(last=False)
            return 0
        self._resolved.pop(key, None)
        rows = _rows(alert)
        if self._series + len(rows) > self._max:
            return len(rows)
        subject = alert.subject
        pod = subject.uid if subject.kind == "pod" else None
        node = (
            (alert.cluster, subject.node)
            if subject.kind != "pod" and subject.node is not None
            else None
        )
        self._firing[key] = _Firing(mark, pod, node, subject.uuid, rows)
        self._series += len(rows)
        return 0

    def forget(
        self, pods: Iterable[str], gpus: Iterable[str], nodes: Iterable[NodeRef] | NodeSet
    ) -> None:
        """Drop the alerts of pods (uids), and of GPUs (uuids) and nodes, of revoked partitions.

        A pod alert belongs to the pod's partition, a GPU or node alert to the node's: a
        revoked node takes its GPU and node alerts, not the alerts of the pods on it.
        """
        pod_set, gpu_set = set(pods), set(gpus)
        node_set = nodes if isinstance(nodes, NodeSet) else NodeSet(nodes)
        gone = [
            key
            for key, a in self._firing.items()
            if a.pod in pod_set or a.node in node_set or (a.pod is None and a.gpu in gpu_set)
        ]
        for key in gone:
            self._series -= len(self._firing.pop(key).rows)

    def rows(self) -> list[AlertRow]:
        """Every series, alert by alert in the order they fired."""
        return [row for firing in self._firing.values() for row in firing.rows]
