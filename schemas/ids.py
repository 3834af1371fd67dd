"""Identifier types shared by every topic: distinct names for strings that must not be mixed up."""

from typing import NewType

__all__ = ["AlertFingerprint", "GpuUuid", "NodeName", "PodUid"]

PodUid = NewType("PodUid", str)
"""Kubernetes pod `metadata.uid`; stable for the pod's life, never reused."""

GpuUuid = NewType("GpuUuid", str)
"""NVML device uuid: `GPU-...` for a physical GPU, `MIG-...` for a MIG instance."""

NodeName = NewType("NodeName", str)
"""Kubernetes node name (`spec.nodeName`); the node-agent's identity."""

AlertFingerprint = NewType("AlertFingerprint", str)
"""Stable id of one alert: the same rule on the same subject always has the same one."""
