"""A DRA pod's GPU request, from its claims' device requests (resource.k8s.io v1, v1beta1)."""

from __future__ import annotations

import json
from typing import Any

from producers.k8s.claims import ClaimRequests, claim_devices

GPU, MIG = "gpu.nvidia.com", "mig.nvidia.com"
CLASSES = (GPU, MIG)


def exactly(device_class: str, count: int | None = None, mode: str | None = None) -> Any:
    body: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        body["count"] = count
    if mode is not None:
        body["allocationMode"] = mode
    return {"name": "r", "exactly": body}


def test_devices_of_the_gpu_classes_are_counted_by_class() -> None:
    spec = {
        "devices": {
            "requests": [
                exactly(GPU, 2),
                exactly(GPU),  # count defaults to 1
                exactly(MIG, 3),
                exactly("nic.example.com", 4),
                exactly(GPU, mode="All"),  # all of a node's: counted one
                {"name": "beta", "deviceClassName": GPU, "count": 2},  # v1beta1: inline
                {"name": "pick", "firstAvailable": [exactly(MIG, 1)["exactly"], exactly(GPU, 1)]},
            ]
        }
    }
    assert claim_devices(spec, CLASSES) == {GPU: 6, MIG: 4}
    assert claim_devices({}, CLASSES) == {}


def test_a_pods_claims_add_up_and_each_source_is_read_once() -> None:
    objects = {
        ("ResourceClaimTemplate", "ml", "train-gpus"): {"spec": {"spec": {"devices": {
            "requests": [exactly(GPU, 4)]}}}},
        ("ResourceClaim", "ml", "shared-gpu"): {"spec": {"devices": {
            "requests": [exactly(GPU, 1)]}}},
    }  # fmt: skip
    asked: list[tuple[str, str, str]] = []

    def lookup(kind: str, namespace: str, name: str) -> bytes | None:
        asked.append((kind, namespace, name))
        found = objects.get((kind, namespace, name))
        return None if found is None else json.dumps(found).encode()

    claims = ClaimRequests(lookup, CLASSES)
    spec: Any = {"resourceClaims": [
        {"name": "a", "resourceClaimTemplateName": "train-gpus"},
        {"name": "b", "resourceClaimName": "shared-gpu"},
        {"name": "c", "resourceClaimTemplateName": "not-yet"},
    ]}  # fmt: skip
    assert claims.of("ml", spec) == {GPU: 5}
    assert claims.of("ml", spec) == {GPU: 5}
    # Read once each; the missing template is asked again (it may be created later).
    assert asked.count(("ResourceClaimTemplate", "ml", "train-gpus")) == 1
    assert asked.count(("ResourceClaimTemplate", "ml", "not-yet")) == 2
    assert ClaimRequests(None).of("ml", spec) == {}
