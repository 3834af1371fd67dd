"""The Faust app of the worker: topics, tables, the node and pod agents and the tick timer.

Faust is untyped at this edge (`Any`); everything below the agents is plain code. Choices:
raw bytes in and out (values are decoded once, by our msgspec codecs); outputs and table
writes go to the Kafka client a record batch per partition (`Batches`), lz4-compressed,
not message by message through Faust's buffer; `memory://` tables whose changelog topics
restore them on a restart (Faust reads them before the agents get events); no standby
replicas; no web server; Faust reads no environment variables of its own (`env={}`: the
settings are read in one place, `gpuwatch.config`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import faust
from faust.types import TP

from schemas.nvml_sample import NvmlSample
from schemas.pod_usage import PodUsage
from schemas.settings import KafkaSettings, Settings
from schemas.topics import (
    ALERTS,
    ATTRIBUTION,
    GPU_WINDOWS,
    K8S_NODES,
    K8S_PODS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    POD_USAGE,
)
from streams.core.integrals import PriceBook
from streams.faust.tick_timer import OffsetProbe, TickSender, tick_topic_name
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Record
from streams.processors.pod import PodConfig, PodPartition
from streams.runtime.agent_loop import STATE_EVERY_S, AgentLoop, Make

__all__ = [
    "SINK_TOPICS",
    "LiveHooks",
    "WorkerOptions",
    "WorkerRuntime",
    "build",
    "changelog_topic_names",
    "credentials",
]

log = logging.getLogger(__name__)

PRODUCER_BATCH_BYTES = 256 << 10  # under the broker's 1 MB message limit, with room


@dataclass(frozen=True)
class WorkerOptions:
    """What only this process has (its name, its data directory); the rest is `Settings`."""

    commit_interval_s: float = 2.8
    """Seconds between offset commits (Faust's default); a crash redoes at most this much."""
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """This worker's name in ticks and logs."""
    datadir: Path | None = None
    """Faust's data directory (nothing is stored there with memory tables); None: a new temp dir."""


SINK_TOPICS = (POD_LIFECYCLE, ATTRIBUTION, GPU_WINDOWS, ALERTS)
"""The derived topics a sink reads back (the worker's Redis writer)."""


@dataclass(frozen=True)
class LiveHooks:
    """What the processors tell the sinks as it happens (the metrics, live GPU state)."""

    on_record: Callable[[Any], None]
    """Each derived value this worker emits (lifecycle, attribution, windows, alerts...)."""
    on_sample: Callable[[NvmlSample], None]
    """Each new node sample processed."""
    on_usage: Callable[[PodUsage], None]
    """Each pod usage processed."""
    on_revoked: Callable[[list[str], list[str]], None] = lambda pods, nodes: None
    """Pod uids and node names whose partitions left this worker."""


def changelog_topic_names(settings: Settings) -> tuple[str, str]:
    """The changelog topics of the node and pod state tables (internal, compacted)."""
    base = f"{settings.kafka.topic_prefix}{settings.kafka.app_id}"
    return f"{base}.node-state.changelog", f"{base}.pod-state.changelog"


def credentials(kafka: KafkaSettings) -> Any:
    """Faust broker credentials from the Kafka settings; None for PLAINTEXT."""
    protocol = kafka.security_protocol
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        cafile = None if kafka.ssl_cafile is None else str(kafka.ssl_cafile)
        context = ssl.create_default_context(cafile=cafile)
    if protocol.startswith("SASL"):
        password = kafka.sasl_password
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=None if password is None else password.get_secret_value(),
            mechanism=kafka.sasl_mechanism or "PLAIN",
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


class Batches:
    """Records handed to aiokafka as one record batch per topic partition, past Faust's buffer.

    Faust's `send_soon` costs a future, a trip through its buffer and a callback per
    message, and its flush an `asyncio.wait_for` per message: with several records per node
    sample that was most of the worker's CPU (BENCHMARKS.md, worker). Here records wait in
    a list until `hand_over` puts them into the client's batches (C code, one future a
    batch); the client sends them as it sends Faust's, and `app.producer.flush()` (also
    Faust's before each commit) waits for them. Order is kept per topic partition; a record
    without a partition goes where Faust would put it (the client's partitioner).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._pending: dict[str, list[tuple[int | None, bytes | None, bytes | None]]] = {}
        self._lock = asyncio.Lock()  # two agents hand over: one at a time keeps the order

    def add(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        """Keep a record until the next `hand_over`."""
        self._pending.setdefault(topic, []).append((partition, key, value))

    async def hand_over(self) -> None:
        """Put every record kept so far into the client's batches (not waiting for acks)."""
        async with self._lock:
            if not self._pending:
                return
            pending, self._pending = self._pending, {}
            producer = await self.app.maybe_start_producer()
            client = producer._ensure_producer()  # the aiokafka producer (no public accessor)
            for topic, records in pending.items():
                await client.partitions_for(topic)  # metadata, for the partitioner
                by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
                for explicit, key, value in records:
                    partition = (
                        producer.key_partition(topic, key).partition
                        if explicit is None
                        else explicit
                    )
                    by_partition.setdefault(partition, []).append((key, value))
                for partition, items in by_partition.items():
                    await _send_batches(client, topic, partition, items)


async def _send_batches(
    client: Any, topic: str, partition: int, items: list[tuple[bytes | None, bytes | None]]
) -> None:
    """Records of one topic partition, in order, in as few record batches as they fit."""
    batch = client.create_batch()
    for key, value in items:
        if batch.append(key=key, value=value, timestamp=None) is not None:
            continue
        await client.send_batch(batch, topic, partition=partition)  # full: append closed it
        batch = client.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            # Larger than a whole batch (no record of ours is): sent on its own, in order.
            await client.send(topic, value, key=key, partition=partition)
            batch = client.create_batch()
    if batch.record_count():
        batch.close()  # nothing else goes in (the client adds `send()`s to open batches)
        await client.send_batch(batch, topic, partition=partition)


class FaustTable:
    """A Faust table used with explicit partitions: keys are `b"<partition>|<key>"`."""

    def __init__(self, table: Any, batches: Batches) -> None:
        self.table = table
        self._batches = batches
        self._changelog = table.changelog_topic.get_topic_name()

    def load(self, partition: int) -> list[tuple[bytes, bytes]]:
        """Every key (without its partition) and value of a partition."""
        prefix = f"{partition}|".encode()
        n = len(prefix)
        return [(k[n:], v) for k, v in list(self.table.data.items()) if k.startswith(prefix)]

    def keep_only(self, partitions: set[int]) -> None:
        """Forget local keys of partitions not assigned here (their changelog restores them)."""
        data = self.table.data
        for key in [k for k in list(data.keys()) if int(k.split(b"|", 1)[0]) not in partitions]:
            del data[key]

    def write(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Set or delete a key locally and in the changelog partition of `partition`."""
        full = f"{partition}|".encode() + key
        data = self.table.data
        if value is None:
            if full in data:
                del data[full]
        else:
            data[full] = value
        self._batches.add(self._changelog, full, value, partition)


@dataclass
class WorkerRuntime:
    """The app and what a test or a metrics exporter may look at."""

    app: Any
    counters: Counters
    node_loop: AgentLoop
    pod_loop: AgentLoop
    ticks: TickSender


def _app(settings: Settings, options: WorkerOptions) -> Any:
    kafka = settings.kafka
    datadir = options.datadir or Path(tempfile.mkdtemp(prefix="gpuwatch-worker-"))
    return faust.App(
        kafka.app_id,
        env={},
        broker=[f"kafka://{server}" for server in kafka.servers],
        broker_credentials=credentials(kafka),
        broker_session_timeout=settings.worker.session_timeout_s,
        broker_commit_interval=options.commit_interval_s,
        store="memory://",
        datadir=str(datadir),
        topic_partitions=kafka.partitions,
        topic_replication_factor=kafka.replication_factor,
        topic_allow_declare=True,
        topic_disable_leader=True,
        table_standby_replicas=0,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        autodiscover=False,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        # A batch's records of one partition go out as one record batch (see `Batches`):
        # Faust's 16 kB default holds one node document (about 11 kB).
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        producer_compression_type="lz4",
    )


class _Kafka:
    """The app's topics and tables, created once each."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.partitions = settings.kafka.partitions
        self.topics: dict[str, Any] = {}
        self.batches = Batches(app)

    def topic(self, name: str) -> Any:
        """The Faust topic of one name, raw bytes both ways."""
        if name not in self.topics:
            self.topics[name] = self.app.topic(name, partitions=self.partitions, **_RAW)
        return self.topics[name]

    def send(self, record: Record) -> None:
        """Keep a record for the producer (handed over and flushed by the agent loop)."""
        self.topic(record.topic)  # declared, so that Faust knows the topic
        self.batches.add(record.topic, record.key, record.value, None)

    def table(self, name: str, changelog: str) -> FaustTable:
        """A memory table restored from its compacted changelog topic."""
        log_topic = self.app.topic(
            changelog,
            partitions=self.partitions,
            compacting=True,
            deleting=False,
            internal=True,
            **_RAW,
        )
        table = self.app.Table(name, partitions=self.partitions, changelog_topic=log_topic, **_RAW)
        return FaustTable(table, self.batches)

    def committed(self, topic: str, partition: int) -> int | None:
        """The committed offset Faust sought to or last committed (it has no public accessor)."""
        offset: int | None = self.app.consumer._committed_offset.get(TP(topic, partition))
        return offset

    async def flush(self) -> None:
        """Wait until everything produced so far is acknowledged."""
        await self.batches.hand_over()
        await self.app.producer.flush()

    async def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read a partition again from `offset`."""
        await self.app.consumer.seek(TP(topic, partition), offset)


_RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes}


def rewinding_consumer(base: Any, topics: frozenset[str]) -> Any:
    """Faust's consumer, rewinding never-committed input partitions when it seeks back.

    Records fetched while Faust's flow is paused (a rebalance) are dropped, and Faust seeks
    back to the committed offsets to read them again; aiokafka skips that seek for a
    partition without a commit (or committed at 0), so those records were lost for the
    group. Such a partition is read again from its beginning, as a new group would.
    """

    class RewindingConsumer(base):  # type: ignore[misc]
        __module__ = base.__module__  # mode names a service's logger after its module

        async def seek_to_committed(self) -> Any:
            committed = await super().seek_to_committed()
            rewind = [tp for tp, offset in committed.items() if not offset and tp.topic in topics]
            if rewind:
                await self._thread.seek_to_beginning(*rewind)
            return committed

    return RewindingConsumer


def _configs(settings: Settings) -> tuple[NodeConfig, PodConfig]:
    prefix = settings.kafka.topic_prefix
    node = NodeConfig(
        prefix=prefix,
        window_ms=settings.windows.window_s * 1000,
        lateness_ms=settings.windows.allowed_lateness_s * 1000,
        rules=settings.rules,
        prices=PriceBook(settings.cost.prices),
        partitions=settings.kafka.partitions,
        idle_after_ms=settings.windows.source_idle_after_s * 1000,
        input_end_ms=settings.worker.input_end_ms,
        now_ms=_wall_ms,
    )
    pod = PodConfig(
        prefix, settings.kafka.partitions, settings.rules, settings.windows, now_ms=_wall_ms
    )
    return node, pod


def _wall_ms() -> int:
    """The wall clock in epoch ms: only to refuse event times a day in the future."""
    return int(time.time() * 1000)


def build(
    settings: Settings,
    options: WorkerOptions | None = None,
    live: LiveHooks | None = None,
    counters: Counters | None = None,
) -> WorkerRuntime:
    """The worker's Faust app, ready for `faust.Worker` (nothing connects until it starts).

    With `live`, the processors hand every value they emit, and each sample and pod usage,
    to the hooks.
    """
    options = options or WorkerOptions()
    app = _app(settings, options)
    kafka = _Kafka(app, settings)
    prefix = settings.kafka.topic_prefix
    counters = counters or Counters()
    tick_name = tick_topic_name(settings)
    node_config, pod_config = _configs(settings)
    if live is not None:
        node_config = replace(node_config, live=live.on_sample)
        pod_config = replace(pod_config, live=live.on_usage)
    node_log, pod_log = changelog_topic_names(settings)
    probe = OffsetProbe(settings.kafka)
    node_table, pod_table = kafka.table("node-state", node_log), kafka.table("pod-state", pod_log)

    def loop(name: str, inputs: tuple[str, str], state: FaustTable, make: Make) -> AgentLoop:
        return AgentLoop(
            name=name,
            inputs=inputs,
            tick_topic=tick_name,
            table=state,
            make=make,
            outputs=Outputs(prefix, counters, observe=None if live is None else live.on_record),
            committed=kafka.committed,
            send=kafka.send,
            flush=kafka.flush,
            hand_over=kafka.batches.hand_over,
            seek=kafka.seek,
            start_of=lambda topic, partition: probe.starts.get((topic, partition)),
            load_starts=probe.load_starts,
            state_every_s=STATE_EVERY_S,
        )

    node_inputs = (NVML_SAMPLES.full_name(prefix), K8S_NODES.full_name(prefix))
    pod_inputs = (K8S_PODS.full_name(prefix), POD_USAGE.full_name(prefix))
    node_loop = loop(
        "node", node_inputs, node_table, lambda p, kv: NodePartition(p, node_config, counters, kv)
    )
    pod_loop = loop(
        "pod", pod_inputs, pod_table, lambda p, kv: PodPartition(p, pod_config, counters, kv)
    )
    ticks = TickSender(
        app=app,
        settings=settings,
        instance=options.instance,
        node_loop=node_loop,
        probe=probe,
        send=lambda q, value: kafka.topic(tick_name).send_soon(key=b"", value=value, partition=q),
        flush=kafka.flush,
        inputs=(*node_inputs, *pod_inputs),
    )
    inputs = frozenset((*node_inputs, *pod_inputs, tick_name))
    app.transport.Consumer = rewinding_consumer(app.transport.Consumer, inputs)
    app.agent(app.topic(*node_inputs, tick_name, **_RAW), name="gpuwatch-node")(node_loop.run)
    app.agent(app.topic(*pod_inputs, tick_name, **_RAW), name="gpuwatch-pod")(pod_loop.run)
    app.timer(settings.worker.tick_interval_s, name="gpuwatch-ticks")(ticks.tick)

    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        gone = {tp.partition for tp in revoked}
        if live is not None:
            pods = [u for p in gone for u in getattr(pod_loop.partitions.get(p), "pods", ())]
            nodes = [n for p in gone for n in getattr(node_loop.partitions.get(p), "nodes", ())]
            live.on_revoked(pods, nodes)
        node_loop.forget(gone)
        pod_loop.forget(gone)

    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        kept = {tp.partition for tp in assigned}
        node_table.keep_only(kept)
        pod_table.keep_only(kept)

    async def on_shutdown(sender: Any, **kwargs: Any) -> None:
        await probe.close()

    app.on_partitions_revoked.connect(on_revoked)
    app.on_partitions_assigned.connect(on_assigned)
    app.on_before_shutdown.connect(on_shutdown)
    return WorkerRuntime(app, counters, node_loop, pod_loop, ticks)
