"""The typed settings object of every gpuwatch process, grouped by concern.

The type lives here, beside the other public contracts, so producers, streams and
sinks can take a `Settings` without importing the wiring. The environment and the
YAML file are read in one place only: `gpuwatch.config.load_settings`. Each field
names its environment variable in `ENV_VARS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from schemas.prices import BUILTIN_PRICES, PriceTable

_MODEL = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


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

    @field_validator("bootstrap")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port[,host:port...], got {server.strip()!r}")
        return value

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
        return options


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


class Settings(BaseModel):
    """Everything a gpuwatch process is configured with."""

    model_config = _MODEL

    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    metrics: MetricsSettings = MetricsSettings()
    windows: WindowSettings = WindowSettings()
    rules: RuleSettings = RuleSettings()
    cost: CostSettings = CostSettings()
    stack: StackSettings = StackSettings()


# Environment variable -> (group, field). The public names of DESIGN.md §6 first.
ENV_VARS: dict[str, tuple[str, str]] = {
    "GPUWATCH_KAFKA_BOOTSTRAP": ("kafka", "bootstrap"),
    "GPUWATCH_TOPIC_PREFIX": ("kafka", "topic_prefix"),
    "GPUWATCH_APP_ID": ("kafka", "app_id"),
    "GPUWATCH_REDIS_URL": ("redis", "url"),
    "GPUWATCH_METRICS_PORT": ("metrics", "port"),
    "GPUWATCH_WINDOW_S": ("windows", "window_s"),
    "GPUWATCH_ALLOWED_LATENESS_S": ("windows", "allowed_lateness_s"),
    "GPUWATCH_IDLE_UTIL_PCT": ("rules", "idle_util_pct"),
    "GPUWATCH_STALL_AFTER_S": ("rules", "stall_after_s"),
    "GPUWATCH_QUEUED_ALERT_AFTER_S": ("rules", "queued_alert_after_s"),
    "GPUWATCH_PRICES": ("cost", "prices_file"),
    "GPUWATCH_KAFKA_PARTITIONS": ("kafka", "partitions"),
    "GPUWATCH_KAFKA_REPLICATION_FACTOR": ("kafka", "replication_factor"),
    "GPUWATCH_KAFKA_SECURITY_PROTOCOL": ("kafka", "security_protocol"),
    "GPUWATCH_KAFKA_SASL_MECHANISM": ("kafka", "sasl_mechanism"),
    "GPUWATCH_KAFKA_SASL_USERNAME": ("kafka", "sasl_username"),
    "GPUWATCH_KAFKA_SASL_PASSWORD": ("kafka", "sasl_password"),
    "GPUWATCH_KAFKA_SSL_CAFILE": ("kafka", "ssl_cafile"),
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
}
