"""The object builders of the API server and the simulator stay true to recorded objects."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuwatch.harness.simulate.kube import manifests as m
from producers.k8s.normalise import NodeRules, PodRules, normalise_node, normalise_pod
from producers.k8s.objects import NODE_DECODER, POD_DECODER
from producers.k8s.selection import GpuResources
from schemas import ContainerStatus

Fixture = Callable[[str], dict[str, Any]]
T0 = 1_741_079_551.0
GPUS = GpuResources.of(["nvidia.com/gpu"], ["nvidia.com/mig-"])
MAPS = {"labels", "annotations", "limits", "requests", "capacity", "allocatable"}
RECORDED = Path(__file__).parent / "fixtures"
POD_FIXTURES = sorted(p.stem for p in RECORDED.glob("pod-*.json"))  # every recorded pod
NODE_FIXTURES = sorted(p.stem for p in RECORDED.glob("node-*.json"))


def paths(value: Any, prefix: str = "") -> Iterator[str]:
    """Every field path of a JSON value; list items as `[]`, free-form maps as `*`."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = "*" if prefix.rsplit(".", 1)[-1] in MAPS else key
            yield from paths(item, f"{prefix}.{name}" if prefix else name)
    elif isinstance(value, list):
        for item in value:
            yield from paths(item, f"{prefix}[]")
    else:
        yield prefix


def pod_states() -> dict[str, dict[str, Any]]:
    new = m.gpu_pod(
        "p", "ml", created=T0, labels={"team": "a"}, owner=("Job", "j"), priority_class="hi"
    )
    on_node = m.bound(new, "gpu-node-1", T0 + 1)
    return {
        "new": new,
        "unschedulable": m.unschedulable(
            new, T0 + 1, "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
        ),
        "pulling": m.pulling(on_node, T0 + 2),
        "image-pull-backoff": m.image_pull_backoff(on_node, T0 + 3),
        "running": m.running(on_node, T0 + 4),
        "crash-looping": m.crash_looping(m.running(on_node, T0 + 4), T0 + 9),
        "succeeded": m.succeeded(m.running(on_node, T0 + 4), T0 + 60),
        "failed": m.failed(m.running(on_node, T0 + 4), T0 + 60, reason="OOMKilled", exit_code=137),
        "evicted": m.evicted(m.running(on_node, T0 + 4), T0 + 30),
        "terminating": m.terminating(m.running(on_node, T0 + 4), T0 + 40),
    }


def test_built_pods_have_only_fields_real_pods_have(fixture: Fixture) -> None:
    real = {p for name in POD_FIXTURES for p in paths(fixture(name))}
    # Two fields every real pod has once deleted, absent from the recorded (live) ones.
    real |= {"metadata.deletionTimestamp", "metadata.deletionGracePeriodSeconds"}
    for state, pod in pod_states().items():
        invented = set(paths(pod)) - real
        assert not invented, f"{state}: fields no recorded pod has: {sorted(invented)}"


def test_built_nodes_have_only_fields_real_nodes_have(fixture: Fixture) -> None:
    real = {p for name in NODE_FIXTURES for p in paths(fixture(name))}
    node = m.gpu_node("n", created=T0)
    for state, built in {
        "ready": node,
        "not-ready": m.node_ready(node, False, T0 + 5),
        "cordoned": m.cordoned(node, T0 + 6),
    }.items():
        invented = set(paths(built)) - real
        assert not invented, f"{state}: fields no recorded node has: {sorted(invented)}"


def normalised(pod: dict[str, Any]) -> Any:
    return normalise_pod(
        POD_DECODER.decode(json.dumps({**pod, "metadata": {**pod["metadata"], "uid": "u"}})),
        PodRules(GPUS, ("team",)),
        None,
    )


def test_built_pods_read_as_their_lifecycle_states() -> None:
    states = {name: normalised(pod) for name, pod in pod_states().items()}
    assert (states["new"].phase, states["new"].containers) == ("Pending", ())
    assert states["unschedulable"].conditions[0].reason == "Unschedulable"
    assert states["pulling"].containers[0].reason == "ContainerCreating"
    assert states["pulling"].scheduled_at == int((T0 + 1) * 1000)
    assert states["image-pull-backoff"].containers[0].reason == "ImagePullBackOff"
    assert states["running"].phase == "Running"
    assert states["running"].containers[0].state == "running"
    assert states["crash-looping"].containers == (
        ContainerStatus(
            name="main", state="waiting", reason="CrashLoopBackOff", exit_code=137, restarts=1
        ),
    )
    assert (states["succeeded"].phase, states["succeeded"].finished_at) == (
        "Succeeded",
        int((T0 + 60) * 1000),
    )
    assert states["failed"].containers[0].reason == "OOMKilled"
    assert states["evicted"].conditions[-1].reason == "TerminationByKubelet"
    assert states["evicted"].gpu_request == {"nvidia.com/gpu": 1}


def test_builders_do_not_change_their_input() -> None:
    pod = m.gpu_pod("p", created=T0)
    before = json.dumps(pod, sort_keys=True)
    m.running(m.bound(pod, "n", T0), T0)
    assert json.dumps(pod, sort_keys=True) == before


def test_built_nodes_read_as_their_states() -> None:
    rules = NodeRules(GPUS, ("nvidia.com/gpu.product",))
    node = m.gpu_node("n", created=T0, gpus=4)
    value = normalise_node(NODE_DECODER.decode(json.dumps(node)), rules)
    assert (value.ready, value.unschedulable, value.gpu_capacity) == (
        True,
        False,
        {"nvidia.com/gpu": 4},
    )
    down = normalise_node(
        NODE_DECODER.decode(json.dumps(m.cordoned(m.node_ready(node, False, T0 + 1), T0 + 2))),
        rules,
    )
    assert (down.ready, down.unschedulable) == (False, True)
    back = m.cordoned(m.cordoned(node, T0 + 2), T0 + 3, on=False)
    assert normalise_node(NODE_DECODER.decode(json.dumps(back)), rules).unschedulable is False
