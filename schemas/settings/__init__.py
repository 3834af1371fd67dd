"""The typed settings object of every gpuwatch process, grouped by concern.

The type lives here, beside the other public contracts, so producers, streams and
sinks can take a `Settings` without importing the wiring. The environment and the
YAML file are read in one place only: `gpuwatch.config.load_settings`. Each field
names its environment variable in `ENV_VARS`.

The groups live in modules of their own by what they configure: `connections` (the
cluster, Kafka, Redis, /metrics), `stream` (windows, rules, worker, sinks, cost), `producers`
(node agent, watcher) and `stack`; `Settings` and `ENV_VARS` here gather them, and every
name is importable from `schemas.settings`.
"""

from __future__ import annotations

from pydantic import BaseModel

from schemas.settings.common import MODEL, cluster_name
from schemas.settings.connections import (
    ClusterSettings,
    KafkaSettings,
    MetricsSettings,
    RedisSettings,
)
from schemas.settings.producers import AgentSettings, WatcherSettings
from schemas.settings.stack import StackSettings
from schemas.settings.stream import (
    ClusterRules,
    CostSettings,
    RuleSettings,
    SinkSettings,
    WindowSettings,
    WorkerSettings,
)

__all__ = [
    "ENV_VARS",
    "AgentSettings",
    "ClusterRules",
    "ClusterSettings",
    "CostSettings",
    "KafkaSettings",
    "MetricsSettings",
    "RedisSettings",
    "RuleSettings",
    "Settings",
    "SinkSettings",
    "StackSettings",
    "WatcherSettings",
    "WindowSettings",
    "WorkerSettings",
    "cluster_name",
]


class Settings(BaseModel):
    """Everything a gpuwatch process is configured with."""

    model_config = MODEL

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
