"""Every topic of docs/DESIGN.md §3 in one place: the specs, their order, co-partitioning."""

from typing import Any, Final

from . import (
    alert,
    attribution,
    capacity,
    deadletter,
    gpu_window,
    k8s_node,
    k8s_pod,
    k8s_workload,
    nvml_sample,
    pod_lifecycle,
    pod_usage,
    work_units,
    workload_lifecycle,
)
from .codec import TopicSpec

__all__ = [
    "ALERTS",
    "ALL_TOPICS",
    "ATTRIBUTION",
    "CAPACITY",
    "DEADLETTER",
    "DEFAULT_TOPIC_PREFIX",
    "GPU_WINDOWS",
    "K8S_NODES",
    "K8S_PODS",
    "K8S_WORKLOADS",
    "NVML_SAMPLES",
    "POD_KEYED",
    "POD_LIFECYCLE",
    "POD_USAGE",
    "SINK_TOPICS",
    "WORKLOAD_LIFECYCLE",
    "WORK_UNITS",
    "by_name",
]

DEFAULT_TOPIC_PREFIX: Final = "gpuwatch."

NVML_SAMPLES: Final = nvml_sample.TOPIC
K8S_PODS: Final = k8s_pod.TOPIC
K8S_NODES: Final = k8s_node.TOPIC
K8S_WORKLOADS: Final = k8s_workload.TOPIC
POD_USAGE: Final = pod_usage.TOPIC
POD_LIFECYCLE: Final = pod_lifecycle.TOPIC
ATTRIBUTION: Final = attribution.TOPIC
GPU_WINDOWS: Final = gpu_window.TOPIC
ALERTS: Final = alert.TOPIC
CAPACITY: Final = capacity.TOPIC
WORKLOAD_LIFECYCLE: Final = workload_lifecycle.TOPIC
WORK_UNITS: Final = work_units.TOPIC
DEADLETTER: Final = deadletter.TOPIC

ALL_TOPICS: Final[tuple[TopicSpec[Any], ...]] = (
    NVML_SAMPLES,
    K8S_PODS,
    K8S_NODES,
    POD_USAGE,
    POD_LIFECYCLE,
    ATTRIBUTION,
    GPU_WINDOWS,
    ALERTS,
    CAPACITY,
    K8S_WORKLOADS,
    WORKLOAD_LIFECYCLE,
    WORK_UNITS,
    DEADLETTER,
)
"""All topics, in the order of docs/DESIGN.md §3 (`capacity`, `k8s.workloads`,
`workload.lifecycle` and `work.units` added before `deadletter`)."""

POD_KEYED: Final[tuple[TopicSpec[Any], ...]] = tuple(
    spec for spec in ALL_TOPICS if spec.key == "pod_uid"
)
"""Topics keyed by pod uid: joined by co-partitioning, so they must share a partition count."""

SINK_TOPICS: Final[tuple[TopicSpec[Any], ...]] = (
    POD_LIFECYCLE, ATTRIBUTION, GPU_WINDOWS, ALERTS, CAPACITY
)  # fmt: skip
"""The derived topics a sink reads back (the worker's Redis writer)."""


def by_name(name: str) -> TopicSpec[Any]:
    """The spec of a topic by its unprefixed name (`nvml.samples`); KeyError when unknown."""
    for spec in ALL_TOPICS:
        if spec.name == name:
            return spec
    raise KeyError(name)
