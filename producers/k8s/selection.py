"""Which pods and nodes the watcher publishes, and what a pod requests in GPUs.

A pod is a GPU pod when its effective request of any GPU resource is above zero, or when
the configuration names it (`namespace/name`: a pod that reaches a GPU without asking for
one). A node is a GPU node when it has GPU capacity or the GPU feature discovery label.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from producers.base.resources import ResourceFilter
from producers.k8s.objects import Container, Node, Pod, Quantity, parse_quantity

log = logging.getLogger(__name__)

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"  # set by GPU feature discovery before the plugin


class GpuResources(ResourceFilter):
    """The GPU resources, with the GPU entries of a resource map counted."""

    __slots__ = ()

    def counts(self, quantities: Mapping[str, Quantity] | None) -> dict[str, int]:
        """The GPU entries of a resource map (capacity, requests) as whole counts."""
        counts: dict[str, int] = {}
        for resource, quantity in (quantities or {}).items():
            if resource in self:
                try:
                    counts[resource] = parse_quantity(quantity)
                except ValueError:
                    log.warning("bad quantity resource=%s value=%r", resource, quantity)
        return counts


def container_request(container: Container, gpus: GpuResources) -> dict[str, int]:
    """One container's GPU request; an extended resource given only as a limit is
    requested at the limit (the API defaults the request to it)."""
    resources = container.get("resources") or {}
    limits = gpus.counts(resources.get("limits"))
    requests = gpus.counts(resources.get("requests"))
    return {**limits, **requests}


def effective_request(pod: Pod, gpus: GpuResources) -> dict[str, int]:
    """What the scheduler reserves for the pod, per GPU resource, zero entries left out.

    The Kubernetes rule with sidecars (init containers with `restartPolicy: Always`):
    max(sum of app containers + all sidecars, for each plain init container: its own
    request + the sidecars started before it). Without sidecars this is the familiar
    max(largest init container, sum of app containers).
    """
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for container in spec.get("initContainers") or []:
        request = container_request(container, gpus)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, request)
        else:
            _max(total, _sum(request, sidecars))
    apps: dict[str, int] = {}
    for container in spec.get("containers") or []:
        _add(apps, container_request(container, gpus))
    _max(total, _sum(apps, sidecars))
    return {resource: count for resource, count in sorted(total.items()) if count > 0}


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for resource, count in other.items():
        into[resource] = into.get(resource, 0) + count


def _sum(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    _add(out, b)
    return out


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for resource, count in other.items():
        into[resource] = max(into.get(resource, 0), count)


@dataclass(frozen=True)
class PodSelection:
    """The client-side half of pod selection (namespaces and label selectors are sent to
    the API): GPU pods plus the pods named in `extra` as `namespace/name`, and with
    `claims` the pods that use ResourceClaims (Dynamic Resource Allocation: a GPU so
    allocated is no extended resource; the pod's claims say which devices only through
    their device classes, which the pod does not name)."""

    gpus: GpuResources
    extra: frozenset[str] = frozenset()
    claims: bool = False

    def wanted(self, pod: Pod) -> bool:
        """Whether the pod is published."""
        meta = pod.get("metadata") or {}
        if f"{meta.get('namespace') or ''}/{meta.get('name') or ''}" in self.extra:
            return True
        if self.claims and (pod.get("spec") or {}).get("resourceClaims"):
            return True
        return bool(effective_request(pod, self.gpus))


@dataclass(frozen=True)
class NodeSelection:
    """GPU nodes: GPU capacity above zero, or labelled by GPU feature discovery (a node
    whose device plugin has not registered yet is still a GPU node)."""

    gpus: GpuResources

    def wanted(self, node: Node) -> bool:
        """Whether the node is published."""
        meta = node.get("metadata") or {}
        if (meta.get("labels") or {}).get(GPU_PRESENT_LABEL) == "true":
            return True
        status = node.get("status") or {}
        return any(count > 0 for count in self.gpus.counts(status.get("capacity")).values())
