"""The metric names and labels gpuwatch really exports, read from rendered expositions.

A worker, the two sinks, a node agent and a Kubernetes watcher are each given a little
data, their /metrics text is rendered, and every family is read back with
prometheus_client's parser: what a dashboard or a rule may query is what comes out, not a
list kept by hand.
"""

from __future__ import annotations

from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.empty_node import empty_node_agent

from gpuwatch.harness.examples import example
from gpuwatch.run.progress import StallCollector
from gpuwatch.run.sink import KAFKA, FeedCollector, SinkCollector, redis_writer
from producers.agent.metrics import AgentCollector
from producers.base.publisher import Done, Publisher
from producers.k8s.client import KubernetesApi
from producers.k8s.metrics import WatcherCollector
from producers.k8s.watcher import K8sWatcher
from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.capacity import Capacity
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from schemas.settings import Settings, WatcherSettings
from sinks.prometheus.collector import exposition
from sinks.prometheus.feed import MetricsFeed
from sinks.prometheus.metrics import WorkerMetrics
from streams.core.progress import Stalls

Exported = dict[str, frozenset[str]]
"""Sample name (counters with `_total`) -> the label names its series carry."""

T0 = 1_764_412_000_000


def _read(text: str) -> Exported:
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        sample_name = family.name + ("_total" if family.type == "counter" else "")
        names.setdefault(sample_name, set())
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            names.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in names.items()}


POD = example("gpuwatch.pod.lifecycle/v1")
"""The example pod (ml/train-0, team vision), stalled; two more pods of it: queued, running."""


def worker_metrics(registry: CollectorRegistry, cluster: str | None = None) -> WorkerMetrics:
    """A worker that has seen pods in three states, their usage and windows, three GPUs
    (busy, idle and allocated, free but used by a pod not holding it), an alert, and the
    example capacity picture (H100s: 2 free on each of three nodes, the sample's among
    them, all 6 stranded, 1 reclaimable, 1 pod blocked); all of the default cluster, or of
    the named `cluster` (whose series have a `cluster` label)."""
    metrics = WorkerMetrics(registry, clock=lambda: 0.0)
    named = {} if cluster is None else {"cluster": cluster}
    gpus = example("gpuwatch.nvml.sample/v1")["gpus"]
    busy, idle, free = (gpus[0]["uuid"], "GPU-idle-allocated", "GPU-unallocated")
    pods = {"stalled": POD["uid"], "queued": "uid-queued", "running": "uid-running"}
    for state, uid in pods.items():
        name = {"stalled": POD["pod"], "queued": "wait-0", "running": "serve-0"}[state]
        record = POD | {"uid": uid, "pod": name, "to_state": state, "ts": T0} | named
        metrics.observe_lifecycle(msgspec.convert(record, PodLifecycle))
    usage = example("gpuwatch.pod.usage/v1") | {"ts": T0, "end_ts": T0 + 5000} | named
    metrics.observe_usage(msgspec.convert(usage, PodUsage))
    usage["gpus"][0] |= {"uuid": idle, "share_mean": 0.01}
    metrics.observe_usage(msgspec.convert(usage | {"uid": pods["running"]}, PodUsage))
    window = {"window_start": T0, "window_end": T0 + 60_000, "ts": T0 + 60_000}
    metrics.observe_attribution(
        msgspec.convert(example("gpuwatch.attribution/v1") | window | named, Attribution)
    )
    metrics.observe_gpu_window(
        msgspec.convert(
            example("gpuwatch.gpu.window/v1") | window | {"uuid": busy} | named, GpuWindow
        )
    )
    process = gpus[0]["processes"][0]
    sample = example("gpuwatch.nvml.sample/v1") | {"ts": T0 + 1000} | named
    sample["gpus"] = [
        gpus[0] | {"processes": [process | {"pod_uid": pods["stalled"]}]},
        gpus[0] | {"uuid": idle, "index": 1, "util_pct": 2.0, "processes": []},
        gpus[0] | {"uuid": free, "index": 2, "util_pct": 0.0,
                   "processes": [process | {"pid": 77, "pod_uid": pods["queued"]}]},
    ]  # fmt: skip
    allocation = sample["allocations"][0]
    sample["allocations"] = [
        allocation | {"pod_uid": pods["stalled"], "device_ids": [busy]},
        allocation | {"pod_uid": pods["running"], "pod": "serve-0", "device_ids": [idle]},
    ]
    metrics.observe_sample(msgspec.convert(sample, NvmlSample))
    metrics.observe_alert(msgspec.convert(example("gpuwatch.alert/v1") | named, Alert))
    metrics.observe_capacity(msgspec.convert(example("gpuwatch.capacity/v1") | named, Capacity))
    metrics.count_event("gpuwatch.nvml.samples", 3)
    metrics.count_deadletter("gpuwatch.k8s.pods", "schema")
    metrics.set_lag(1.5)
    return metrics


def worker_exposition(cluster: str | None = None) -> Exported:
    """What `worker_metrics` renders."""
    metrics = worker_metrics(CollectorRegistry(), cluster)
    return _read(exposition(metrics.registry).decode())


class _NoSender:
    delivery_timeout_s = 600.0

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        done(None)

    def abandon(self) -> None:
        return None

    def flush(self, timeout_s: float) -> None:
        return None

    def close(self, timeout_s: float) -> None:
        return None


def agent_registry() -> CollectorRegistry:
    """A node agent's registry after one tick."""
    publisher = Publisher(_NoSender(), max_buffer_bytes=1 << 20)
    agent = empty_node_agent("gpu-node-1", publisher.publish)
    agent.tick()
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, publisher))
    return registry


def watcher_registry() -> CollectorRegistry:
    """The registry of a watcher (never started) whose watches report one of everything."""
    api = KubernetesApi.for_host("http://127.0.0.1:9")
    try:
        watcher = K8sWatcher(api, WatcherSettings(), emit_pod=_ignore, emit_node=_ignore)
    finally:
        api.close()  # never used: the watcher is not started
    for watch in watcher.watches:
        watch.stats.events["ADDED"] += 1
        watch.stats.published["ADDED"] += 1
        watch.stats.relists["initial"] += 1
        watch.stats.api_errors["500"] += 1
        watch.stats.last_event_at = 0.0
    registry = CollectorRegistry()
    publishers = {"k8s.pods": Publisher(_NoSender(), max_buffer_bytes=1 << 20)}
    registry.register(
        WatcherCollector(watcher.watches, watcher.owners.stats, publishers, monotonic=lambda: 1.0)
    )
    return registry


def redis_sink_registry() -> CollectorRegistry:
    """The registry of a Redis sink (never started) that wrote records and live GPU states,
    had one refused, and last took a sample 2.5 s ago."""
    writer = redis_writer(Settings())
    writer.written, writer.rejected, writer.samples = 12, 1, 3
    writer.newest_sample_ms = T0
    registry = CollectorRegistry()
    registry.register(SinkCollector(writer, wall=lambda: T0 / 1000 + 2.5))
    return registry


def metrics_sink_registry() -> CollectorRegistry:
    """The own counters of a metrics sink (never started) that took in a few records; its
    pod and GPU metrics are those of `worker_metrics`."""
    feed = MetricsFeed(Settings(), WorkerMetrics(CollectorRegistry()), kafka=KAFKA)
    feed.records = 9
    registry = CollectorRegistry()
    registry.register(FeedCollector(feed))
    return registry


def agent_exposition() -> Exported:
    """What `agent_registry` renders."""
    return _read(generate_latest(agent_registry()).decode())


def watcher_exposition() -> Exported:
    """What `watcher_registry` renders."""
    return _read(generate_latest(watcher_registry()).decode())


def stall_exposition() -> Exported:
    """The stall gauges of a worker and of a sink holding a partition (gpuwatch/run/progress.py)."""
    registry = CollectorRegistry()
    for prefix, what in (("gpuwatch_worker_", "worker"), ("gpuwatch_sink_", "sink")):
        stalls = Stalls(300.0)
        stalls.hold([("gpuwatch.nvml.samples", 0)])
        registry.register(StallCollector(stalls, prefix, what))
    return _read(generate_latest(registry).decode())


def _ignore(_: Any) -> None:
    return None


def gpuwatch_exposition() -> Exported:
    """Every name the gpuwatch processes export, with their labels."""
    sinks = (redis_sink_registry(), metrics_sink_registry())
    merged: dict[str, frozenset[str]] = {}
    # A named cluster's series have the `cluster` label the default cluster's leave out.
    parts = [worker_exposition(), worker_exposition("east"), agent_exposition()]
    parts += [watcher_exposition(), stall_exposition()]
    parts += [_read(generate_latest(registry).decode()) for registry in sinks]
    for part in parts:
        for name, labels in part.items():
            merged[name] = merged.get(name, frozenset()) | labels
    return merged
