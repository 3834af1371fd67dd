"""`gpuwatch top`'s Kueue section: the workloads waiting in Kueue's queues, from the
`workloads` hash the Redis sink keeps (the latest `k8s.workloads` record of each).

A job Kueue holds has no pods yet, so the pods table cannot show it; this section does:
which queue, how many pods and GPUs it wants, why it waits (in Kueue's words: the
reasons of `streams.core.workload.workloads`) and since when.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from schemas.fields import DEFAULT_CLUSTER
from schemas.k8s_workload import K8sWorkload
from streams.core.workload.workloads import standing

__all__ = ["WorkloadRow", "parse_workload", "queued", "workload_json"]

TEAM_LABEL = "team"
_DECODER = msgspec.json.Decoder(K8sWorkload)


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    """One Kueue workload where it stands now."""

    uid: str
    namespace: str
    name: str
    queue: str | None
    cluster_queue: str | None
    pods: int
    gpus: int
    state: str
    reason: str | None
    message: str | None
    since: int
    """When it began to wait: created, or evicted since."""
    team: str | None
    owner: str | None
    cluster: str = DEFAULT_CLUSTER


def parse_workload(raw: str) -> WorkloadRow | None:
    """A row from the hash's JSON; None for a value that is not a workload record."""
    try:
        value = _DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    state, reason, message = standing(value)
    evicted = [c.at for c in value.conditions if c.type == "Evicted" and c.status == "True"]
    since = max([value.created_at, *(at for at in evicted if at is not None)])
    owner = f"{value.owner.kind}/{value.owner.name}" if value.owner else None
    return WorkloadRow(
        uid=value.uid,
        namespace=value.namespace,
        name=value.name,
        queue=value.queue,
        cluster_queue=value.cluster_queue,
        pods=value.pods,
        gpus=sum(value.gpu_request.values()),
        state=state,
        reason=reason,
        message=message,
        since=since,
        team=value.labels.get(TEAM_LABEL),
        owner=owner,
        cluster=value.cluster,
    )


def queued(rows: Iterable[WorkloadRow]) -> list[WorkloadRow]:
    """The workloads waiting, longest first."""
    return sorted((r for r in rows if r.state == "queued"), key=lambda r: (r.since, r.name))


def workload_json(row: WorkloadRow, now_ms: int) -> dict[str, Any]:
    """A row for `top --json`."""
    return {
        "uid": row.uid,
        "cluster": row.cluster,
        "namespace": row.namespace,
        "name": row.name,
        "queue": row.queue,
        "cluster_queue": row.cluster_queue,
        "team": row.team,
        "owner": row.owner,
        "pods": row.pods,
        "gpus": row.gpus,
        "state": row.state,
        "reason": row.reason,
        "message": row.message,
        "since": row.since,
        "for_s": max(0, now_ms - row.since) / 1000,
    }
