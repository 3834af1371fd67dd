"""ResourceSlices as the NVIDIA DRA driver publishes them, for the tests that read them
(the watcher's capacity, the node agent's uuid lookup) on the test server, the real one
or in memory."""

from __future__ import annotations

from typing import Any

__all__ = ["DRIVER", "resource_slice"]

DRIVER = "gpu.nvidia.com"


def resource_slice(
    name: str,
    devices: list[dict[str, Any]],
    *,
    node: str | None,
    pool: str | None = None,
    generation: int = 1,
    driver: str = DRIVER,
    version: str = "v1",
    resource_version: str | None = None,
) -> dict[str, Any]:
    """A slice of one pool (named after `node` unless told) of `devices`, on `node` (None:
    a slice of no node, which the node-local readers skip)."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
        "devices": devices,
    }
    if node is not None:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": name}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": spec,
    }
