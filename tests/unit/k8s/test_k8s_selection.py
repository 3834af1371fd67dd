"""Which pods and nodes are GPU ones, and what a pod requests (the scheduler's rule)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from producers.k8s.objects import POD_DECODER, Pod
from producers.k8s.selection import GpuResources, NodeSelection, PodSelection, effective_request

GPUS = GpuResources.of(["nvidia.com/gpu", "nvidia.com/gpu.shared"], ["nvidia.com/mig-"])


def container(
    name: str,
    gpus: dict[str, str] | None = None,
    *,
    limits_only: bool = False,
    sidecar: bool = False,
) -> dict[str, Any]:
    resources = (
        {"limits": dict(gpus or {})}
        if limits_only
        else {"requests": dict(gpus or {}), "limits": dict(gpus or {})}
    )
    out: dict[str, Any] = {
        "name": name,
        "resources": {**resources, "requests": {"cpu": "1", **resources.get("requests", {})}},
    }
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    name: str = "p",
    namespace: str = "ml",
) -> Pod:
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}  # type: ignore[typeddict-item]


def test_gpu_resources_are_names_and_prefixes() -> None:
    assert "nvidia.com/gpu" in GPUS
    assert "nvidia.com/mig-1g.10gb" in GPUS
    assert "nvidia.com/mig" not in GPUS
    assert "amd.com/gpu" not in GPUS
    assert GPUS.counts({"cpu": "4", "nvidia.com/gpu": "8", "nvidia.com/mig-3g.40gb": "2"}) == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-3g.40gb": 2,
    }


def test_app_containers_add_up() -> None:
    p = pod([container("a", {"nvidia.com/gpu": "2"}), container("b", {"nvidia.com/gpu": "1"})])
    assert effective_request(p, GPUS) == {"nvidia.com/gpu": 3}


def test_an_init_container_counts_when_it_asks_more_than_the_apps_together() -> None:
    p = pod(
        [container("a", {"nvidia.com/gpu": "1"}), container("b", {"nvidia.com/gpu": "1"})],
        init=[container("warmup", {"nvidia.com/gpu": "4"}), container("fetch")],
    )
    assert effective_request(p, GPUS) == {"nvidia.com/gpu": 4}


def test_the_max_is_per_resource() -> None:
    p = pod(
        [container("a", {"nvidia.com/gpu": "2"})],
        init=[container("warmup", {"nvidia.com/mig-1g.10gb": "3", "nvidia.com/gpu": "1"})],
    )
    assert effective_request(p, GPUS) == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 3}


def test_sidecars_run_beside_the_apps_and_the_init_containers_after_them() -> None:
    # KEP-753: sidecar (restartPolicy Always) requests add to the apps, and to every
    # plain init container that starts after them.
    p = pod(
        [container("app", {"nvidia.com/gpu": "1"})],
        init=[
            container("early", {"nvidia.com/gpu": "2"}),
            container("proxy", {"nvidia.com/gpu": "1"}, sidecar=True),
            container("late", {"nvidia.com/gpu": "2"}),
        ],
    )
    # max(apps 1 + sidecar 1, early 2, late 2 + sidecar 1) = 3
    assert effective_request(p, GPUS) == {"nvidia.com/gpu": 3}


def test_a_gpu_given_only_as_a_limit_is_requested_at_the_limit() -> None:
    p = pod([container("a", {"nvidia.com/gpu": "2"}, limits_only=True)])
    assert effective_request(p, GPUS) == {"nvidia.com/gpu": 2}


def test_a_pod_without_gpus_requests_nothing_and_is_not_selected() -> None:
    p = pod([container("web")])
    assert effective_request(p, GPUS) == {}
    assert not PodSelection(GPUS).wanted(p)
    zero = pod([container("a", {"nvidia.com/gpu": "0"})])
    assert not PodSelection(GPUS).wanted(zero)


def test_named_pods_are_selected_without_a_gpu_request() -> None:
    p = pod([container("web")], name="leaky", namespace="ml")
    assert PodSelection(GPUS, frozenset({"ml/leaky"})).wanted(p)
    assert not PodSelection(GPUS, frozenset({"other/leaky"})).wanted(p)


def test_configured_resource_names_decide(fixture: Any) -> None:
    amd = GpuResources.of(["amd.com/gpu"], [])
    p = pod([container("a", {"amd.com/gpu": "1"})])
    assert PodSelection(amd).wanted(p)
    assert not PodSelection(GPUS).wanted(p)


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("node-gpu-h100-ready", True),
        ("node-mig-mixed-cordoned-notready", True),
        ("node-cpu-only", False),
    ],
)
def test_gpu_nodes_are_selected(fixture: Any, name: str, wanted: bool) -> None:
    assert NodeSelection(GPUS).wanted(fixture(name)) is wanted


def test_a_labelled_gpu_node_is_selected_before_its_device_plugin_registers() -> None:
    node: Any = {
        "metadata": {"name": "n", "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {"capacity": {"cpu": "8"}},
    }
    assert NodeSelection(GPUS).wanted(node)


def test_pods_with_resource_claims_are_selected_when_claim_pods_are_wanted() -> None:
    p = pod([container("trainer")])
    p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "train-gpus"}]
    assert effective_request(p, GPUS) == {}  # a claim's devices are no extended resource
    assert PodSelection(GPUS, claims=True).wanted(p)
    assert not PodSelection(GPUS).wanted(p)
    p["spec"]["resourceClaims"] = []
    assert not PodSelection(GPUS, claims=True).wanted(p)
    # As the watcher decodes the API's JSON: the claims are kept.
    raw = {"metadata": {"name": "t", "namespace": "ml"}, "spec": {"containers": [],
           "resourceClaims": [{"name": "gpus", "resourceClaimName": "shared-gpu"}]}}  # fmt: skip
    decoded = POD_DECODER.decode(json.dumps(raw).encode())
    assert PodSelection(GPUS, claims=True).wanted(decoded)
