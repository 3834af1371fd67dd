"""The typed settings object of every gpuwatch process, grouped by concern.

The type lives here, beside the other public contracts, so producers, streams and
sinks can take a `Settings` without importing the wiring. The environment and the
YAML file are read in one place only: `gpuwatch.config.load_settings`. Each field
names its environment variable in `ENV_VARS`.
"""

from __future__ import annotations

import json
import ssl
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from schemas.fields import DEFAULT_CLUSTER, Cluster
from schemas.prices import BUILTIN_PRICES, PriceTable

_MODEL = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


def cluster_name(value: object) -> str:
    """`value` if it is a cluster name by the rule of `schemas.fields.Cluster`, the type
    every message's `cluster` field has; ValueError saying what a name may hold if not."""
    if value is None or value == "":
        raise ValueError(f"empty; leave it unset for the cluster {DEFAULT_CLUSTER!r}")
    try:
        return msgspec.convert(value, Cluster)
    except msgspec.ValidationError as exc:
        raise ValueError(
            f"{value!r} is not a cluster name: 1 to 63 letters, digits, '.', '_' or '-', "
            f"starting and ending with a letter or digit ({exc})"
        ) from exc


class ClusterSettings(BaseModel):
    """Which cluster the producers speak for, where many clusters feed one pipeline."""

    model_config = _MODEL

    name: str = DEFAULT_CLUSTER
    """The cluster every message of the node agent and the Kubernetes watcher carries.
    Node names repeat across clusters; give each cluster its own name. The default
    cluster's messages leave the field out, so a single-cluster set-up sends what it
    sent before clusters had names."""

    _name = field_validator("name", mode="before")(cluster_name)


class KafkaSettings(BaseModel):
    """Where the brokers are and how topics are named and sized."""

    model_config = _MODEL

    bootstrap: str = Field(default="127.0.0.1:9092", min_length=1)
    """Comma-separated bootstrap servers, host:port."""
    topic_prefix: str = Field(default="gpuwatch.", pattern=r"^[A-Za-z0-9._-]*$")
    """Prefix of every topic name; a replay re-processes into another prefix."""
    app_id: str = Field(default="gpuwatch", min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    """Faust app id, which is also the consumer group of the workers."""
    partitions: int = Field(default=12, ge=1, le=10_000)
    """Partitions of every topic; one count for all so pod-uid keyed topics are
    co-partitioned. 12 divides evenly among 1, 2, 3, 4 or 6 workers."""
    replication_factor: int = Field(default=1, ge=1, le=32)
    """Replication factor of created topics (1 for the local single-node stack)."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """Kafka security protocol."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """SASL mechanism when the protocol is SASL_*."""
    sasl_username: str | None = None
    """SASL user name."""
    sasl_password: SecretStr | None = None
    """SASL password (never logged)."""
    ssl_cafile: Path | None = None
    """CA bundle for SSL / SASL_SSL."""
    ssl_certfile: Path | None = None
    """Client certificate (PEM, with its chain) for brokers that authenticate clients by
    certificate (mutual TLS: SSL); set together with ssl_keyfile."""
    ssl_keyfile: Path | None = None
    """Private key (PEM, unencrypted) of ssl_certfile."""

    @field_validator("bootstrap")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port[,host:port...], got {server.strip()!r}")
        return value

    @model_validator(mode="after")
    def _client_certificate(self) -> KafkaSettings:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "GPUWATCH_KAFKA_SSL_CERTFILE and GPUWATCH_KAFKA_SSL_KEYFILE go together "
                "(a client certificate and its key)"
            )
        if self.ssl_certfile is not None and self.security_protocol not in ("SSL", "SASL_SSL"):
            raise ValueError(
                "a client certificate (GPUWATCH_KAFKA_SSL_CERTFILE) needs "
                f"GPUWATCH_KAFKA_SECURITY_PROTOCOL SSL or SASL_SSL, not {self.security_protocol}"
            )
        return self

    @property
    def servers(self) -> list[str]:
        """The bootstrap servers as a list."""
        return [server.strip() for server in self.bootstrap.split(",")]

    def client_options(self) -> dict[str, Any]:
        """Connection options in the names kafka-python and aiokafka share."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.servers,
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism is not None:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            if self.sasl_password is not None:
                options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        if self.ssl_cafile is not None:
            options["ssl_cafile"] = str(self.ssl_cafile)
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            options["ssl_certfile"] = str(self.ssl_certfile)
            options["ssl_keyfile"] = str(self.ssl_keyfile)
        return options

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the SSL protocols (the CA file when one is set, the client
        certificate and key when set); None otherwise.

        For the clients that take a context rather than file names (aiokafka, Faust)."""
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        cafile = None if self.ssl_cafile is None else str(self.ssl_cafile)
        context = ssl.create_default_context(cafile=cafile)
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            context.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile))
        return context


class RedisSettings(BaseModel):
    """The live-state store."""

    model_config = _MODEL

    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    """redis:// or rediss:// (TLS) URL; may hold a password, so it is kept secret."""
    finished_ttl_s: int = Field(default=86_400, ge=60)
    """Seconds a finished pod's keys stay in Redis."""

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected a redis://, rediss:// or unix:// URL")
        return value


class MetricsSettings(BaseModel):
    """The Prometheus endpoint of each process."""

    model_config = _MODEL

    port: int = Field(default=9480, ge=1, le=65535)
    """Port of the worker's /metrics endpoint."""
    bind: str = "127.0.0.1"
    """Address /metrics binds to; 127.0.0.1 unless something must scrape from outside
    (the Helm chart sets 0.0.0.0 inside the pod)."""


class WindowSettings(BaseModel):
    """Event-time windows."""

    model_config = _MODEL

    window_s: int = Field(default=60, ge=1, le=86_400)
    """Length of attribution and idle/waste windows, in seconds."""
    allowed_lateness_s: int = Field(default=10, ge=0, le=86_400)
    """How long after its end a window waits for late data before it closes."""
    source_idle_after_s: int = Field(default=60, ge=1, le=86_400)
    """A node partition caught up with its input and this far (event time, at least its
    longest sample interval) behind the others' is idle: it no longer holds the pod side's
    watermark back. Data it sends later for windows closed meanwhile is late."""
    revision_horizon_s: int = Field(default=3_600, ge=0, le=7 * 86_400)
    """How long (event time, behind the stream time) a closed window can still be revised:
    usage that arrives after its window closed, within this horizon, emits the window's
    whole record again with a higher `revision`. Later than that it is late and counted.
    An hour covers a node agent's outbox draining after an hour without Kafka; 0 turns
    revisions off."""
    max_clock_skew_s: int = Field(default=300, ge=1, le=86_400)
    """A sample, node or pod event dated more than this ahead of the worker's wall clock
    goes to the dead-letter topic and moves no stream time: one wrong clock (or a producer
    holding the Kafka credential) would otherwise close every other node's windows."""


class ClusterRules(BaseModel):
    """The thresholds one cluster sets apart from the others; None: as `RuleSettings`."""

    model_config = _MODEL

    idle_util_pct: float | None = Field(default=None, ge=0, le=100)
    stall_after_s: int | None = Field(default=None, ge=1)
    queued_alert_after_s: int | None = Field(default=None, ge=1)
    idle_alert_after_s: int | None = Field(default=None, ge=1)
    telemetry_missing_after_s: int | None = Field(default=None, ge=1)
    throttle_alert_after_s: int | None = Field(default=None, ge=1)
    xid_alert_hold_s: int | None = Field(default=None, ge=1)


def _json_mapping(value: Any) -> Any:
    """A JSON object in a string (as an environment variable carries one) to a dict."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON object of clusters: {exc}") from exc
    return value


class RuleSettings(BaseModel):
    """Thresholds of the lifecycle state machine and the alert rules."""

    model_config = _MODEL

    idle_util_pct: float = Field(default=5.0, ge=0, le=100)
    """A GPU (or a pod's share of it) under this utilization % is idle."""
    stall_after_s: int = Field(default=300, ge=1)
    """A running pod idle on all its GPUs this long is stalled; shorter flaps on
    data-loader pauses and checkpoints."""
    queued_alert_after_s: int = Field(default=600, ge=1)
    """A pod queued this long raises PodQueuedTooLong."""
    idle_alert_after_s: int = Field(default=60, ge=1)
    """An allocated GPU idle this long raises GpuIdleAllocated: seconds, not the many
    minutes of a dashboard rule over scraped averages."""
    telemetry_missing_after_s: int = Field(default=30, ge=1)
    """A node with no sample for this long (stream time) raises NodeTelemetryMissing;
    30 ticks at 1 Hz, so a lost sample or two is not a dead node."""
    throttle_alert_after_s: int = Field(default=60, ge=1)
    """A GPU slowed by heat or power (hw/sw thermal slowdown, power brake, HW slowdown)
    on consecutive samples this long raises GpuThrottled."""
    xid_alert_hold_s: int = Field(default=300, ge=1)
    """GpuXidError resolves this long (stream time) after the last sample that reported
    its code on its GPU: an Xid is an event, not a state."""
    clusters: dict[str, ClusterRules] = {}
    """Thresholds of named clusters that differ from the ones above (a dev cluster idles
    more than a training one): `{"dev": {"idle_util_pct": 10}}`. A cluster not named, or
    a threshold a cluster leaves out, takes the value above."""

    @field_validator("clusters", mode="before")
    @classmethod
    def _clusters(cls, value: Any) -> Any:
        value = _json_mapping(value)
        if isinstance(value, dict):
            for name in value:
                cluster_name(name)
        return value

    @cached_property
    def by_cluster(self) -> dict[str, RuleSettings]:
        """The thresholds in force in each cluster of `clusters`."""
        base = self.model_dump(exclude={"clusters"})
        return {
            name: RuleSettings.model_validate(base | own.model_dump(exclude_none=True))
            for name, own in self.clusters.items()
        }

    def of(self, cluster: str) -> RuleSettings:
        """The thresholds in force in `cluster`: its own where it has some, else these."""
        if not self.clusters:
            return self
        return self.by_cluster.get(cluster, self)


class WorkerSettings(BaseModel):
    """How each worker process runs."""

    model_config = _MODEL

    tick_interval_s: float = Field(default=1.0, gt=0, le=60)
    """Seconds between stream-time ticks: how soon after data stops windows close, stalls
    and queued alerts fire, and silent nodes are noticed."""
    session_timeout_s: float = Field(default=30.0, ge=6, le=300)
    """Kafka consumer session: a worker silent this long loses its partitions to the
    others (6 s is the broker's lowest allowed by default)."""
    sinks: bool = True
    """Export /metrics (pods, GPUs, pipeline); off, the worker only publishes the derived
    topics. Redis is written by `gpuwatch sink redis`, a process of its own."""
    input_end_ms: int | None = Field(default=None, ge=0)
    """Event time (epoch ms) the input ends at, for a replay of a range (`replay --rerun`):
    once caught up, the worker closes every window up to it instead of waiting for more.
    None for a live worker, whose windows wait for the data that moves stream time."""
    stall_limit_s: float = Field(default=300.0, gt=0)
    """Seconds a partition the worker holds may have records waiting while its commit does
    not move before /livez answers 503 (and `GpuwatchWorkerStalled` fires): a worker whose
    processing stopped still answers /metrics. Five minutes: longer than a busy table's
    restore after a rebalance, far shorter than a stuck worker going unnoticed."""
    align_ahead_s: int = Field(default=600, ge=0, le=86_400)
    """Watermark alignment: a node partition whose stream time is more than this far ahead
    of the lowest one is not read until the others catch up (0: never paused). Behind a
    backlog, the pod side holds the usage of every node partition ahead of the slowest in
    memory; aligned, that is at most this much event time of the fleet's usage, however long
    the backlog. Live, the partitions are seconds apart and none is paused. Keep it well
    above `GPUWATCH_SOURCE_IDLE_AFTER_S`: a partition whose nodes stopped is only taken for
    idle once the others are that far past it."""
    align_stuck_s: float = Field(default=30.0, gt=0, le=3600)
    """Seconds the lowest stream time may stay still while partitions are paused for it
    before they are read again anyway (`gpuwatch_alignment_released_total`): a slowest
    partition that does not move (its worker gone, its records stuck) must not stop the
    others."""


class SinkSettings(BaseModel):
    """How each `gpuwatch sink` process runs."""

    model_config = _MODEL

    metrics_port: int = Field(default=9483, ge=1, le=65535)
    """Port of the Redis sink's own /metrics (written, refused, lag)."""
    exporter_port: int = Field(default=9484, ge=1, le=65535)
    """Port of `gpuwatch sink metrics`: the pod and GPU metrics."""
    stall_limit_s: float = Field(default=300.0, gt=0)
    """Seconds a partition a sink holds may have records waiting while the sink takes none
    in (writes nothing) before its /livez answers 503 (and `GpuwatchSinkStalled` fires)."""


class CostSettings(BaseModel):
    """Prices that turn GPU-seconds into dollars."""

    model_config = _MODEL

    prices_file: Path | None = None
    """YAML or JSON price table; None uses the built-in table."""
    prices: PriceTable = BUILTIN_PRICES
    """The price table in force (loaded from prices_file when set)."""


class StackSettings(BaseModel):
    """The local stack of `gpuwatch stack`: Kafka, Redis and Prometheus as processes."""

    model_config = _MODEL

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
    """Prometheus configuration; None: deploy/prometheus/prometheus.yml of this checkout."""
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


def _comma_list(value: Any) -> Any:
    """A comma-separated string (as environment variables carry lists) to a tuple."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


class AgentSettings(BaseModel):
    """The node agent: where it reads, how often, how much it buffers."""

    model_config = _MODEL

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

    model_config = _MODEL

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


class Settings(BaseModel):
    """Everything a gpuwatch process is configured with."""

    model_config = _MODEL

    cluster: ClusterSettings = ClusterSettings()
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    metrics: MetricsSettings = MetricsSettings()
    windows: WindowSettings = WindowSettings()
    rules: RuleSettings = RuleSettings()
    cost: CostSettings = CostSettings()
    worker: WorkerSettings = WorkerSettings()
    sink: SinkSettings = SinkSettings()
    stack: StackSettings = StackSettings()
    agent: AgentSettings = AgentSettings()
    watcher: WatcherSettings = WatcherSettings()


# Environment variable -> (group, field). The public names of docs/DESIGN.md §6 first.
ENV_VARS: dict[str, tuple[str, str]] = {
    "GPUWATCH_KAFKA_BOOTSTRAP": ("kafka", "bootstrap"),
    "GPUWATCH_TOPIC_PREFIX": ("kafka", "topic_prefix"),
    "GPUWATCH_APP_ID": ("kafka", "app_id"),
    "GPUWATCH_REDIS_URL": ("redis", "url"),
    "GPUWATCH_METRICS_PORT": ("metrics", "port"),
    "GPUWATCH_WINDOW_S": ("windows", "window_s"),
    "GPUWATCH_ALLOWED_LATENESS_S": ("windows", "allowed_lateness_s"),
    "GPUWATCH_SOURCE_IDLE_AFTER_S": ("windows", "source_idle_after_s"),
    "GPUWATCH_REVISION_HORIZON_S": ("windows", "revision_horizon_s"),
    "GPUWATCH_MAX_CLOCK_SKEW_S": ("windows", "max_clock_skew_s"),
    "GPUWATCH_IDLE_UTIL_PCT": ("rules", "idle_util_pct"),
    "GPUWATCH_STALL_AFTER_S": ("rules", "stall_after_s"),
    "GPUWATCH_QUEUED_ALERT_AFTER_S": ("rules", "queued_alert_after_s"),
    "GPUWATCH_PRICES": ("cost", "prices_file"),
    "GPUWATCH_CLUSTER": ("cluster", "name"),
    "GPUWATCH_IDLE_ALERT_AFTER_S": ("rules", "idle_alert_after_s"),
    "GPUWATCH_TELEMETRY_MISSING_AFTER_S": ("rules", "telemetry_missing_after_s"),
    "GPUWATCH_CLUSTER_RULES": ("rules", "clusters"),
    "GPUWATCH_THROTTLE_ALERT_AFTER_S": ("rules", "throttle_alert_after_s"),
    "GPUWATCH_XID_ALERT_HOLD_S": ("rules", "xid_alert_hold_s"),
    "GPUWATCH_WORKER_TICK_INTERVAL_S": ("worker", "tick_interval_s"),
    "GPUWATCH_WORKER_SESSION_TIMEOUT_S": ("worker", "session_timeout_s"),
    "GPUWATCH_WORKER_SINKS": ("worker", "sinks"),
    "GPUWATCH_WORKER_INPUT_END_MS": ("worker", "input_end_ms"),
    "GPUWATCH_WORKER_STALL_LIMIT_S": ("worker", "stall_limit_s"),
    "GPUWATCH_WORKER_ALIGN_AHEAD_S": ("worker", "align_ahead_s"),
    "GPUWATCH_WORKER_ALIGN_STUCK_S": ("worker", "align_stuck_s"),
    "GPUWATCH_SINK_METRICS_PORT": ("sink", "metrics_port"),
    "GPUWATCH_SINK_EXPORTER_PORT": ("sink", "exporter_port"),
    "GPUWATCH_SINK_STALL_LIMIT_S": ("sink", "stall_limit_s"),
    "GPUWATCH_KAFKA_PARTITIONS": ("kafka", "partitions"),
    "GPUWATCH_KAFKA_REPLICATION_FACTOR": ("kafka", "replication_factor"),
    "GPUWATCH_KAFKA_SECURITY_PROTOCOL": ("kafka", "security_protocol"),
    "GPUWATCH_KAFKA_SASL_MECHANISM": ("kafka", "sasl_mechanism"),
    "GPUWATCH_KAFKA_SASL_USERNAME": ("kafka", "sasl_username"),
    "GPUWATCH_KAFKA_SASL_PASSWORD": ("kafka", "sasl_password"),
    "GPUWATCH_KAFKA_SSL_CAFILE": ("kafka", "ssl_cafile"),
    "GPUWATCH_KAFKA_SSL_CERTFILE": ("kafka", "ssl_certfile"),
    "GPUWATCH_KAFKA_SSL_KEYFILE": ("kafka", "ssl_keyfile"),
    "GPUWATCH_FINISHED_TTL_S": ("redis", "finished_ttl_s"),
    "GPUWATCH_METRICS_BIND": ("metrics", "bind"),
    "GPUWATCH_STATE_DIR": ("stack", "state_dir"),
    "GPUWATCH_CACHE_DIR": ("stack", "cache_dir"),
    "GPUWATCH_KAFKA_VERSION": ("stack", "kafka_version"),
    "GPUWATCH_STACK_KAFKA_PORT": ("stack", "kafka_port"),
    "GPUWATCH_STACK_KAFKA_CONTROLLER_PORT": ("stack", "kafka_controller_port"),
    "GPUWATCH_STACK_KAFKA_HEAP": ("stack", "kafka_heap"),
    "GPUWATCH_STACK_REDIS_PORT": ("stack", "redis_port"),
    "GPUWATCH_STACK_PROMETHEUS_PORT": ("stack", "prometheus_port"),
    "GPUWATCH_PROMETHEUS_CONFIG": ("stack", "prometheus_config"),
    "GPUWATCH_STACK_READY_TIMEOUT_S": ("stack", "ready_timeout_s"),
    "GPUWATCH_STACK_KUBE": ("stack", "kube"),
    "GPUWATCH_STACK_KUBE_PORT": ("stack", "kube_port"),
    "GPUWATCH_STACK_ETCD_PORT": ("stack", "etcd_port"),
    "GPUWATCH_STACK_ETCD_PEER_PORT": ("stack", "etcd_peer_port"),
    "GPUWATCH_KUBE_APISERVER": ("stack", "kube_apiserver"),
    "GPUWATCH_NODE_NAME": ("agent", "node_name"),
    "GPUWATCH_AGENT_INTERVAL_S": ("agent", "interval_s"),
    "GPUWATCH_AGENT_METRICS_PORT": ("agent", "metrics_port"),
    "GPUWATCH_AGENT_BUFFER_BYTES": ("agent", "buffer_bytes"),
    "GPUWATCH_AGENT_DELIVERY_TIMEOUT_S": ("agent", "delivery_timeout_s"),
    "GPUWATCH_KUBELET_SOCKET": ("agent", "kubelet_socket"),
    "GPUWATCH_POD_LOGS_DIR": ("agent", "pod_logs_dir"),
    "GPUWATCH_PROC_ROOT": ("agent", "proc_root"),
    "GPUWATCH_GPU_RESOURCES": ("agent", "gpu_resources"),
    "GPUWATCH_GPU_RESOURCE_PREFIXES": ("agent", "gpu_resource_prefixes"),
    "GPUWATCH_DRA_DRIVERS": ("agent", "dra_drivers"),
    "GPUWATCH_WORK_ENABLED": ("agent", "work_enabled"),
    "GPUWATCH_WORK_INTERVAL_S": ("agent", "work_interval_s"),
    "GPUWATCH_WORK_TIMEOUT_S": ("agent", "work_timeout_s"),
    "GPUWATCH_WORK_MAX_BYTES": ("agent", "work_max_bytes"),
    "GPUWATCH_WORK_MAX_SERIES": ("agent", "work_max_series"),
    "GPUWATCH_KUBECONFIG": ("watcher", "kubeconfig"),
    "GPUWATCH_KUBE_CONTEXT": ("watcher", "context"),
    "GPUWATCH_WATCH_NAMESPACES": ("watcher", "namespaces"),
    "GPUWATCH_WATCH_LABEL_SELECTOR": ("watcher", "label_selector"),
    "GPUWATCH_WATCH_GPU_RESOURCES": ("watcher", "gpu_resources"),
    "GPUWATCH_WATCH_GPU_RESOURCE_PREFIXES": ("watcher", "gpu_resource_prefixes"),
    "GPUWATCH_WATCH_EXTRA_PODS": ("watcher", "extra_pods"),
    "GPUWATCH_WATCH_CLAIM_PODS": ("watcher", "claim_pods"),
    "GPUWATCH_WATCH_GPU_DEVICE_CLASSES": ("watcher", "gpu_device_classes"),
    "GPUWATCH_WATCH_DRA_DRIVERS": ("watcher", "dra_drivers"),
    "GPUWATCH_WATCH_WORKLOADS": ("watcher", "watch_workloads"),
    "GPUWATCH_POD_LABEL_ALLOWLIST": ("watcher", "pod_label_allowlist"),
    "GPUWATCH_NODE_LABEL_ALLOWLIST": ("watcher", "node_label_allowlist"),
    "GPUWATCH_WATCHER_METRICS_PORT": ("watcher", "metrics_port"),
    "GPUWATCH_WATCH_TIMEOUT_S": ("watcher", "watch_timeout_s"),
}
