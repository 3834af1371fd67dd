"""Recorded API objects to gpuwatch.k8s.pod/v1 and gpuwatch.k8s.node/v1 values."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from jsonschema import Draft202012Validator

from producers.k8s.normalise import (
    NodeRules,
    PodRules,
    node_stamps,
    normalise_node,
    normalise_pod,
    pod_stamps,
)
from producers.k8s.objects import NODE_DECODER, POD_DECODER, MalformedObject, Node, Pod, parse_time
from producers.k8s.selection import GpuResources
from schemas import K8S_NODES, K8S_PODS, Condition, ContainerStatus, K8sPod, Owner
from schemas.export import JSON_DIR
from schemas.settings import WatcherSettings

Fixture = Callable[[str], dict[str, Any]]
DEFAULTS = WatcherSettings()
GPUS = GpuResources.of(DEFAULTS.gpu_resources, DEFAULTS.gpu_resource_prefixes)
POD_RULES = PodRules(GPUS, DEFAULTS.pod_label_allowlist)
NODE_RULES = NodeRules(GPUS, DEFAULTS.node_label_allowlist)


def pod_of(fixture: Fixture, name: str) -> Pod:
    """The fixture decoded as the watcher decodes the API's bytes."""
    return POD_DECODER.decode(json.dumps(fixture(name)).encode())


def node_of(fixture: Fixture, name: str) -> Node:
    return NODE_DECODER.decode(json.dumps(fixture(name)).encode())


def ms(text: str) -> int:
    value = parse_time(text)
    assert value is not None
    return value


def validator(schema_file: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((JSON_DIR / schema_file).read_text(encoding="utf-8")))


def test_pending_unschedulable_keeps_the_schedulers_reason_and_message(fixture: Fixture) -> None:
    value = normalise_pod(
        pod_of(fixture, "pod-pending-unschedulable"),
        POD_RULES,
        Owner(kind="Job", name="llm-pretrain"),
    )
    assert value == K8sPod(
        schema="gpuwatch.k8s.pod/v1",
        type="ADDED",
        ts=0,
        resource_version="48213377",
        uid="6f1c8a2e-4b3d-4e5f-9a7b-1c2d3e4f5a6b",  # type: ignore[arg-type]
        namespace="ml",
        name="llm-pretrain-x7k2p",
        node=None,
        phase="Pending",
        created_at=ms("2025-03-04T09:12:31Z"),
        scheduled_at=None,
        started_at=None,
        finished_at=None,
        gpu_request={"nvidia.com/gpu": 8},
        conditions=(
            Condition(
                type="PodScheduled",
                status="False",
                reason="Unschedulable",
                message="0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: "
                "0/4 nodes are available: 4 No preemption victims found for incoming pod.",
            ),
        ),
        containers=(),
        labels={"team": "vision", "project": "llm-pretrain"},
        owner=Owner(kind="Job", name="llm-pretrain"),
        priority_class="research",
        queue=None,
        controller_uid="0c6d7d5e-2f9b-4c61-9a6e-5b3a8f0e6f21",  # the Job's uid
        scheduling_gates=(),
    )


def test_a_running_ready_pod(fixture: Fixture) -> None:
    value = normalise_pod(
        pod_of(fixture, "pod-running"), POD_RULES, Owner(kind="Deployment", name="vllm-llama")
    )
    assert (value.phase, value.node) == ("Running", "ip-10-0-12-29.ec2.internal")
    assert value.containers == (
        ContainerStatus(name="vllm", state="running", reason=None, exit_code=None, restarts=0),
    )
    assert value.conditions == (
        Condition(type="PodScheduled", status="True", reason=None, message=None),
        Condition(type="Ready", status="True", reason=None, message=None),
    )
    assert (value.scheduled_at, value.started_at) == (
        ms("2025-03-04T07:58:41Z"),
        ms("2025-03-04T07:58:41Z"),
    )
    assert value.gpu_request == {"nvidia.com/gpu": 2}
    assert (value.priority_class, value.owner) == (
        "serving-high",
        Owner(kind="Deployment", name="vllm-llama"),
    )
    assert dict(pod_stamps(pod_of(fixture, "pod-running")))["container/vllm/running"] == ms(
        "2025-03-04T07:59:57Z"
    )


def test_image_pull_backoff_is_a_waiting_container_of_a_bound_pending_pod(fixture: Fixture) -> None:
    value = normalise_pod(pod_of(fixture, "pod-image-pull-backoff"), POD_RULES, None)
    assert (value.phase, value.node) == ("Pending", "gpu-node-03")
    assert value.scheduled_at == ms("2025-03-04T10:02:11Z")
    assert value.started_at == ms("2025-03-04T10:02:11Z")
    assert value.containers == (
        ContainerStatus(
            name="server", state="waiting", reason="ImagePullBackOff", exit_code=None, restarts=0
        ),
    )
    assert [c.type for c in value.conditions] == ["PodScheduled", "Ready"]
    assert value.conditions[1] == Condition(
        type="Ready",
        status="False",
        reason="ContainersNotReady",
        message="containers with unready status: [server]",
    )
    assert value.labels == {"team": "serving", "app.kubernetes.io/name": "triton"}
    assert value.gpu_request == {"nvidia.com/gpu": 1}


def test_crash_loop_shows_the_back_off_and_the_exit_code_of_the_last_run(fixture: Fixture) -> None:
    value = normalise_pod(pod_of(fixture, "pod-crashloop-oomkilled"), POD_RULES, None)
    assert value.phase == "Running"
    assert value.containers == (
        ContainerStatus(
            name="embedder", state="waiting", reason="CrashLoopBackOff", exit_code=137, restarts=4
        ),
    )
    assert value.finished_at is None


def test_an_oom_killed_job_pod_is_failed_with_the_kill_time(fixture: Fixture) -> None:
    value = normalise_pod(
        pod_of(fixture, "pod-oomkilled-failed"), POD_RULES, Owner(kind="Job", name="finetune-lora")
    )
    assert value.phase == "Failed"
    assert value.containers == (
        ContainerStatus(
            name="trainer", state="terminated", reason="OOMKilled", exit_code=137, restarts=0
        ),
    )
    assert value.finished_at == ms("2025-03-04T12:31:16Z")
    assert value.gpu_request == {"nvidia.com/mig-3g.40gb": 1}
    assert value.queue == "team-vision"
    assert value.labels["kueue.x-k8s.io/queue-name"] == "team-vision"


def test_a_completed_job_pod_lists_init_then_app_containers(fixture: Fixture) -> None:
    value = normalise_pod(pod_of(fixture, "pod-job-completed"), POD_RULES, None)
    assert value.phase == "Succeeded"
    assert value.containers == (
        ContainerStatus(
            name="fetch-weights", state="terminated", reason="Completed", exit_code=0, restarts=0
        ),
        ContainerStatus(
            name="eval", state="terminated", reason="Completed", exit_code=0, restarts=0
        ),
    )
    assert value.finished_at == ms("2025-03-04T02:47:30Z")
    assert value.gpu_request == {"nvidia.com/gpu": 2}
    assert value.priority_class == "batch-low"
    assert value.conditions[1] == Condition(
        type="Ready", status="False", reason="PodCompleted", message=None
    )


def test_an_evicted_pod_carries_the_disruption_and_a_finish_time(fixture: Fixture) -> None:
    value = normalise_pod(pod_of(fixture, "pod-evicted"), POD_RULES, None)
    assert value.phase == "Failed"
    assert [c.type for c in value.conditions] == ["PodScheduled", "Ready", "DisruptionTarget"]
    disruption = value.conditions[2]
    assert (disruption.status, disruption.reason) == ("True", "TerminationByKubelet")
    assert disruption.message is not None
    assert disruption.message.startswith("The node was low on resource: memory.")
    assert value.containers[0] == ContainerStatus(
        name="notebook",
        state="terminated",
        reason="ContainerStatusUnknown",
        exit_code=137,
        restarts=0,
    )
    # No container recorded a finish (null times): the last condition transition stands in.
    assert value.finished_at == ms("2025-03-04T06:15:03Z")
    assert value.gpu_request == {"nvidia.com/gpu.shared": 1}


@pytest.mark.parametrize(
    "name",
    [
        "pod-running",
        "pod-pending-unschedulable",
        "pod-image-pull-backoff",
        "pod-crashloop-oomkilled",
        "pod-oomkilled-failed",
        "pod-job-completed",
        "pod-evicted",
    ],
)
def test_every_pod_value_round_trips_and_validates(fixture: Fixture, name: str) -> None:
    value = normalise_pod(pod_of(fixture, name), POD_RULES, Owner(kind="Deployment", name="d"))
    value = msgspec.structs.replace(value, type="MODIFIED", ts=1741079551000)
    raw = K8S_PODS.encode(value)
    assert K8S_PODS.decode(raw) == value
    errors = list(validator(K8S_PODS.json_schema_file).iter_errors(json.loads(raw)))
    assert errors == []


def test_labels_are_allow_listed_never_copied_whole(fixture: Fixture) -> None:
    pod = pod_of(fixture, "pod-pending-unschedulable")
    value = normalise_pod(pod, PodRules(GPUS, ("team",)), None)
    assert value.labels == {"team": "vision"}
    assert normalise_pod(pod, PodRules(GPUS, ()), None).labels == {}


def test_the_kueue_queue_may_come_from_the_older_annotation() -> None:
    pod: Any = {
        "metadata": {
            "uid": "u",
            "name": "p",
            "namespace": "ml",
            "creationTimestamp": "2025-03-04T09:00:00Z",
            "annotations": {"kueue.x-k8s.io/queue-name": "research"},
        },
        "spec": {"containers": [{"name": "c"}]},
    }
    value = normalise_pod(pod, POD_RULES, None)
    assert (value.queue, value.phase, value.containers, value.conditions) == (
        "research",
        "Pending",
        (),
        (),
    )


def test_a_pod_without_uid_or_creation_time_is_malformed() -> None:
    with pytest.raises(MalformedObject, match="uid"):
        normalise_pod(
            {"metadata": {"name": "p", "creationTimestamp": "2025-03-04T09:00:00Z"}},
            POD_RULES,
            None,
        )
    with pytest.raises(MalformedObject, match="creationTimestamp"):
        normalise_pod({"metadata": {"name": "p", "uid": "u"}}, POD_RULES, None)


def test_an_unknown_phase_or_condition_status_reads_unknown() -> None:
    pod: Any = {
        "metadata": {"uid": "u", "name": "p", "creationTimestamp": "2025-03-04T09:00:00Z"},
        "status": {"phase": "Hibernating", "conditions": [{"type": "Ready", "status": "Maybe"}]},
    }
    value = normalise_pod(pod, POD_RULES, None)
    assert value.phase == "Unknown"
    assert value.conditions[0].status == "Unknown"


def test_pod_stamps_are_the_recorded_transitions(fixture: Fixture) -> None:
    stamps = dict(pod_stamps(pod_of(fixture, "pod-crashloop-oomkilled")))
    assert stamps == {
        "created": ms("2025-03-04T08:00:05Z"),
        "started": ms("2025-03-04T08:00:05Z"),
        "condition/PodScheduled": ms("2025-03-04T08:00:05Z"),
        "condition/Ready": ms("2025-03-04T08:21:47Z"),
        "container/embedder/last-finished": ms("2025-03-04T08:21:47Z"),
    }


def test_a_gpu_node(fixture: Fixture) -> None:
    value = normalise_node(node_of(fixture, "node-gpu-h100-ready"), NODE_RULES)
    assert value.node == "ip-10-0-12-29.ec2.internal"
    assert (value.gpu_capacity, value.gpu_allocatable) == (
        {"nvidia.com/gpu": 8},
        {"nvidia.com/gpu": 8},
    )
    assert value.gpu_product == "NVIDIA-H100-80GB-HBM3"
    assert value.labels == {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.strategy": "single",
        "eks.amazonaws.com/nodegroup": "gpu-h100",
    }
    assert (value.ready, value.unschedulable) == (True, False)
    assert dict(node_stamps(node_of(fixture, "node-gpu-h100-ready"))) == {
        "created": ms("2025-02-27T14:03:12Z"),
        "condition/Ready": ms("2025-02-27T14:03:40Z"),
    }


def test_a_cordoned_mig_node_whose_kubelet_is_gone(fixture: Fixture) -> None:
    node = node_of(fixture, "node-mig-mixed-cordoned-notready")
    value = normalise_node(node, NODE_RULES)
    assert value.gpu_capacity == {
        "nvidia.com/mig-1g.5gb": 16,
        "nvidia.com/mig-2g.10gb": 8,
        "nvidia.com/mig-3g.20gb": 8,
    }
    assert (value.ready, value.unschedulable) == (False, True)
    assert value.labels["cloud.google.com/gke-nodepool"] == "a100-mig"
    assert value.labels["nvidia.com/mig.strategy"] == "mixed"
    assert dict(node_stamps(node))["cordoned"] == ms("2025-03-04T11:58:02Z")
    raw = K8S_NODES.encode(msgspec.structs.replace(value, type="MODIFIED", ts=1))
    assert list(validator(K8S_NODES.json_schema_file).iter_errors(json.loads(raw))) == []


LABEL = "nvidia.com/gpu.product"


def _term(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(expressions)}


def _in(*values: str, key: str = LABEL, operator: str = "In") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


@pytest.mark.parametrize(
    ("spec", "products"),
    [
        ({}, None),
        ({"nodeSelector": {"kubernetes.io/arch": "amd64"}}, None),
        ({"nodeSelector": {LABEL: "NVIDIA-H100-80GB-HBM3"}}, ("NVIDIA-H100-80GB-HBM3",)),
        ({"affinity": _affinity(_term(_in("B", "A")))}, ("A", "B")),
        # Terms are ORed: the union, unless one term allows any model.
        ({"affinity": _affinity(_term(_in("A")), _term(_in("C")))}, ("A", "C")),
        ({"affinity": _affinity(_term(_in("A")), _term(_in("x", key="zone")))}, None),
        # Expressions of a term are ANDed; NotIn is not read.
        ({"affinity": _affinity(_term(_in("A", "B"), _in("B", "C")))}, ("B",)),
        ({"affinity": _affinity(_term(_in("A", operator="NotIn")))}, None),
        # A selector and an affinity both hold.
        ({"nodeSelector": {LABEL: "A"}, "affinity": _affinity(_term(_in("A", "B")))}, ("A",)),
        ({"nodeSelector": {LABEL: "C"}, "affinity": _affinity(_term(_in("A", "B")))}, ()),
    ],
)
def test_the_gpu_models_a_pod_may_use_come_from_its_selector_and_affinity(
    fixture: Fixture, spec: dict[str, Any], products: tuple[str, ...] | None
) -> None:
    raw = fixture("pod-pending-unschedulable")
    raw["spec"] = raw["spec"] | spec
    value = normalise_pod(POD_DECODER.decode(json.dumps(raw).encode()), POD_RULES, None)
    assert value.gpu_products == products
    encoded = K8S_PODS.encode(value)
    assert (b'"gpu_products"' in encoded) == (products is not None)
    assert K8S_PODS.decode(encoded) == value
