"""A restarted watcher's Kueue workload watches: each namespace's is seeded with the
workloads Kafka holds live of its cluster and namespace, so its first list publishes one
deleted meanwhile as DELETED `final_state_unknown` (its last state, at the list's time)
and re-sends the live ones; a relist that finds one gone says the same."""

from __future__ import annotations

import json

import msgspec
import pytest

from gpuwatch.harness.examples import example
from gpuwatch.harness.simulate.kube import kueue as k
from producers.base.kubeapi import Collection, WatchLines
from producers.k8s.recall import Recall
from producers.k8s.resync import Published, relist
from producers.k8s.watcher import K8sWatcher
from producers.k8s.workloads import KUEUE_GROUP
from schemas import K8sWorkload
from schemas.settings import WatcherSettings

NOW_MS = 1_764_412_345_000
CREATED_S = NOW_MS / 1000 - 3600
BASE = msgspec.convert(example("gpuwatch.k8s.workload/v1"), K8sWorkload)
KEPT_UID = "0b8f2a4e-6d1c-4e3a-9f5b-7c2d1e0a9b8c"


def recorded(uid: str, namespace: str = "ml", **changes: object) -> K8sWorkload:
    """A workload value as Kafka holds it (the watcher wrote it before its restart)."""
    fields: dict[str, object] = {"type": "RESYNC", "ts": NOW_MS - 600_000, **changes}
    return msgspec.structs.replace(BASE, uid=uid, namespace=namespace, name=f"w-{uid}", **fields)


class KueueApi:
    """Serves Kueue; lists one workload in `ml` (KEPT_UID), no pods, no nodes; the test
    never watches."""

    def list(self, collection: Collection, *, limit: int, continue_token: str | None) -> bytes:
        items = []
        if collection.resource == "workloads" and collection.namespace == "ml":
            kept = k.workload(
                "job-kept", "ml", created=CREATED_S, queue="research",
                job=("kept", "5a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"), pods=1,
                gpus_per_pod={"nvidia.com/gpu": 8},
            )  # fmt: skip
            kept["metadata"].update(uid=KEPT_UID, resourceVersion="41")
            items.append(kept)
        body = {"kind": "List", "metadata": {"resourceVersion": "50"}, "items": items}
        return json.dumps(body).encode()

    def watch(self, collection: Collection, *, resource_version: str, timeout_s: int) -> WatchLines:
        raise AssertionError("only the first lists are taken")

    def get_controller(self, kind: str, namespace: str, name: str) -> bytes | None:
        return None

    def get_object(self, api: str, resource: str, namespace: str, name: str) -> bytes | None:
        return None

    def served_versions(self, group: str) -> tuple[str, ...] | None:
        return ("v1beta2", "v1beta1") if group == KUEUE_GROUP else None


def test_a_workload_deleted_while_the_watcher_was_down_is_published_deleted_unseen() -> None:
    gone = recorded(
        "gone", cluster_queue="research-cq", admitted_at=NOW_MS - 900_000, type="MODIFIED"
    )
    in_kafka = [
        recorded(KEPT_UID),
        recorded("gone", type="ADDED"),
        gone,  # its newest value: admitted
        recorded("deleted-before", type="ADDED"),
        recorded("deleted-before", type="DELETED"),  # its DELETED was seen: not again
        recorded("elsewhere", namespace="web"),  # not a watched namespace
        recorded("theirs", cluster="eu-west"),  # another cluster's, on a shared topic
    ]
    reads: list[int] = []

    def read() -> list[K8sWorkload]:
        reads.append(1)
        return in_kafka

    published: list[K8sWorkload] = []
    watcher = K8sWatcher(
        KueueApi(),
        WatcherSettings(namespaces=("ml", "team-b")),
        emit_pod=lambda _: None,
        emit_node=lambda _: None,
        emit_workload=published.append,
        now_ms=lambda: NOW_MS,
        resolve_owners=False,
        recall_workloads=Recall(read, lambda v: v.uid, "default"),
    )
    assert watcher.kueue is not None
    workload_watches = watcher.kueue.look()
    assert workload_watches is not None
    for watch in workload_watches:
        assert watch.step()  # the read-back, then the first list

    assert [(v.uid, v.type, v.final_state_unknown) for v in published] == [
        (KEPT_UID, "RESYNC", False),
        ("gone", "DELETED", True),
    ]
    (deleted,) = [v for v in published if v.type == "DELETED"]
    # The last state Kafka held, at the list's time.
    assert deleted == msgspec.structs.replace(
        gone, type="DELETED", ts=NOW_MS, final_state_unknown=True
    )
    assert len(reads) == 1  # one read for both namespaces' watches
    recalled = {str(w.collection): w.stats.recalled for w in workload_watches}
    assert recalled == {"workloads/ml": 2, "workloads/team-b": 0}


@pytest.mark.parametrize("type_", ["ADDED", "MODIFIED", "RESYNC"])
def test_a_relist_that_finds_a_workload_gone_marks_its_deletion_unseen(type_: str) -> None:
    # A 410's relist, or a first one against what Kafka held: how it ended was not seen.
    last = recorded("gone", type=type_)
    out = relist({"gone": Published("7", last, frozenset())}, [], NOW_MS)
    assert out.messages == [
        msgspec.structs.replace(last, type="DELETED", ts=NOW_MS, final_state_unknown=True)
    ]
    assert out.published == {}
