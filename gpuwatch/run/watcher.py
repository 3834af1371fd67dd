"""Wires `gpuwatch k8s-watcher`: the cluster's API, three Kafka topics, metrics, signals."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import msgspec
from prometheus_client import CollectorRegistry, start_http_server

from gpuwatch.run.readback import recall_of, window_ms
from producers.base.kafka import KafkaSender
from producers.base.publisher import Publisher
from producers.k8s.client import K8sConfigError, KubernetesApi, connect
from producers.k8s.metrics import WatcherCollector
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import FULL_RESYNC_S
from schemas.codec import TopicSpec
from schemas.settings import Settings
from schemas.topics import K8S_NODES, K8S_PODS, K8S_WORKLOADS

log = logging.getLogger(__name__)

BUFFER_BYTES = 64 << 20  # per topic; ~40,000 pod messages: hours of a busy cluster's churn
DELIVERY_TIMEOUT_S = 600.0  # unanswered this long, a message is sent again (new client)

T = TypeVar("T", bound=msgspec.Struct)


class WatcherStartError(Exception):
    """The watcher cannot start (no cluster configuration); the message says why."""


@dataclass(frozen=True)
class WatcherOptions:
    """What the command line chose on top of the settings."""

    duration_s: float | None = None
    """Stop after this many seconds (scripts, tests); None: until SIGTERM/SIGINT."""


def _publisher(settings: Settings, spec: TopicSpec[Any]) -> Publisher:
    topic = spec.full_name(settings.kafka.topic_prefix)
    sender = KafkaSender(
        settings.kafka,
        topic,
        client_id=f"gpuwatch-k8s-watcher-{spec.name}",
        delivery_timeout_s=DELIVERY_TIMEOUT_S,
    )
    return Publisher(sender, BUFFER_BYTES)


def _emitter(publisher: Publisher, spec: TopicSpec[T]) -> Callable[[T], None]:
    def emit(value: T) -> None:
        publisher.publish(spec.key_of(value).encode(), spec.encode(value))

    return emit


class WatcherService:
    """The running watcher: API client, watches, publishers and /metrics together.

    Before its first lists it reads back what `k8s.pods`, `k8s.nodes` and `k8s.workloads`
    hold (a bounded read, gpuwatch.run.readback), so that what changed while it was down is
    published, deletions included (`final_state_unknown`), and what Kafka never got is sent
    again. The workloads' topic is read only once Kueue is found served.
    """

    def __init__(self, settings: Settings, api: KubernetesApi) -> None:
        self.settings = settings
        self.api = api
        self.publishers = {
            K8S_PODS.name: _publisher(settings, K8S_PODS),
            K8S_NODES.name: _publisher(settings, K8S_NODES),
            K8S_WORKLOADS.name: _publisher(settings, K8S_WORKLOADS),
        }
        cluster = settings.cluster.name
        window = window_ms(FULL_RESYNC_S, settings.watcher.watch_timeout_s)
        self.watcher = K8sWatcher(
            api,
            settings.watcher,
            emit_pod=_emitter(self.publishers[K8S_PODS.name], K8S_PODS),
            emit_node=_emitter(self.publishers[K8S_NODES.name], K8S_NODES),
            emit_workload=_emitter(self.publishers[K8S_WORKLOADS.name], K8S_WORKLOADS),
            cluster=cluster,
            full_resync_s=FULL_RESYNC_S,
            recall_pods=recall_of(settings.kafka, K8S_PODS, cluster, window),
            recall_nodes=recall_of(settings.kafka, K8S_NODES, cluster, window),
            recall_workloads=recall_of(settings.kafka, K8S_WORKLOADS, cluster, window),
        )
        self.registry = CollectorRegistry()
        self.registry.register(
            WatcherCollector(self.watcher.watches, self.watcher.owners.stats, self.publishers)
        )
        self._server: Any = None
        self._server_thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> WatcherService:
        """Connect to the configured cluster (in-cluster config or kubeconfig)."""
        try:
            api = connect(settings.watcher.kubeconfig, settings.watcher.context)
        except K8sConfigError as exc:
            raise WatcherStartError(str(exc)) from exc
        return cls(settings, api)

    def start(self) -> None:
        """Serve /metrics, start the publishers, then the watches."""
        bind, port = self.settings.metrics.bind, self.settings.watcher.metrics_port
        try:
            self._server, self._server_thread = start_http_server(
                port, addr=bind, registry=self.registry
            )
        except OSError as exc:
            raise WatcherStartError(f"cannot serve /metrics on {bind}:{port}: {exc}") from exc
        for publisher in self.publishers.values():
            publisher.start()
        self.watcher.start()

    def stop(self) -> None:
        """Stop watching, flush what is buffered (10 s at most), release everything."""
        self.watcher.stop()
        for publisher in self.publishers.values():
            publisher.stop(timeout_s=10.0)
        self.api.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)


def run(settings: Settings, options: WatcherOptions) -> int:
    """Watch until stopped; SIGTERM and SIGINT flush what is buffered and exit 0."""
    service = WatcherService.from_settings(settings)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping signal=%s", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    watcher = settings.watcher
    log.info(
        "k8s watcher started cluster=%s api=%s namespaces=%s selector=%s gpu_resources=%s "
        "gpu_prefixes=%s dra_drivers=%s topics=%s,%s,%s metrics=%s:%d",
        settings.cluster.name,
        service.api.host,
        ",".join(watcher.namespaces) or "*",
        watcher.label_selector or "-",
        ",".join(watcher.gpu_resources),
        ",".join(watcher.gpu_resource_prefixes),
        ",".join(watcher.dra_drivers) or "-",
        K8S_PODS.full_name(settings.kafka.topic_prefix),
        K8S_NODES.full_name(settings.kafka.topic_prefix),
        K8S_WORKLOADS.full_name(settings.kafka.topic_prefix),
        settings.metrics.bind,
        watcher.metrics_port,
    )
    try:
        service.start()
        stop.wait(options.duration_s)
    finally:
        service.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stats = [watch.stats for watch in service.watcher.watches]
    log.info(
        "k8s watcher stopped events=%d published=%d relists=%d api_errors=%d sent=%d dropped=%d",
        sum(sum(s.events.values()) for s in stats),
        sum(sum(s.published.values()) for s in stats),
        sum(sum(s.relists.values()) for s in stats),
        sum(sum(s.api_errors.values()) for s in stats),
        sum(p.stats.sent for p in service.publishers.values()),
        sum(p.outbox.dropped for p in service.publishers.values()),
    )
    return 0
