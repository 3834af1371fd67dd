"""The Kubernetes watcher names its cluster in every pod and node message; the default
cluster's messages are the bytes the watcher wrote before messages named a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import load

from producers.base.kubeapi import Collection, WatchLines
from producers.k8s.watcher import K8sWatcher
from schemas import K8S_NODES, K8S_PODS
from schemas.settings import WatcherSettings

NOW_MS = 1_764_412_345_000

# The first list of the API below, as the watcher encoded it before the cluster field
# existed (recorded from that version of the code).
NODE_BEFORE_CLUSTERS = (
    b'{"schema":"gpuwatch.k8s.node/v1","type":"RESYNC","node":"ip-10-0-12-29.ec2.internal","'
    b'ts":1740665020000,"gpu_capacity":{"nvidia.com/gpu":8},"gpu_allocatable":{"nvidia.com/g'
    b'pu":8},"gpu_product":"NVIDIA-H100-80GB-HBM3","labels":{"node.kubernetes.io/instance-ty'
    b'pe":"p5.48xlarge","nvidia.com/gpu.product":"NVIDIA-H100-80GB-HBM3","nvidia.com/gpu.rep'
    b'licas":"1","nvidia.com/mig.strategy":"single","eks.amazonaws.com/nodegroup":"gpu-h100"'
    b'},"ready":true,"unschedulable":false}'
)
POD_BEFORE_CLUSTERS = (
    b'{"schema":"gpuwatch.k8s.pod/v1","type":"RESYNC","ts":1741075272000,"resource_version":'
    b'"48231877","uid":"9e8d7c6b-5a49-4382-a716-05f4e3d2c1b0","namespace":"inference","name"'
    b':"vllm-llama-6b7c9d5f8-2xkqp","node":"ip-10-0-12-29.ec2.internal","phase":"Running","c'
    b'reated_at":1741075120000,"scheduled_at":1741075121000,"started_at":1741075121000,"fini'
    b'shed_at":null,"gpu_request":{"nvidia.com/gpu":2},"conditions":[{"type":"PodScheduled",'
    b'"status":"True","reason":null,"message":null},{"type":"Ready","status":"True","reason"'
    b':null,"message":null}],"containers":[{"name":"vllm","state":"running","reason":null,"e'
    b'xit_code":null,"restarts":0}],"labels":{"team":"serving","project":"chat","app.kuberne'
    b'tes.io/name":"vllm"},"owner":{"kind":"ReplicaSet","name":"vllm-llama-6b7c9d5f8"},"prio'
    b'rity_class":"serving-high","queue":null}'
)
# Added within v1 since (after the cluster field): the pod's controller uid, its gates.
POD_ADDED_SINCE = b',"controller_uid":"3f2e1d0c-9b8a-4765-8432-10fedcba9876","scheduling_gates":[]}'
POD_NOW = POD_BEFORE_CLUSTERS[:-1] + POD_ADDED_SINCE


class OneListApi:
    """Lists one recorded GPU node and one recorded GPU pod; the test never watches."""

    def list(self, collection: Collection, *, limit: int, continue_token: str | None) -> bytes:
        item = load({"pods": "pod-running", "nodes": "node-gpu-h100-ready"}[collection.resource])
        body = {"kind": "List", "metadata": {"resourceVersion": "48231900"}, "items": [item]}
        return json.dumps(body).encode()

    def watch(self, collection: Collection, *, resource_version: str, timeout_s: int) -> WatchLines:
        raise AssertionError("only the first list is taken")

    def get_controller(self, kind: str, namespace: str, name: str) -> bytes | None:
        return None


def first_lists(cluster: str | None) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """(key, value) of the pod and of the node messages of the first lists; `cluster` None
    leaves the watcher's default."""
    pods: list[tuple[str, bytes]] = []
    nodes: list[tuple[str, bytes]] = []
    named: dict[str, Any] = {} if cluster is None else {"cluster": cluster}
    watcher = K8sWatcher(
        OneListApi(),
        WatcherSettings(),
        emit_pod=lambda v: pods.append((K8S_PODS.key_of(v), K8S_PODS.encode(v))),
        emit_node=lambda v: nodes.append((K8S_NODES.key_of(v), K8S_NODES.encode(v))),
        now_ms=lambda: NOW_MS,
        full_resync_s=None,
        resolve_owners=False,
        **named,
    )
    for watch in watcher.watches:
        assert watch.step()
    return pods, nodes


def test_a_named_cluster_is_in_every_pod_and_node_message_and_the_keys_stay() -> None:
    pods, nodes = first_lists("eu-west")

    assert [key for key, _ in pods] == ["9e8d7c6b-5a49-4382-a716-05f4e3d2c1b0"]
    assert [key for key, _ in nodes] == ["ip-10-0-12-29.ec2.internal"]
    for (_, value), before in [(pods[0], POD_NOW), (nodes[0], NODE_BEFORE_CLUSTERS)]:
        message = json.loads(value)
        assert message["cluster"] == "eu-west"
        assert {k: v for k, v in message.items() if k != "cluster"} == json.loads(before)
    assert K8S_PODS.decode(pods[0][1]).cluster == "eu-west"
    assert K8S_NODES.decode(nodes[0][1]).cluster == "eu-west"


@pytest.mark.parametrize("cluster", [None, "default"])
def test_the_default_clusters_messages_are_byte_identical_to_before(cluster: str | None) -> None:
    pods, nodes = first_lists(cluster)

    assert [value for _, value in pods] == [POD_NOW]
    assert [value for _, value in nodes] == [NODE_BEFORE_CLUSTERS]
