"""`gpuwatch top --json`: the rows of the view as one JSON object.

Pure, like the text tables: the same selection (`gpuwatch/top/view.py`), with raw figures
(times in epoch ms, money in USD, sizes in bytes) where the tables round.
"""

from __future__ import annotations

import json
from typing import Any

from gpuwatch.top.capacity import capacity_json
from gpuwatch.top.cells import subject
from gpuwatch.top.view import (
    STATE_ORDER,
    AlertRow,
    Header,
    Query,
    Snapshot,
    blocks,
    capacity_rows,
    clusters,
    filters,
    gpu_faults,
    kueue_rows,
    notes,
    queued_block,
    select,
)
from gpuwatch.top.workloads import workload_json

__all__ = ["render_json"]


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
        "filters": filters(query),
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
                "blocked": _blocked_json(queued_block(p, blocked)),
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
                    "name": subject(a, names),
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
                capacity_rows(snapshot, query), key=lambda r: (r.cluster, r.model, r.resource)
            )
        ],
        "kueue_queued": [workload_json(r, now_ms) for r in kueue_rows(snapshot, query)],
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
