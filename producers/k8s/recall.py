"""What consumers last saw of the watched objects, read back from the watcher's own topics.

A watcher keeps what it published in memory only (it runs without a volume), so a
restarted one would know nothing of the pods (nodes, Kueue workloads) it had published: one
deleted while it was down (or whose DELETED never reached Kafka) would stay live downstream
for ever. Before
its first list, each watch is seeded with the newest value Kafka holds of every key whose
newest value is not a DELETED; the first list is then a relist against it
(`resync.relist`): a key Kafka shows live that the list lacks goes out as DELETED with
`final_state_unknown` (client-go's DeletedFinalStateUnknown), at the list's time; one whose
value differs from Kafka's gets the listed state, as after a 410.

`Recall` reads a topic once for every watch that publishes to it (one per namespace) and
hands each its own objects: those of its cluster (topics may be shared by clusters) that
`belongs` to it (its namespace). How far back the topic is read is the reader's business
(gpuwatch.run.readback: bounded by the periodic full resync).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.k8s_workload import K8sWorkload

__all__ = ["Recall", "RecallFailed", "newest_live"]

log = logging.getLogger(__name__)

V = TypeVar("V", K8sPod, K8sNode, K8sWorkload)


class RecallFailed(Exception):  # noqa: N818 - a condition to retry, not an error
    """The topic could not be read back (Kafka away); the watch tries again after a backoff."""


def newest_live(values: Iterable[V], key: Callable[[V], str]) -> dict[str, V]:
    """The newest value of each key (`values` in the topic's order per key), for the keys
    whose newest value is not a DELETED."""
    newest: dict[str, V] = {}
    for value in values:
        newest[key(value)] = value
    return {k: v for k, v in newest.items() if v.type != "DELETED"}


class Recall(Generic[V]):
    """One read-back of a topic, done on first use and shared by the watches of the topic.

    `read` returns the topic's values (raising `RecallFailed` when it cannot); a failed
    read is tried again by the next caller.
    """

    def __init__(
        self, read: Callable[[], Iterable[V]], key: Callable[[V], str], cluster: str
    ) -> None:
        self._read: Callable[[], Iterable[V]] = read
        self._key: Callable[[V], str] = key
        self._cluster = cluster
        self._lock = threading.Lock()
        self._live: dict[str, V] | None = None

    def of(self, belongs: Callable[[V], bool]) -> dict[str, V]:
        """The live objects of this cluster that `belongs` to the caller, by key."""
        with self._lock:
            if self._live is None:
                ours = (v for v in self._read() if v.cluster == self._cluster)
                self._live = newest_live(ours, self._key)
            live = self._live
        return {k: v for k, v in live.items() if belongs(v)}
