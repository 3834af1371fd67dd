"""What a restarted watcher takes from the topics: each key's newest value unless DELETED,
its own cluster's, the part each watch asks for, read once."""

from __future__ import annotations

import msgspec
import pytest

from gpuwatch.harness.examples import example
from producers.k8s.recall import Recall, RecallFailed, newest_live
from schemas import K8sPod

BASE = msgspec.convert(example("gpuwatch.k8s.pod/v1"), K8sPod)


def pod(uid: str, type_: str = "MODIFIED", **changes: object) -> K8sPod:
    return msgspec.structs.replace(BASE, uid=uid, type=type_, **changes)


def test_the_newest_value_of_each_key_counts_and_a_deleted_key_is_not_live() -> None:
    values = [
        pod("a", "ADDED", phase="Pending"),
        pod("b", "ADDED"),
        pod("a", "MODIFIED", phase="Running"),
        pod("b", "DELETED"),
        pod("c", "DELETED"),
        pod("c", "RESYNC", phase="Running"),  # re-created under the same key (a replay)
    ]
    live = newest_live(values, lambda v: v.uid)
    assert {k: (v.type, v.phase) for k, v in live.items()} == {
        "a": ("MODIFIED", "Running"),
        "c": ("RESYNC", "Running"),
    }


def test_one_read_shared_by_the_watches_each_taking_its_own_of_its_cluster() -> None:
    reads: list[int] = []

    def read() -> list[K8sPod]:
        reads.append(1)
        return [
            pod("a", namespace="ml"),
            pod("b", namespace="web"),
            pod("x", namespace="ml", cluster="other"),
        ]

    recall: Recall[K8sPod] = Recall(read, lambda v: v.uid, "default")
    assert set(recall.of(lambda v: v.namespace == "ml")) == {"a"}
    assert set(recall.of(lambda v: v.namespace == "web")) == {"b"}
    assert set(recall.of(lambda _: True)) == {"a", "b"}
    assert len(reads) == 1


def test_a_failed_read_is_tried_again_by_the_next_caller() -> None:
    outcomes: list[list[K8sPod] | None] = [None, [pod("a")]]

    def read() -> list[K8sPod]:
        outcome = outcomes.pop(0)
        if outcome is None:
            raise RecallFailed("no broker")
        return outcome

    recall: Recall[K8sPod] = Recall(read, lambda v: v.uid, "default")
    with pytest.raises(RecallFailed):
        recall.of(lambda _: True)
    assert set(recall.of(lambda _: True)) == {"a"}
