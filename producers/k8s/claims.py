"""What a pod asks for through its ResourceClaims: GPU devices by device class.

A pod that gets its GPUs through Dynamic Resource Allocation requests no extended
resource; its `spec.resourceClaims` name a ResourceClaim, or a ResourceClaimTemplate the
claim is made from, whose `spec.devices.requests` say how many devices of which
DeviceClass (`gpu.nvidia.com`, `mig.nvidia.com` for the NVIDIA DRA driver). The request
of a pod is the sum over its claims of the devices of the GPU device classes, by class;
a claim or template is read once (cached, as owners are), and one that cannot be read
counts nothing until a later event of the pod asks again.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from producers.base.kubeapi import ApiError
from producers.k8s.objects import PodSpec

__all__ = [
    "DEFAULT_GPU_DEVICE_CLASSES",
    "ClaimLookup",
    "ClaimRequests",
    "claim_devices",
]

log = logging.getLogger(__name__)

DEFAULT_GPU_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
CACHE_SIZE = 10_000

ClaimLookup = Callable[[str, str, str], bytes | None]
"""(kind ResourceClaim or ResourceClaimTemplate, namespace, name) -> the object's JSON;
None when it does not exist or may not be read; ApiError when the answer is unknown."""


def _count(request: Mapping[str, Any]) -> tuple[str | None, int]:
    """(device class, devices) of one request: `exactly` (v1), its fields inline (v1beta1),
    or the first of `firstAvailable` (the one the scheduler prefers). `All` devices of a
    class count one: how many a node has is not known here."""
    exact = request.get("exactly")
    if not isinstance(exact, Mapping):
        first = request.get("firstAvailable")
        exact = first[0] if isinstance(first, list) and first else request
    if not isinstance(exact, Mapping):
        return None, 0
    device_class = exact.get("deviceClassName")
    if exact.get("allocationMode") == "All":
        return device_class, 1
    count = exact.get("count", 1)
    return device_class, count if isinstance(count, int) and count > 0 else 1


def claim_devices(spec: Mapping[str, Any], classes: Collection[str]) -> dict[str, int]:
    """A ResourceClaimSpec's devices of the GPU `classes`, by class."""
    devices = spec.get("devices")
    found: dict[str, int] = {}
    if not isinstance(devices, Mapping):
        return found
    for request in devices.get("requests") or ():
        if isinstance(request, Mapping):
            device_class, count = _count(request)
            if device_class is not None and device_class in classes:
                found[device_class] = found.get(device_class, 0) + count
    return found


@dataclass
class ClaimStats:
    """Claim lookups made and failed, for the watcher's metrics."""

    lookups: int = 0
    failures: int = 0


class ClaimRequests:
    """A pod's GPU request through its claims, one lookup per claim or template."""

    def __init__(
        self,
        lookup: ClaimLookup | None,
        classes: Collection[str] = DEFAULT_GPU_DEVICE_CLASSES,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self._lookup = lookup
        self._classes = frozenset(classes)
        self._cache: OrderedDict[tuple[str, str, str], dict[str, int]] = OrderedDict()
        self._cache_size = cache_size
        self.stats = ClaimStats()

    def of(self, namespace: str, spec: PodSpec) -> dict[str, int]:
        """The GPU devices the pod's claims ask for, by device class; {} without claims."""
        total: dict[str, int] = {}
        if self._lookup is None or not self._classes:
            return total
        for claim in spec.get("resourceClaims") or ():
            if name := claim.get("resourceClaimTemplateName"):
                found = self._devices("ResourceClaimTemplate", namespace, name)
            elif name := claim.get("resourceClaimName"):
                found = self._devices("ResourceClaim", namespace, name)
            else:
                continue
            for device_class, count in (found or {}).items():
                total[device_class] = total.get(device_class, 0) + count
        return total

    def _devices(self, kind: str, namespace: str, name: str) -> dict[str, int] | None:
        key = (kind, namespace, name)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        assert self._lookup is not None
        self.stats.lookups += 1
        try:
            raw = self._lookup(kind, namespace, name)
            obj = json.loads(raw) if raw is not None else None
        except (ApiError, ValueError) as exc:  # an unknown answer: asked again later
            self.stats.failures += 1
            log.warning("claim lookup failed kind=%s object=%s/%s error=%s", kind, namespace,
                        name, exc)  # fmt: skip
            return None
        if obj is None:  # not there (yet) or not ours to read: asked again next time
            return None
        spec: Any = obj.get("spec") or {}
        if kind == "ResourceClaimTemplate":
            spec = spec.get("spec") or {}
        found = claim_devices(spec, self._classes) if isinstance(spec, Mapping) else {}
        self._cache[key] = found
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return found
