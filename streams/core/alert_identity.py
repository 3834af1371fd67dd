"""What identifies an in-stream alert: its fingerprint, and the cluster in its labels and summary.

Every alert rule (pod, GPU and node, GPU health, fleet, Kueue workload) builds its
messages' identity here, so that the firing and the resolved message of one alert, and the
messages a restarted worker shows again, share one fingerprint. Downstream deduplication
(the `alerts` topic's key, the Redis firing hash, alert routing) relies on the values never
changing: tests/unit/streams/test_alert_identity.py pins them.

An alert of a named cluster carries the cluster in its labels, names it in its summary and
has a fingerprint of its own; those of the default cluster are as before clusters existed.
"""

from __future__ import annotations

import hashlib

from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import AlertFingerprint

__all__ = ["fingerprint", "in_cluster", "with_cluster"]

_FINGERPRINT_HEX = 16  # 64 bits: no collision among millions of live alerts


def fingerprint(name: str, kind: str, id_: str, cluster: str = DEFAULT_CLUSTER) -> AlertFingerprint:
    """An alert's stable id: sha1 of `name|kind|id` (UTF-8), the first 16 hex digits.

    `kind` is the subject kind (pod, gpu, node, workload) and `id_` its id (pod uid, GPU
    uuid, node name, workload uid; a leak's `uuid/pod_uid`, a GPU fault's `uuid[/code]`),
    so the firing and the resolved message of one alert share it. In a named cluster the
    id is `cluster/id`: node names repeat across clusters (and neither contains `/`), so
    `gpu-node-1` of two clusters is two alerts.
    """
    if cluster != DEFAULT_CLUSTER:
        id_ = f"{cluster}/{id_}"
    digest = hashlib.sha1(f"{name}|{kind}|{id_}".encode(), usedforsecurity=False)
    return AlertFingerprint(digest.hexdigest()[:_FINGERPRINT_HEX])


def with_cluster(labels: dict[str, str], cluster: str) -> dict[str, str]:
    """`labels` with `cluster` added where it is a named one (in place: the labels' order
    is the order they are sent in)."""
    if cluster != DEFAULT_CLUSTER:
        labels["cluster"] = cluster
    return labels


def in_cluster(summary: str, cluster: str) -> str:
    """An alert's summary, naming the cluster where it is a named one."""
    return summary if cluster == DEFAULT_CLUSTER else f"[cluster {cluster}] {summary}"
