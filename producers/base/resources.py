"""Which extended resources are GPUs, as the settings name them: one rule for the kubelet's
allocations and for the Kubernetes objects' requests and capacity."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

__all__ = ["ResourceFilter"]


@dataclass(frozen=True, slots=True)
class ResourceFilter:
    """Extended resource names that are GPUs: exact names (`nvidia.com/gpu`) and name
    prefixes (`nvidia.com/mig-`, the MIG profiles)."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, names: Iterable[str], prefixes: Iterable[str]) -> Self:
        """From the settings' two lists."""
        return cls(frozenset(names), tuple(prefixes))

    def __call__(self, resource: str) -> bool:
        """True when `resource` is one of the GPU resources."""
        return resource in self.names or resource.startswith(self.prefixes)

    def __contains__(self, resource: object) -> bool:
        return isinstance(resource, str) and self(resource)
