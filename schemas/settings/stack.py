"""Settings of the local stack (`gpuwatch stack`): ports, directories, binaries."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from schemas.settings.common import MODEL

__all__ = ["StackSettings"]


class StackSettings(BaseModel):
    """The local stack of `gpuwatch stack`: Kafka, Redis and Prometheus as processes."""

    model_config = MODEL

    state_dir: Path = Path(".state")
    """Data, logs and pid files of the local stack (default: $XDG_STATE_HOME/gpuwatch)."""
    cache_dir: Path = Path(".cache")
    """Downloaded Kafka jars, outside the repository (default: $XDG_CACHE_HOME/gpuwatch)."""
    kafka_version: str = Field(default="4.1.1", pattern=r"^4\.\d+\.\d+$")
    """Apache Kafka 4.x version fetched from Maven Central."""
    kafka_port: int = Field(default=9092, ge=1, le=65535)
    """Broker listener port on 127.0.0.1."""
    kafka_controller_port: int = Field(default=9093, ge=1, le=65535)
    """KRaft controller listener port on 127.0.0.1."""
    kafka_heap: str = Field(default="768m", pattern=r"^\d+[mMgG]$")
    """Java heap of the local broker."""
    redis_port: int = Field(default=6379, ge=1, le=65535)
    """Redis port on 127.0.0.1."""
    prometheus_port: int = Field(default=9090, ge=1, le=65535)
    """Prometheus port on 127.0.0.1."""
    prometheus_config: Path | None = None
    """Prometheus configuration; None: deploy/prometheus/prometheus.yml, as gpuwatch ships it."""
    ready_timeout_s: float = Field(default=90.0, gt=0)
    """How long `stack up` waits for each service to answer."""
    kube: bool = False
    """Also run a Kubernetes API server (etcd and kube-apiserver) in the stack, as
    `stack up --kube` does."""
    kube_port: int = Field(default=16443, ge=1, le=65535)
    """The local kube-apiserver's HTTPS port on 127.0.0.1."""
    etcd_port: int = Field(default=12379, ge=1, le=65535)
    """The local etcd's client port on 127.0.0.1 (the API server's storage)."""
    etcd_peer_port: int = Field(default=12380, ge=1, le=65535)
    """The local etcd's peer port on 127.0.0.1 (a cluster of one)."""
    kube_apiserver: Path | None = None
    """A kube-apiserver binary (1.34 or newer); None: the one scripts/kube-apiserver.sh
    builds once into the cache directory."""
