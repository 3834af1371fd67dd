"""The Faust app of the worker: topics, tables, the node and pod agents and the tick timer.

Faust is untyped at this edge (`Any`); everything below the agents is plain code. Choices:
raw bytes in and out (values are decoded once, by our msgspec codecs); outputs and table
writes go to the Kafka client a record batch per partition (`streams.faust.batches`),
lz4-compressed, not message by message through Faust's buffer, and each batch's delivery is
checked (a record the broker refused stops the worker: its agents crash the app, Faust's
`CrashingSupervisor`, rather than being restarted in the process with state that counts the
lost records as sent); `memory://` tables whose
changelog topics restore them on a restart (Faust reads them before the agents get events);
no standby replicas; no web server; Faust reads no environment variables of its own
(`streams.faust.process`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

import msgspec
from faust.types import TP
from mode import CrashingSupervisor

from schemas.alert import Alert
from schemas.nvml_sample import NvmlSample
from schemas.settings import Settings
from schemas.topics import (
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    NVML_SAMPLES,
    POD_USAGE,
    SINK_TOPICS,
)
from streams.core.alignment import Alignment
from streams.core.integrals import PriceBook
from streams.core.progress import Stalls
from streams.core.ticks import decode_tick
from streams.faust.batches import Batches
from streams.faust.consumer import rewinding_consumer
from streams.faust.inbox import Inbox, Inboxes
from streams.faust.internals import committed_offset, use_consumer_class, use_fast_lz4
from streams.faust.process import new_app
from streams.faust.progress import ProgressWatch
from streams.faust.tables import FaustTable
from streams.faust.tick_timer import (
    OffsetProbe,
    TickSender,
    fleet_topic_name,
    tick_topic_name,
)
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Record
from streams.processors.pod import PodConfig, PodPartition
from streams.runtime.agent_loop import (
    BATCH_MAX,
    BATCH_WITHIN_S,
    STATE_EVERY_EVENT_MS,
    STATE_EVERY_S,
    AgentLoop,
    Make,
    Received,
)

__all__ = [
    "SINK_TOPICS",
    "LiveHooks",
    "WorkerOptions",
    "WorkerRuntime",
    "build",
    "changelog_topic_names",
]

log = logging.getLogger(__name__)

PRODUCER_BATCH_BYTES = 256 << 10  # under the broker's 1 MB message limit, with room
PROGRESS_EVERY_S = 2.0  # stall limits are minutes; commits come every 2.8 s


@dataclass(frozen=True)
class WorkerOptions:
    """What only this process has (its name, its data directory); the rest is `Settings`."""

    commit_interval_s: float = 2.8
    """Seconds between offset commits (Faust's default); a crash redoes at most this much."""
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """This worker's name in ticks and logs."""
    datadir: Path | None = None
    """Faust's data directory (nothing is stored there with memory tables); None: a new temp dir."""


class LiveHooks(Protocol):
    """What the processors tell the sinks as it happens (the metrics, live GPU state)."""

    def on_record(self, value: Any) -> None:
        """Each derived value this worker emits (lifecycle, attribution, windows, alerts...)."""

    def on_firing(self, alert: Alert) -> None:
        """An alert a partition's loaded state says is firing (not emitted again: shown, not
        counted)."""

    def on_sample(self, sample: NvmlSample) -> None:
        """Each new node sample processed."""

    def on_revoked(self, pods: list[str], nodes: list[str]) -> None:
        """Pod uids and node names whose partitions left this worker."""


def changelog_topic_names(settings: Settings) -> tuple[str, str]:
    """The changelog topics of the node and pod state tables (internal, compacted)."""
    base = f"{settings.kafka.topic_prefix}{settings.kafka.app_id}"
    return f"{base}.node-state.changelog", f"{base}.pod-state.changelog"


@dataclass
class WorkerRuntime:
    """The app and what a test or a metrics exporter may look at."""

    app: Any
    counters: Counters
    node_loop: AgentLoop
    pod_loop: AgentLoop
    ticks: TickSender


def _app(settings: Settings, options: WorkerOptions) -> Any:
    use_fast_lz4()
    kafka = settings.kafka
    datadir = options.datadir or Path(tempfile.mkdtemp(prefix="gpuwatch-worker-"))
    return new_app(
        kafka.app_id,
        kafka,
        datadir,
        broker_session_timeout=settings.worker.session_timeout_s,
        broker_commit_interval=options.commit_interval_s,
        topic_replication_factor=kafka.replication_factor,
        topic_allow_declare=True,
        table_standby_replicas=0,
        processing_guarantee="at_least_once",
        # A batch's records of one partition go out as one record batch (see `Batches`):
        # Faust's 16 kB default holds one node document (about 11 kB).
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        producer_compression_type="lz4",
    )


class _Kafka:
    """The app's topics and tables, created once each."""

    def __init__(self, app: Any, settings: Settings, counters: Counters) -> None:
        self.app = app
        self.partitions = settings.kafka.partitions
        self.topics: dict[str, Any] = {}
        self.batches = Batches(app, on_failure=_count_failure(counters))

    def topic(self, name: str) -> Any:
        """The Faust topic of one name, raw bytes both ways."""
        if name not in self.topics:
            self.topics[name] = self.app.topic(name, partitions=self.partitions, **_RAW)
        return self.topics[name]

    def send(self, record: Record) -> None:
        """Keep a record for the producer (handed over and flushed by the agent loop)."""
        self.topic(record.topic)  # declared, so that Faust knows the topic
        self.batches.add(record.topic, record.key, record.value, record.partition)

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
        """The committed offset Faust sought to or last committed."""
        return committed_offset(self.app.consumer, topic, partition)

    async def flush(self) -> None:
        """Wait until everything produced so far is acknowledged; `DeliveryFailedError` if the
        broker did not take a record of the outputs or the state (now or before)."""
        await self.batches.hand_over()
        await self.app.producer.flush()  # Faust's own sends too: the ticks
        await self.batches.confirm()

    async def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read a partition again from `offset`."""
        await self.app.consumer.rewind(TP(topic, partition), offset)

    def unread(self, topic: str, partition: int) -> bool:
        """Whether the consumer leaves a partition out of its fetches (watermark alignment)."""
        return TP(topic, partition) in self.app.consumer.unread


_RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes}


def _count_failure(counters: Counters) -> Callable[[str, str], None]:
    """Count a record batch the broker did not take, by topic and error class."""

    def count(topic: str, reason: str) -> None:
        key = (topic, reason)
        counters.delivery_failures[key] = counters.delivery_failures.get(key, 0) + 1

    return count


def _configs(settings: Settings) -> tuple[NodeConfig, PodConfig]:
    prefix = settings.kafka.topic_prefix
    fleet = fleet_topic_name(settings)
    skew_ms = settings.windows.max_clock_skew_s * 1000
    node = NodeConfig(
        prefix=prefix,
        window_ms=settings.windows.window_s * 1000,
        lateness_ms=settings.windows.allowed_lateness_s * 1000,
        rules=settings.rules,
        prices=PriceBook(settings.cost.prices),
        partitions=settings.kafka.partitions,
        idle_after_ms=settings.windows.source_idle_after_s * 1000,
        horizon_ms=settings.windows.revision_horizon_s * 1000,
        input_end_ms=settings.worker.input_end_ms,
        now_ms=_wall_ms,
        max_clock_skew_ms=skew_ms,
        fleet_topic=fleet,
    )
    pod = PodConfig(
        prefix,
        settings.kafka.partitions,
        settings.rules,
        settings.windows,
        now_ms=_wall_ms,
        max_clock_skew_ms=skew_ms,
        fleet_topic=fleet,
    )
    return node, pod


def _wall_ms() -> int:
    """The wall clock in epoch ms: the processors' `now_ms`."""
    return int(time.time() * 1000)


def build(
    settings: Settings,
    options: WorkerOptions | None = None,
    live: LiveHooks | None = None,
    counters: Counters | None = None,
    stalls: Stalls | None = None,
) -> WorkerRuntime:
    """The worker's Faust app, ready for a Faust worker (nothing connects until it starts).

    With `live`, the processors hand every value they emit, each sample, and the firing
    alerts of each partition's state as it is loaded, to the hooks. With `stalls`, a timer
    reads the progress of every partition the worker holds into it (`ProgressWatch`).
    """
    options = options or WorkerOptions()
    app = _app(settings, options)
    counters = counters or Counters()
    kafka = _Kafka(app, settings, counters)
    prefix = settings.kafka.topic_prefix
    tick_name = tick_topic_name(settings)
    node_config, pod_config = _configs(settings)
    if live is not None:
        node_config = replace(node_config, live=live.on_sample, firing=live.on_firing)
        pod_config = replace(pod_config, firing=live.on_firing)
    node_log, pod_log = changelog_topic_names(settings)
    probe = OffsetProbe(settings.kafka)
    node_table, pod_table = kafka.table("node-state", node_log), kafka.table("pod-state", pod_log)

    def loop(
        name: str, inputs: tuple[str, ...], ticked: tuple[str, ...], state: FaustTable, make: Make
    ) -> AgentLoop:
        return AgentLoop(
            name=name,
            inputs=inputs,
            ticked=ticked,
            tick_topic=tick_name,
            table=state,
            make=make,
            outputs=Outputs(prefix, counters, observe=None if live is None else live.on_record),
            committed=kafka.committed,
            send=kafka.send,
            flush=kafka.flush,
            seek=kafka.seek,
            start_of=lambda topic, partition: probe.starts.get((topic, partition)),
            load_starts=probe.load_starts,
            paused=kafka.unread,
            state_every_s=STATE_EVERY_S,
            state_every_event_ms=STATE_EVERY_EVENT_MS,
        )

    node_inputs = (NVML_SAMPLES.full_name(prefix), K8S_NODES.full_name(prefix))
    pod_inputs = (
        K8S_PODS.full_name(prefix),
        POD_USAGE.full_name(prefix),
        K8S_WORKLOADS.full_name(prefix),
    )
    # The fleet topic is the pod side's too (its partition 0 hosts the fleet partition), but
    # not the ticks': the fleet partition goes by the marks in it, not by the ticks.
    pod_reads = (*pod_inputs, fleet_topic_name(settings))
    node_loop = loop(
        "node",
        node_inputs,
        node_inputs,
        node_table,
        lambda p, kv: NodePartition(p, node_config, counters, kv),
    )
    pod_loop = loop(
        "pod",
        pod_reads,
        pod_inputs,
        pod_table,
        lambda p, kv: PodPartition(p, pod_config, counters, kv),
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
    align = _aligner(app, settings, node_loop, counters, tick_name)
    node_inbox = Inbox("node", (*node_inputs, tick_name))
    pod_inbox = Inbox("pod", (*pod_reads, tick_name))
    inboxes = Inboxes(app, (node_inbox, pod_inbox))
    inputs = frozenset((*node_inputs, *pod_reads, tick_name))
    use_consumer_class(app, lambda base: rewinding_consumer(base, inputs, inboxes))
    # Faust's agents subscribe the topics and supervise the loops; the records come through
    # the inboxes, not through the agents' streams (`streams.faust.inbox`). A loop that
    # fails (records the broker did not take, `DeliveryFailedError`) crashes the app, and the
    # worker exits without storing state or committing past them: Faust's default
    # supervisor would start the loop again in this process, its processors past the
    # records lost.
    for name, topics, agent_loop, inbox, after in (
        ("gpuwatch-node", node_inbox.topics, node_loop, node_inbox, align),
        ("gpuwatch-pod", pod_inbox.topics, pod_loop, pod_inbox, None),
    ):
        channel = app.topic(*sorted(topics), **_RAW)
        app.agent(channel, name=name, supervisor_strategy=CrashingSupervisor)(
            _agent_body(agent_loop, inboxes, inbox, after)
        )
    app.timer(settings.worker.tick_interval_s, name="gpuwatch-ticks")(ticks.tick)
    if stalls is not None:
        watch = ProgressWatch(app, probe, stalls, kafka.committed, inputs)
        app.timer(PROGRESS_EVERY_S, name="gpuwatch-progress")(watch.check)
    _connect_app_signals(
        app, live, (node_loop, pod_loop), (node_table, pod_table), probe, inboxes=inboxes
    )
    return WorkerRuntime(app, counters, node_loop, pod_loop, ticks)


AfterBatch = Callable[[Sequence[Received]], None]


def _agent_body(
    loop: AgentLoop, inboxes: Inboxes, inbox: Inbox, after: AfterBatch | None = None
) -> Callable[[Any], Any]:
    """A Faust agent running `loop` on the batches of its inbox (its stream stays unread);
    `after` is called with each batch once the loop has processed it."""

    async def body(stream: Any) -> None:
        batches = inboxes.batches(inbox, BATCH_MAX, BATCH_WITHIN_S)
        await loop.run(batches if after is None else _after_each(batches, after))

    body.__name__ = body.__qualname__ = f"{inbox.name}_agent"
    return body


async def _after_each(
    batches: AsyncIterator[list[Any]], after: AfterBatch
) -> AsyncIterator[list[Any]]:
    """The batches, `after` called on each when the next is asked for (it is processed)."""
    async with contextlib.aclosing(cast(Any, batches)):
        async for batch in batches:
            yield batch
            after(batch)


def _aligner(
    app: Any, settings: Settings, node_loop: AgentLoop, counters: Counters, tick_topic: str
) -> AfterBatch | None:
    """Watermark alignment after each node batch (`streams.core.alignment`): the node
    partitions ahead of the slowest are left out of the consumer's fetches. None when
    `align_ahead_s` is 0."""
    worker = settings.worker
    if worker.align_ahead_s <= 0:
        return None
    alignment = Alignment(
        settings.kafka.partitions, worker.align_ahead_s * 1000, worker.align_stuck_s
    )
    samples = NVML_SAMPLES.full_name(settings.kafka.topic_prefix)
    paused: frozenset[int] = frozenset()

    def after(batch: Sequence[Received]) -> None:
        nonlocal paused
        for message in batch:
            if message.topic == tick_topic:
                with contextlib.suppress(msgspec.DecodeError):  # dead-lettered by the loop
                    tick = decode_tick(message.value or b"")
                    alignment.heard(tick.claims, tick.idle)
        local = {
            partition: cast(NodePartition, processor).claim()
            for partition, processor in node_loop.partitions.items()
        }
        now = alignment.decide(local)
        counters.alignment_pauses = alignment.pauses
        counters.alignment_released = alignment.released
        counters.aligned_paused = len(now)
        if now != paused:
            # Behind a backlog the set changes every few batches: its start and end at info.
            level = logging.INFO if bool(now) != bool(paused) else logging.DEBUG
            log.log(
                level, "alignment paused=%s lowest=%s released=%d",
                sorted(now), alignment.lowest, alignment.released,
            )  # fmt: skip
            paused = now
            app.consumer.unread = frozenset(TP(samples, partition) for partition in now)

    return after


def _connect_app_signals(
    app: Any,
    live: LiveHooks | None,
    loops: tuple[AgentLoop, AgentLoop],
    tables: tuple[FaustTable, FaustTable],
    probe: OffsetProbe,
    *,
    inboxes: Inboxes,
) -> None:
    """The app signals: partitions leaving or arriving, the app about to shut down."""
    node_loop, pod_loop = loops

    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        gone = {tp.partition for tp in revoked}
        if live is not None:
            pods = [u for p in gone for u in getattr(pod_loop.partitions.get(p), "pods", ())]
            nodes = [n for p in gone for n in getattr(node_loop.partitions.get(p), "nodes", ())]
            live.on_revoked(pods, nodes)
        inboxes.clear()  # fetched before the rebalance: read again from the commits
        node_loop.forget(gone)
        pod_loop.forget(gone)

    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        kept = {tp.partition for tp in assigned}
        for table in tables:
            table.keep_only(kept)

    async def on_shutdown(sender: Any, **kwargs: Any) -> None:
        await probe.close()

    app.on_partitions_revoked.connect(on_revoked)
    app.on_partitions_assigned.connect(on_assigned)
    app.on_before_shutdown.connect(on_shutdown)
