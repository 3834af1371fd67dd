"""`gpuwatch top` where many clusters feed one pipeline: told apart, and one filtered."""

from __future__ import annotations

import json

from gpuwatch.top.as_json import (
    render_json,
)
from gpuwatch.top.live import parse_alert, parse_gpu, parse_pod
from gpuwatch.top.text import (
    render_text,
)
from gpuwatch.top.view import (
    AlertRow,
    GpuRow,
    Header,
    PodRow,
    Query,
    Snapshot,
    clusters,
    select,
)

NOW = 1_764_412_800_000
HEADER = Header(target="redis://127.0.0.1:6379/0", prefix="gpuwatch:")


def _pod(uid: str, cluster: str, gpu: str) -> PodRow:
    # The same namespace, pod name and node in both clusters.
    return PodRow(
        uid=uid,
        namespace="ml",
        pod="train-0",
        state="running",
        state_since=NOW - 60_000,
        node="gpu-node-1",
        gpus=(gpu,),
        cluster=cluster,
    )


def _alert(fingerprint: str, cluster: str) -> AlertRow:
    return AlertRow(
        fingerprint=fingerprint,
        name="NodeTelemetryMissing",
        severity="warning",
        since=NOW - 30_000,
        summary=f"node gpu-node-1 of cluster {cluster} sends no samples",
        subject_kind="node",
        subject_node="gpu-node-1",
        labels={"node": "gpu-node-1", "cluster": cluster},
        cluster=cluster,
    )


TWO = Snapshot(
    pods=(_pod("uid-a", "train", "GPU-a"), _pod("uid-b", "infer", "GPU-b")),
    gpus=(
        GpuRow(uuid="GPU-a", node="gpu-node-1", owners=("uid-a",), cluster="train"),
        GpuRow(uuid="GPU-b", node="gpu-node-1", owners=("uid-b",), cluster="infer"),
    ),
    alerts=(_alert("fp-a", "train"), _alert("fp-b", "infer")),
    pod_names={"uid-a": "ml/train-0", "uid-b": "ml/train-0"},
    state_counts={"running": 2},
    gpus_total=2,
    max_rows=3000,
)


def test_two_clusters_with_the_same_names_are_told_apart() -> None:
    assert clusters(TWO) == ["infer", "train"]
    text = render_text(TWO, Query(), HEADER, NOW)
    assert "clusters: infer train" in text
    pods = text.split("PODS (2)\n", 1)[1].split("\n")
    assert pods[0].startswith("CLUSTER  POD")
    assert sorted(line.split()[0] for line in pods[1:3]) == ["infer", "train"]
    gpus = text.split("GPUS (2)\n", 1)[1].split("\n")
    assert gpus[0].startswith("CLUSTER  GPU")
    alerts = text.split("ALERTS FIRING (2)\n", 1)[1].split("\n")
    assert alerts[0].startswith("CLUSTER  ALERT")


def test_one_cluster_is_filtered_in_every_table() -> None:
    view = select(TWO, Query(cluster="infer"))
    assert [p.uid for p in view.pods] == ["uid-b"]
    assert [g.uuid for g in view.gpus] == ["GPU-b"]
    assert [a.fingerprint for a in view.alerts] == ["fp-b"]
    doc = json.loads(render_json(TWO, Query(cluster="infer"), HEADER, NOW))
    assert doc["filters"]["cluster"] == "infer"
    assert doc["clusters"] == ["infer", "train"]
    assert [(p["uid"], p["cluster"]) for p in doc["pods"]] == [("uid-b", "infer")]
    assert [(g["uuid"], g["cluster"]) for g in doc["gpus"]] == [("GPU-b", "infer")]
    assert [a["cluster"] for a in doc["alerts"]] == ["infer"]


def test_a_filter_of_pods_and_a_cluster_together() -> None:
    view = select(TWO, Query(cluster="train", namespace="ml"))
    assert [p.uid for p in view.pods] == ["uid-a"]
    assert [g.uuid for g in view.gpus] == ["GPU-a"]
    assert select(TWO, Query(cluster="nowhere")).pods == ()


def test_a_single_cluster_shows_no_cluster_column() -> None:
    one = Snapshot(pods=(_pod("uid-a", "default", "GPU-a"),), state_counts={"running": 1})
    text = render_text(one, Query(), HEADER, NOW)
    assert "CLUSTER" not in text
    assert "clusters:" not in text


def test_hashes_and_alerts_without_a_cluster_are_the_default_cluster() -> None:
    pod = parse_pod("uid-a", {"state": "running", "namespace": "ml", "pod": "p"})
    assert pod is not None
    assert pod.cluster == "default"
    named = parse_pod("uid-a", {"state": "running", "cluster": "train"})
    assert named is not None
    assert named.cluster == "train"
    assert parse_gpu("GPU-a", {}).cluster == "default"
    assert parse_gpu("GPU-a", {"cluster": "infer"}).cluster == "infer"
    alert = parse_alert("fp", json.dumps({"name": "X", "labels": {}}))
    assert alert is not None
    assert alert.cluster == "default"
    alert = parse_alert("fp", json.dumps({"name": "X", "cluster": "infer", "labels": {}}))
    assert alert is not None
    assert alert.cluster == "infer"
