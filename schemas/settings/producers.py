"""Settings of the producers: the node agent and the Kubernetes watcher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from schemas.settings.common import MODEL

__all__ = ["AgentSettings", "WatcherSettings"]


def _comma_list(value: Any) -> Any:
    """A comma-separated string (as environment variables carry lists) to a tuple."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


class AgentSettings(BaseModel):
    """The node agent: where it reads, how often, how much it buffers."""

    model_config = MODEL

    node_name: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """Kubernetes node name; None: this host's name (set it from the downward API)."""
    interval_s: float = Field(default=1.0, ge=0.1, le=60)
    """Seconds between samples; 0.1 at the fastest (NVML averages utilization over
    about that long)."""
    metrics_port: int = Field(default=9481, ge=1, le=65535)
    """Port of the agent's own /metrics (0.0.0.0 only if metrics.bind says so)."""
    buffer_bytes: int = Field(default=64 << 20, ge=1 << 16)
    """Bytes of samples kept until Kafka acknowledges them; past it the oldest waiting are
    dropped (counted). 64 MiB is about 2 hours of a busy 8-GPU node at 1 Hz (8.3 KB a
    sample with three processes a GPU; about 3.5 hours idle, 5.3 KB)."""
    delivery_timeout_s: float = Field(default=600.0, ge=10)
    """Seconds the Kafka client may go without acknowledging samples in flight before the
    agent abandons it and sends them again, in order, through a fresh client (counted in
    `gpuwatch_agent_retried_total`); nothing is lost by it while the buffer has room."""
    kubelet_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    """The kubelet PodResources gRPC socket."""
    pod_logs_dir: Path = Path("/var/log/pods")
    """Where the kubelet keeps `<namespace>_<pod>_<uid>` folders (pod uids by name)."""
    proc_root: Path = Path("/proc")
    """The host's /proc (the DaemonSet runs with hostPID)."""
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
    """Extended resource names that are GPUs."""
    gpu_resource_prefixes: tuple[str, ...] = ("nvidia.com/mig-",)
    """Resource name prefixes that are GPUs (MIG profiles)."""
    dra_drivers: tuple[str, ...] = ("gpu.nvidia.com",)
    """DRA drivers whose claim devices are GPUs; their uuids come from this node's
    ResourceSlices (read from the API server, as `watcher.kubeconfig` or the pod's
    service account allows, only once such a device is allocated). Empty: off."""

    work_enabled: bool = True
    """Whether the agent scrapes the units of work of its node's opted-in pods (it lists
    them from the API server: RBAC `list pods`)."""
    work_interval_s: float = Field(default=15.0, ge=1, le=3600)
    """Seconds between scrapes of the units of work of the node's opted-in pods (the
    `gpuwatch.io/work` annotation)."""
    work_timeout_s: float = Field(default=5.0, gt=0, le=60)
    """How long one scrape of a pod's metrics may take; past it the scrape fails (counted,
    tried again next interval)."""
    work_max_bytes: int = Field(default=4 << 20, ge=1 << 10)
    """Largest exposition read from one pod; a longer one is dropped (counted)."""
    work_max_series: int = Field(default=20_000, ge=1)
    """Most samples parsed from one pod's exposition; past it the scrape is dropped."""

    _lists = field_validator(
        "gpu_resources", "gpu_resource_prefixes", "dra_drivers", mode="before"
    )(_comma_list)


class WatcherSettings(BaseModel):
    """The Kubernetes watcher: which pods and nodes, which labels, how it connects."""

    model_config = MODEL

    kubeconfig: Path | None = None
    """Kubeconfig file; None: in-cluster config, else ~/.kube/config."""
    context: str | None = None
    """Kubeconfig context; None: the current one."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty: all (one cluster-wide watch)."""
    label_selector: str | None = None
    """Only pods matching this label selector (Kubernetes syntax)."""
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
    """Resource names that make a pod a GPU pod."""
    gpu_resource_prefixes: tuple[str, ...] = ("nvidia.com/mig-",)
    """Resource name prefixes that make a pod a GPU pod."""
    extra_pods: tuple[str, ...] = ()
    """`namespace/name` of pods to publish though they request no GPU (a GPU reached
    through NVIDIA_VISIBLE_DEVICES)."""
    watch_workloads: bool = True
    """Watch Kueue's Workloads (`k8s.workloads`) where the cluster serves them; with
    Kueue absent nothing is asked but, every 5 minutes, whether it is there now."""
    claim_pods: bool = True
    """Publish pods that use ResourceClaims (GPUs allocated through DRA), their GPU
    request read from their claims (or claim templates): the devices of
    `gpu_device_classes`, by class."""
    gpu_device_classes: tuple[str, ...] = ("gpu.nvidia.com", "mig.nvidia.com")
    """DeviceClasses whose devices are GPUs (the NVIDIA DRA driver's)."""
    dra_drivers: tuple[str, ...] = ("gpu.nvidia.com",)
    """DRA drivers whose devices are GPUs: their ResourceSlices are watched (where the
    cluster serves `resource.k8s.io`) and each node's devices added to its GPU capacity
    and allocatable, by resource name (`gpu.nvidia.com/gpu`). Empty: not watched."""
    pod_label_allowlist: tuple[str, ...] = (
        "team",
        "project",
        "app.kubernetes.io/name",
        "kueue.x-k8s.io/queue-name",
    )
    """Pod labels copied into messages; never all labels (cardinality, secrets)."""
    node_label_allowlist: tuple[str, ...] = (
        "node.kubernetes.io/instance-type",
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.replicas",
        "nvidia.com/mig.strategy",
        "cloud.google.com/gke-nodepool",
        "eks.amazonaws.com/nodegroup",
        "karpenter.sh/nodepool",
        "karpenter.sh/capacity-type",
    )
    """Node labels copied into messages."""
    metrics_port: int = Field(default=9482, ge=1, le=65535)
    """Port of the watcher's own /metrics."""
    watch_timeout_s: int = Field(default=300, ge=10, le=3600)
    """Server-side timeout of one watch request; it is renewed silently."""

    _lists = field_validator(
        "namespaces",
        "gpu_resources",
        "gpu_resource_prefixes",
        "extra_pods",
        "gpu_device_classes",
        "dra_drivers",
        "pod_label_allowlist",
        "node_label_allowlist",
        mode="before",
    )(_comma_list)
