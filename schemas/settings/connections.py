"""Settings of where a process connects and for whom: the cluster, Kafka, Redis, /metrics."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from schemas.fields import DEFAULT_CLUSTER
from schemas.settings.common import MODEL, cluster_name

__all__ = ["ClusterSettings", "KafkaSettings", "MetricsSettings", "RedisSettings"]


class ClusterSettings(BaseModel):
    """Which cluster the producers speak for, where many clusters feed one pipeline."""

    model_config = MODEL

    name: str = DEFAULT_CLUSTER
    """The cluster every message of the node agent and the Kubernetes watcher carries.
    Node names repeat across clusters; give each cluster its own name. The default
    cluster's messages leave the field out, so a single-cluster set-up sends what it
    sent before clusters had names."""

    _name = field_validator("name", mode="before")(cluster_name)


class KafkaSettings(BaseModel):
    """Where the brokers are and how topics are named and sized."""

    model_config = MODEL

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

    model_config = MODEL

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

    model_config = MODEL

    port: int = Field(default=9480, ge=1, le=65535)
    """Port of the worker's /metrics endpoint."""
    bind: str = "127.0.0.1"
    """Address /metrics binds to; 127.0.0.1 unless something must scrape from outside
    (the Helm chart sets 0.0.0.0 inside the pod)."""
