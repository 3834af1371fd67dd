"""The pod, GPU and capacity metrics fed from the topics: the consumer of `gpuwatch sink
metrics`.

`MetricsFeed` reads pod.lifecycle, attribution, gpu.windows, pod.usage, nvml.samples and
capacity in a consumer group of its own (`{app_id}.metrics`: replicas share the partitions)
and hands each decoded record to a `WorkerMetrics`, which serves them at scrape time. A
worker no longer keeps them: its core does stream processing only.

Its state is rebuilt from the topics whenever a partition comes to it (a start, or a
rebalance that moved the partition here). pod.lifecycle and capacity are read from the
start of their retention: the latest record of a pod (its state) or of a capacity key (the
picture now) can be of any age, since a record is written only when something changes, so
only the whole retention is sure to hold it. The cost is one pass over a partition's history
when it comes here; both topics carry a record per change (a pod's transition, a new
picture of a model's capacity), not per sample, and keep 30 days. A finish
older than `LOOKBACK_S` drops the pod instead of showing it: its series would be gone
already. A capacity key whose last record fell out of the retention (nothing changed for
30 days) is not shown; older records of a key change nothing (only a later `ts` replaces a
picture). The other topics are read from `LOOKBACK_S` back in wall time (the record
timestamps), enough for the live readings, and the counters go on from zero, as after any
restart of an exporter. A partition kept across a rebalance goes on from the group's last
commit (every few seconds: what is read twice is counted once, see `WorkerMetrics`). A
partition that leaves takes its pods, GPUs, nodes (each `(cluster, node)`: node names
repeat across clusters) and capacity keys with it (`WorkerMetrics.forget`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from schemas.attribution import Attribution
from schemas.capacity import Capacity
from schemas.codec import SchemaError, TopicSpec
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from schemas.settings import Settings
from schemas.topics import (
    ATTRIBUTION,
    CAPACITY,
    GPU_WINDOWS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    POD_USAGE,
)
from sinks.consumer import Consumer, ConsumerLoop, KafkaClient, Message
from sinks.prometheus.metrics import NodeRef, WorkerMetrics

__all__ = ["LOOKBACK_S", "MetricsFeed", "metrics_group"]

log = logging.getLogger(__name__)

LOOKBACK_S = 300.0  # how far back a partition coming here is read (but lifecycle, capacity)
POLL_MS = 500
MAX_RECORDS = 2000
FETCH_MIN_BYTES = 64 * 1024  # as the Redis writer: a fetch per 64 kB or 200 ms, not per record
FETCH_WAIT_MS = 200
COMMIT_EVERY_MS = 5000
RETRY_S = 0.5  # pause after a Kafka error (the broker or the group away for a while)
FEED_TOPICS: tuple[TopicSpec[Any], ...] = (
    POD_LIFECYCLE, ATTRIBUTION, GPU_WINDOWS, POD_USAGE, NVML_SAMPLES, CAPACITY
)  # fmt: skip
FROM_START: tuple[TopicSpec[Any], ...] = (POD_LIFECYCLE, CAPACITY)
"""Topics whose latest record per key can be of any age: read from the start of retention."""


def metrics_group(settings: Settings) -> str:
    """The consumer group of the metrics sinks."""
    return f"{settings.kafka.app_id}.metrics"


class MetricsFeed(ConsumerLoop):
    """The topics into a `WorkerMetrics`, read by one consumer until `stopping()`."""

    name = "metrics sink"
    retry_s = RETRY_S

    def __init__(
        self,
        settings: Settings,
        metrics: WorkerMetrics,
        *,
        kafka: KafkaClient,
        wall: Callable[[], float] = time.time,
    ) -> None:
        prefix = settings.kafka.topic_prefix
        self.specs: dict[str, TopicSpec[Any]] = {s.full_name(prefix): s for s in FEED_TOPICS}
        super().__init__(settings.kafka, kafka, list(self.specs))
        self.metrics = metrics
        # The windows read here are revised for this long: remember what was counted as long.
        metrics.keep_revisions_for(settings.windows.revision_horizon_s)
        self.from_start = {spec.full_name(prefix) for spec in FROM_START}
        self.capacity_topic = CAPACITY.full_name(prefix)
        self.samples_topic = NVML_SAMPLES.full_name(prefix)
        self.windows_topic = GPU_WINDOWS.full_name(prefix)
        self.group = metrics_group(settings)
        self._wall = wall
        self._owned: dict[Any, set[str]] = {}
        """partition -> the pod uids, GPU uuids or capacity keys its records named."""
        self._nodes: dict[Any, set[NodeRef]] = {}
        """partition of the node samples -> the `(cluster, node)`s its records named."""
        self.records = 0
        """Records handed to the metrics."""
        self.invalid = 0
        """Records that did not decode (the worker's own topics: written by someone else)."""

    def consumer_options(self) -> dict[str, Any]:
        """Positions committed every few seconds, for partitions kept across a rebalance."""
        return {
            "group_id": self.group,
            "client_id": "gpuwatch-metrics-sink",
            "enable_auto_commit": True,
            "auto_commit_interval_ms": COMMIT_EVERY_MS,
            "auto_offset_reset": "earliest",
            "max_poll_records": MAX_RECORDS,
            "fetch_min_bytes": FETCH_MIN_BYTES,
            "fetch_max_wait_ms": FETCH_WAIT_MS,
        }

    def step(self, consumer: Consumer) -> None:
        """One poll: partitions placed or forgotten, then each record into the metrics."""
        polled = consumer.poll(timeout_ms=POLL_MS)
        moved = self._place(consumer)
        for tp, messages in polled.items():
            if tp in moved or not messages:
                continue
            nodes = self._nodes.setdefault(tp, set()) if tp.topic == self.samples_topic else None
            self._feed(tp, messages, self._owned.setdefault(tp, set()), nodes)

    def _place(self, consumer: Consumer) -> set[Any]:
        """Partitions new here are read from where their state is rebuilt (those of this
        poll read again from there); partitions gone are forgotten."""
        new, gone = self.assignment_changes(consumer)
        if gone:
            self._forget(gone)
        since_ms = int((self._wall() - LOOKBACK_S) * 1000)
        for tp in sorted(new):
            if tp.topic in self.from_start:
                offset = consumer.beginning_offsets([tp])[tp]
            else:
                offset = self.offset_at(consumer, tp, since_ms)
            consumer.seek(tp, offset)
        return new

    def _forget(self, gone: set[Any]) -> None:
        pods: list[str] = []
        gpus: list[str] = []
        nodes: list[NodeRef] = []
        capacity: list[str] = []
        for tp in gone:
            owned = self._owned.pop(tp, set())
            if tp.topic == self.samples_topic:
                nodes.extend(self._nodes.pop(tp, set()))
            elif tp.topic == self.windows_topic:
                gpus.extend(owned)
            elif tp.topic == self.capacity_topic:
                capacity.extend(owned)
            else:
                pods.extend(owned)
        self.metrics.forget(pods=pods, gpus=gpus, nodes=nodes, capacity=capacity)

    def _feed(
        self,
        tp: Any,
        messages: Sequence[Message],
        owned: set[str],
        nodes: set[NodeRef] | None = None,
    ) -> None:
        spec = self.specs[tp.topic]
        old_ms = int((self._wall() - LOOKBACK_S) * 1000)
        m = self.metrics
        for message in messages:
            try:
                if message.value is None:
                    raise SchemaError(message.topic, "$", "no value (a tombstone)")
                record = spec.decode(message.value)
            except SchemaError as exc:
                self.invalid += 1
                log.debug("metrics sink skips an invalid record offset=%d: %s", message.offset, exc)
                continue
            self.records += 1
            if isinstance(record, NvmlSample):
                if nodes is not None:
                    nodes.add((record.cluster, record.node))  # node names repeat across clusters
                m.observe_sample(record)
            elif isinstance(record, PodUsage):
                owned.add(record.uid)  # usage of a pod not known yet is kept: forgotten with it
                m.observe_usage(record)
            elif isinstance(record, Capacity):
                owned.add(record.key())
                m.observe_capacity(record)
            elif isinstance(record, GpuWindow):
                owned.add(record.uuid)
                m.observe_gpu_window(record)
            elif isinstance(record, Attribution):
                owned.add(record.uid)
                m.observe_attribution(record)
            elif isinstance(record, PodLifecycle):
                if record.to_state == "finished" and record.ts < old_ms:
                    owned.discard(record.uid)
                    m.forget(pods=[record.uid])  # long finished: no series to show
                    continue
                owned.add(record.uid)
                m.observe_lifecycle(record)
