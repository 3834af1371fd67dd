"""The fleet's capacity in `gpuwatch top`: the `capacity` hash's records as rows, the
capacity line of each cluster, and what a fragmentation block adds to a queued pod's reason.

Pure, as view.py: the records are parsed from the JSON the Redis sink stores (the capacity
topic's records, sinks/SINKS-redis.md) and formatted here; reading the hash is live.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.fields import DEFAULT_CLUSTER

__all__ = [
    "BLOCKED_ALERT",
    "CapacityRow",
    "blocked_text",
    "capacity_json",
    "capacity_line",
    "parse_capacity",
]

BLOCKED_ALERT: Final = "PodBlockedByFragmentation"
DEFAULT_RESOURCE: Final = "nvidia.com/gpu"  # whole GPUs: the resource a model goes by alone
_PARTS: Final = " · "  # between the figures of one model
_ENTRIES: Final = "  |  "  # between models, as the header's counts are set apart


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """One (cluster, model, resource)'s latest capacity record: the picture as of `ts`."""

    model: str
    resource: str
    ts: int = 0
    free: int = 0
    stranded: int = 0
    reclaimable: int = 0
    queued: int = 0
    blocked: int = 0
    free_by_node: Mapping[str, int] = field(default_factory=dict)
    reclaimable_gpus: tuple[Mapping[str, Any], ...] = ()
    cluster: str = DEFAULT_CLUSTER

    @property
    def shown(self) -> bool:
        """Whether the line names it: something free, stranded, reclaimable or blocked."""
        return any((self.free, self.stranded, self.reclaimable, self.blocked))


def _count(doc: Mapping[str, Any], name: str) -> int:
    value = doc.get(name)
    return value if isinstance(value, int) and value >= 0 else 0


def parse_capacity(raw: str) -> CapacityRow | None:
    """One `capacity` hash value (a capacity record's JSON) as a row; None if unreadable."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not doc.get("model") or not doc.get("resource"):
        return None
    nodes = doc.get("free_by_node")
    gpus = doc.get("reclaimable_gpus")
    return CapacityRow(
        model=str(doc["model"]),
        resource=str(doc["resource"]),
        ts=_count(doc, "ts"),
        free=_count(doc, "free"),
        stranded=_count(doc, "stranded"),
        reclaimable=_count(doc, "reclaimable"),
        queued=_count(doc, "queued"),
        blocked=_count(doc, "blocked"),
        free_by_node=(
            {str(n): c for n, c in nodes.items() if isinstance(c, int)}
            if isinstance(nodes, dict)
            else {}
        ),
        reclaimable_gpus=tuple(g for g in gpus if isinstance(g, dict))
        if isinstance(gpus, list)
        else (),
        cluster=str(doc.get("cluster") or DEFAULT_CLUSTER),
    )


def _entry(row: CapacityRow) -> str:
    """`NVIDIA H100 80GB HBM3 free 6 (stranded 6) · reclaimable 1 · blocked 1`; a resource
    other than whole GPUs is named after the model (a MIG profile)."""
    name = row.model if row.resource == DEFAULT_RESOURCE else f"{row.model} {row.resource}"
    head = f"{name} free {row.free}" + (f" (stranded {row.stranded})" if row.stranded else "")
    parts = [head]
    parts += [f"reclaimable {row.reclaimable}"] if row.reclaimable else []
    parts += [f"blocked {row.blocked}"] if row.blocked else []
    return _PARTS.join(parts)


def capacity_line(rows: Iterable[CapacityRow], cluster: str | None = None) -> str:
    """The capacity line of one cluster's rows (`cluster` names it when given): one entry
    per model and resource with something to say, by model; `none free` when none has."""
    entries = [_entry(r) for r in sorted(rows, key=lambda r: (r.model, r.resource)) if r.shown]
    title = "capacity" if cluster is None else f"capacity {cluster}"
    return f"{title}: {_ENTRIES.join(entries) or 'none free'}"


def blocked_text(labels: Mapping[str, str]) -> str:
    """A PodBlockedByFragmentation alert's labels as a reason: `blocked: wants 4, best node
    2, 6 free` (devices asked, free on the best node, free over every node it could use)."""
    wanted, best, fleet = (labels.get(k, "?") for k in ("wanted", "best_free", "fleet_free"))
    return f"blocked: wants {wanted}, best node {best}, {fleet} free"


def capacity_json(row: CapacityRow) -> dict[str, Any]:
    """A row as `--json` shows it: the record's fields, times in epoch ms."""
    return {
        "cluster": row.cluster,
        "model": row.model,
        "resource": row.resource,
        "ts": row.ts,
        "free": row.free,
        "stranded": row.stranded,
        "reclaimable": row.reclaimable,
        "queued": row.queued,
        "blocked": row.blocked,
        "free_by_node": dict(row.free_by_node),
        "reclaimable_gpus": [dict(g) for g in row.reclaimable_gpus],
    }
