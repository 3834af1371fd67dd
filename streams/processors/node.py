"""The node side of one partition: samples and node events in; usage, GPU windows, alerts out.

No Kafka here: the agent loop hands each input's bytes to `handle`, ticks to `on_tick`,
sends what `Outputs` collected and stores `take_writes()` in the table. Everything is done
in input order, one message at a time, so the records depend on the partition's order
alone (and on ticks, which only apply once the data before them is processed).

Stream time is the largest sample `ts` of the partition (SEMANTICS.md, Time). Node events
do not move it: each is held until stream time reaches its `ts`, and applied then, before
anything later. Each time stream time passes a window's end plus the allowed lateness the
windows of every node close; each time it passes a flush boundary pending pod usage is
flushed and missing telemetry is looked for. Pod usage before the partition's usage
frontier (`streams.core.ticks.usage_frontier`) is late: the pod side may have closed it.

A partition is idle once a tick finds it caught up with its inputs while the highest
stream time any partition claims is more than `idle_after_ms` (or its longest sample
interval) past the end of its newest sample, or it has no sample at all. An idle partition
is raised to the lowest stream time of the partitions that are not idle, so that its
windows close and its silent nodes are seen missing; its next sample ends the idleness.
With `input_end_ms` (a replay of a range) a caught-up partition is raised to the input's
end plus twice the allowed lateness instead: the pod side then closes the range's end.

A node is `(cluster, node)`: samples and node events of two clusters' same-named nodes can
share a partition and never share state (`node_doc.node_key`: the stored key, and the key
of `nodes`); prices, usage, windows and alerts are each node's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schemas.alert import Alert
from schemas.ids import NodeName
from schemas.k8s_node import K8sNode
from schemas.nvml_sample import NvmlSample
from schemas.pod_usage import PodUsage
from schemas.settings import RuleSettings
from schemas.topics import ALERTS, GPU_WINDOWS, K8S_NODES, NVML_SAMPLES, POD_USAGE
from streams.core.fleet.fleet_state import (
    FLEET_PARTITION,
    FleetAlert,
    FleetMark,
    FleetNode,
    FleetUse,
    encode_input,
    node_after_event,
    node_after_idle_ended,
    node_after_sample,
)
from streams.core.integrals import PriceBook, SampleIntegrals, integrate_sample
from streams.core.node.gpu_alerts import (
    NodeAlertState,
    on_node_removed,
    on_sample,
    on_watermark,
    still_firing,
)
from streams.core.node.gpu_health import HEALTH_SEVERITY
from streams.core.node.node_doc import (
    NodeDoc,
    NodeRuntime,
    PartitionMeta,
    decode_doc,
    decode_meta,
    encode,
    node_key,
)
from streams.core.node.usage import FLUSH_MS
from streams.core.sanity import MAX_CLOCK_SKEW_MS, check_node, check_sample, unknown_devices
from streams.core.split import sample_view
from streams.core.ticks import SourceWatermarks, Tick, usage_frontier
from streams.processors.outputs import Counters, Outputs, Source

__all__ = ["IDLE_AFTER_MS", "LIVE_MS", "META_KEY", "NodeConfig", "NodePartition"]

IDLE_AFTER_MS = 60_000  # the default of GPUWATCH_SOURCE_IDLE_AFTER_S
# A sample processed within this of its end (wall clock) is live data: its partition, when
# it goes quiet, moves with the wall clock. Older is a backlog or a replay (only data moves
# its time); two minutes cover an agent's retries and a worker a little behind.
LIVE_MS = 120_000

META_KEY = b""  # the partition's own document; node keys are never empty


@dataclass(frozen=True)
class NodeConfig:
    """What every node partition of a worker shares."""

    prefix: str
    window_ms: int
    lateness_ms: int
    rules: RuleSettings
    prices: PriceBook
    flush_ms: int = FLUSH_MS
    partitions: int = 1
    """Partitions of the data topics (every one claims its stream time in the ticks)."""
    idle_after_ms: int = IDLE_AFTER_MS
    """How far the others' stream time must pass a caught-up partition's newest sample
    for it to count as idle (at least its longest sample interval)."""
    input_end_ms: int | None = None
    """The event time the input ends at (a replay of a range); None for a live worker."""
    live: Callable[[NvmlSample], None] | None = None
    """Called with each new sample once processed (live GPU state for the sinks)."""
    now_ms: Callable[[], int] | None = None
    """The wall clock: event time ahead of it by more than the clock skew allowed is
    refused, and the newest sample's lag behind it tells live data (quiet time)."""
    max_clock_skew_ms: int = MAX_CLOCK_SKEW_MS
    """How far ahead of `now_ms` a sample's or node event's time may be
    (`GPUWATCH_MAX_CLOCK_SKEW_S`): later ones are dead-lettered and move no stream time."""
    firing: Callable[[Alert], None] | None = None
    """Called, when a partition is made from stored state, with each alert that state says
    is firing (`gpu_alerts.still_firing`): shown again by the metrics, not sent again."""
    horizon_ms: int = 0
    """How long closed windows can still be revised (`GPUWATCH_REVISION_HORIZON_S`): usage
    that late is sent on, GPU windows are emitted again; 0: late data is left out."""
    fleet_topic: str | None = None
    """The internal fleet topic: each node's capacity view goes there when it changes
    (`streams.core.fleet.fleet_state`); None: no fleet capacity."""

    def frontier(self, stream_time: int) -> int:
        """The partition's usage frontier at `stream_time` (`ticks.usage_frontier`)."""
        return usage_frontier(stream_time, self.lateness_ms, self.flush_ms, self.window_ms)


class NodePartition:
    """The nodes of one partition and its stream time."""

    def __init__(
        self,
        partition: int,
        config: NodeConfig,
        counters: Counters,
        stored: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        self.partition = partition
        self.config = config
        self.counters = counters
        self.nodes: dict[str, NodeRuntime] = {}
        """Each node by its key (`node_key`)."""
        self.stream_time: int | None = None
        self.meta = PartitionMeta()
        """Its own progress, idleness and the node events waiting for stream time."""
        self.sources = SourceWatermarks(config.partitions)
        self._fleet_marks = SourceWatermarks(
            config.partitions,
            config.frontier,
        )
        """The pod side's watermark of the ticks applied, marked to the fleet partition."""
        self._samples = NVML_SAMPLES.full_name(config.prefix)
        self._step = math.gcd(config.flush_ms, config.window_ms)
        self._dirty: set[str] = set()
        self._meta_dirty = False
        self._meta_raw: bytes | None = None
        has_meta = False
        closed_through: int | None = None
        for key, raw in stored:
            if key == META_KEY:
                self.meta = decode_meta(raw)
                has_meta = True
                continue  # from the positions record (or, written before it, a key)
            runtime = self._runtime(decode_doc(raw))
            self.nodes[runtime.key] = runtime
            if runtime.labels:
                config.prices.set_node_labels(runtime.node, runtime.labels, runtime.cluster)
            closed_through = _later(closed_through, runtime.windows.closed_through)
        # The stream time the positions were stored with (`checkpoint`): a node's document
        # may be newer (a crash while the state was written), and stream time taken from
        # it would make the other nodes' samples read again late. A state stored without
        # a partition document (never written by this version) falls back on the nodes.
        self.stream_time = self.meta.stream_time if has_meta else closed_through
        self._close_mark = self._marks()[0]
        self._flush_mark = self._marks()[1]
        if config.firing is not None:
            self._announce(config.firing)

    def _announce(self, firing: Callable[[Alert], None]) -> None:
        """Hand the alerts the loaded state says are firing to `firing`, node by node."""
        for name in sorted(self.nodes):
            node = self.nodes[name]
            rules = self.config.rules.of(node.cluster)
            for alert in still_firing(
                node.alert,
                idle_alert_after_s=rules.idle_alert_after_s,
                telemetry_missing_after_s=rules.telemetry_missing_after_s,
                throttle_alert_after_s=rules.throttle_alert_after_s,
            ):
                firing(alert)

    def handle(self, source: Source, raw: bytes | None, out: Outputs) -> int | None:
        """Process one input message; its event time, or None when it was rejected."""
        raw = out.admit(source, raw)
        if raw is None:
            return None
        if source.topic == self._samples:
            return self._sample(source, raw, out)
        return self._node_event(source, raw, out)

    def on_tick(self, tick: Tick, out: Outputs) -> None:
        """A tick whose data is in: idle or not, raise an idle one, look for silent nodes."""
        self.counters.ticks += 1
        c, meta = self.config, self.meta
        self.sources.update(tick.claims, tick.idle)
        if c.fleet_topic is not None:
            # Everything this partition read before the tick is processed: what it had to
            # send the fleet partition up to the tick's watermark is sent.
            before = self._fleet_marks.value
            wm = self._fleet_marks.update(tick.claims, tick.idle)
            if wm is not None and wm != before:
                mark = FleetMark(side="node", partition=self.partition, watermark=wm)
                out.emit_raw(c.fleet_topic, b"", encode_input(mark), FLEET_PARTITION)
        if c.input_end_ms is not None:
            self._advance(c.input_end_ms + 2 * c.lateness_ms, out)
        else:
            if tick.now is not None and meta.live:
                # Caught up with live data and quiet: what was sent up to the tick is in,
                # so time moves with the wall clock, less the lateness and the lag its data
                # came with (silence is seen; data a little behind is not made late).
                self._advance(tick.now - meta.lag_ms - c.lateness_ms, out)
            highest = self.sources.highest
            if not meta.idle and (
                meta.covered is None
                or (highest is not None and highest > meta.covered + self._idle_after())
            ):
                meta.idle = self._meta_dirty = True
            low = self.sources.lowest_active(but=self.partition)
            if meta.idle and low is not None:
                self._advance(low, out)
        if self.stream_time is not None:
            self._late_out(self.stream_time, out)
            self._watermark(self.stream_time, out)

    def _late_out(self, st: int, out: Outputs) -> None:
        """What late data made that stream time will not send on its own, sent at a tick:
        pod usage whose flush boundary it passed before the data came, and kept GPU
        windows revised since their last copy (the next window close may be far)."""
        for node in self.nodes.values():
            if node.usage.due_by(st):
                out.emit_all(POD_USAGE, node.usage.flush(st))
                self._dirty.add(node.key)
            if node.windows.revisable:
                revised = node.windows.revisions()
                if revised:
                    self.counters.revisions += len(revised)
                    out.emit_all(GPU_WINDOWS, revised)
                    self._dirty.add(node.key)

    def claim(self) -> tuple[int, bool] | None:
        """What the ticks say of this partition: (stream time, idle); None: nothing yet.

        A partition with no sample claims -1 once it is idle; before that it says nothing,
        and the pod side's watermark waits for it (it may hold data not yet processed).
        """
        if self.stream_time is None:
            return (-1, True) if self.meta.idle else None
        return self.stream_time, self.meta.idle

    def _idle_after(self) -> int:
        return max(self.config.idle_after_ms, self.meta.longest_interval_ms)

    def take_writes(self) -> list[tuple[bytes, bytes | None]]:
        """Documents changed since the last call (None: delete), the partition's last."""
        writes: list[tuple[bytes, bytes | None]] = []
        for key in sorted(self._dirty):
            runtime = self.nodes.get(key)
            if runtime is None:
                continue
            if runtime.empty():
                del self.nodes[key]
                writes.append((key.encode(), None))
            else:
                writes.append((key.encode(), encode(runtime.doc())))
        self._dirty.clear()
        return writes

    def checkpoint(self) -> tuple[bytes, bytes]:
        """The partition's own document (stream time, idleness, held node events), stored
        with the positions it goes with (`agent_loop`, CHECKPOINT), not as a key of its own."""
        if self._meta_dirty or self._meta_raw is None or self.meta.stream_time != self.stream_time:
            self.meta.stream_time = self.stream_time
            self._meta_raw = encode(self.meta)
            self._meta_dirty = False
        return META_KEY, self._meta_raw

    def _runtime(self, doc: NodeDoc) -> NodeRuntime:
        c = self.config
        return NodeRuntime(doc, c.window_ms, c.lateness_ms, c.flush_ms, c.horizon_ms)

    def _node(self, key: str, name: NodeName, cluster: str) -> NodeRuntime:
        """The node `name` of `cluster`, whose key is `key` (`node_key`)."""
        runtime = self.nodes.get(key)
        if runtime is None:
            # A window the partition has closed is closed for a node first seen now too.
            doc = NodeDoc(node=name, cluster=cluster, closed_through=self.stream_time)
            runtime = self.nodes[key] = self._runtime(doc)
        return runtime

    def _usage(
        self,
        node: NodeRuntime,
        integrals: SampleIntegrals,
        frontier: int | None,
        sample: NvmlSample,
    ) -> list[PodUsage]:
        """The pod usage messages the sample completes; its units of work left out counted.

        Usage behind the frontier revises the pod side's closed windows, within the
        horizon; only what is older is left out (`late_until`)."""
        late_until = None if frontier is None else frontier - self.config.horizon_ms
        if not sample.work:
            usage = node.usage.add(integrals, late_until)
        else:
            dropped = node.usage.units_dropped
            usage = node.usage.add(integrals, late_until, sample.work)
            self.counters.units_dropped += node.usage.units_dropped - dropped
        st = self.stream_time
        if st is not None and node.usage.due_by(st):
            # Stream time passed flush boundaries before this node's data made usage for
            # them (late data): what its data has left is flushed now.
            usage += node.usage.flush_behind(st, sample.ts + sample.interval_ms)
        return usage

    def _account(
        self,
        node: NodeRuntime,
        integrals: SampleIntegrals,
        frontier: int | None,
        sample: NvmlSample,
        out: Outputs,
    ) -> None:
        """A sample's integrals into its pods' usage and its GPUs' windows; the usage it
        completes sent, the kept windows its data has now passed (complete) sent again."""
        late_before = node.usage.late
        usage = self._usage(node, integrals, frontier, sample)
        if node.windows.add(integrals) or node.usage.late != late_before:
            self.counters.late += 1
        out.emit_all(POD_USAGE, usage)
        if node.windows.revisable:
            revised = node.windows.revisions(sample.ts + sample.interval_ms)
            if revised:
                self.counters.revisions += len(revised)
                out.emit_all(GPU_WINDOWS, revised)

    def _sample(self, source: Source, raw: bytes, out: Outputs) -> int | None:
        c = self.config
        sample = out.decode(
            NVML_SAMPLES,
            source,
            raw,
            check_sample,
            now_ms=c.now_ms,
            max_ahead_ms=c.max_clock_skew_ms,
            keyed=True,
        )
        if sample is None:
            return None
        self.counters.unknown_devices += len(unknown_devices(sample))
        key = node_key(sample.cluster, sample.node)
        known = self.nodes.get(key)
        if known is not None and known.seen_until is not None and sample.ts < known.seen_until:
            self.counters.duplicates += 1  # a redelivery: the node's state has it already
            # It moved stream time when first read, for every node of the partition: read
            # again after a crash whose state write stored only some of the nodes, it moves
            # it the same way, so the others' samples are no later than they were then.
            self._advance(sample.ts, out)
            return sample.ts
        self._release(sample.ts, out)  # node events up to the sample's time come first
        node = self._node(key, sample.node, sample.cluster)
        st = self.stream_time
        frontier = None if st is None else c.frontier(st)
        view = sample_view(sample)
        rules = c.rules.of(sample.cluster)
        integrals = integrate_sample(sample, rules.idle_util_pct, c.prices, view)
        self._account(node, integrals, frontier, sample, out)
        node.alert, alerts, lost = on_sample(
            node.alert,
            sample,
            rules,
            idle_alert_after_s=rules.idle_alert_after_s,
            telemetry_missing_after_s=rules.telemetry_missing_after_s,
            view=view,
        )
        self._alerts(alerts, out)
        self.counters.samples_missing += lost
        if c.fleet_topic is not None:
            # A gap found by this sample rather than by the watermark: its idle GPUs stopped
            # counting as idle when telemetry went missing, as they would have live.
            lost_at = _lost_at(alerts)
            if lost_at is not None:
                gone = node_after_idle_ended(node.fleet_use, set(), lost_at + 1)
                if gone is not None:
                    node.fleet_use = gone
                    self._fleet(node, gone, out)
            idle = _idle(node.alert)
            seen = (sample.allocations, idle)
            # Allocations rarely change between two samples: compared whole (in C), they
            # spare working the node's use out again (most of its cost on the hot path).
            if seen != node.fleet_seen or node.fleet_use is None:
                node.fleet_seen = seen
                at = sample.ts if frontier is None else max(sample.ts, frontier + 1)
                use = node_after_sample(node.fleet_use, sample, idle, at)
                if use is not None:
                    node.fleet_use = use
                    self._fleet(node, use, out)
        node.seen_until = sample.ts + sample.interval_ms
        self._dirty.add(key)
        meta = self.meta
        meta.covered = _later(meta.covered, node.seen_until)
        meta.longest_interval_ms = max(meta.longest_interval_ms, sample.interval_ms)
        meta.idle = False
        if c.now_ms is not None:
            lag = c.now_ms() - node.seen_until
            meta.live, meta.lag_ms = lag <= LIVE_MS, max(lag, 0)
        self._meta_dirty = True
        self._advance(sample.ts, out)
        if c.live is not None:
            c.live(sample)
        return sample.ts

    def _node_event(self, source: Source, raw: bytes, out: Outputs) -> int | None:
        c = self.config
        event = out.decode(
            K8S_NODES,
            source,
            raw,
            check_node,
            now_ms=c.now_ms,
            max_ahead_ms=c.max_clock_skew_ms,
            keyed=True,
        )
        if event is None:
            return None
        if self.stream_time is None or event.ts > self.stream_time:
            # Ahead of the samples: applied when stream time reaches it, in event time
            # order with them, however the two topics are interleaved on the way in.
            held = self.meta.held
            held.append(event)
            held.sort(key=lambda e: e.ts)  # stable: events of one time stay in order
            self._meta_dirty = True
            return event.ts
        self._apply_node_event(event, out)
        return event.ts

    def _release(self, until: int, out: Outputs) -> None:
        """Apply the held node events up to event time `until`."""
        held = self.meta.held
        if not held or held[0].ts > until:
            return
        due = [e for e in held if e.ts <= until]
        self.meta.held = [e for e in held if e.ts > until]
        self._meta_dirty = True
        for event in due:
            self._apply_node_event(event, out)

    def _apply_node_event(self, event: K8sNode, out: Outputs) -> None:
        c = self.config
        node = self._node(node_key(event.cluster, event.node), event.node, event.cluster)
        if event.type == "DELETED":
            node.alert, alerts = on_node_removed(node.alert, event.ts)
            node.deleted = True
            self._alerts(alerts, out)
        else:
            node.deleted = False
            node.labels = dict(event.labels)
            c.prices.set_node_labels(node.node, node.labels, node.cluster)
        if c.fleet_topic is not None:
            # At the event's own time, however late on the samples: the fleet partition
            # waits for this partition's mark of the tick that follows it.
            view = node_after_event(node.fleet_node, event)
            if view is not None:
                node.fleet_node = view
                self._fleet(node, view, out)
        self._dirty.add(node.key)

    def _marks(self) -> tuple[int | None, int | None]:
        """Which window close and which flush boundary stream time has passed."""
        st = self.stream_time
        if st is None:
            return None, None
        return (st - self.config.lateness_ms) // self.config.window_ms, st // self._step

    def _advance(self, ts: int, out: Outputs) -> None:
        if self.stream_time is not None and ts <= self.stream_time:
            return
        self._release(ts, out)
        self.stream_time = st = ts
        close_mark, flush_mark = self._marks()
        if close_mark != self._close_mark:
            self._close_mark = close_mark
            self._meta_dirty = True
            for node in self.nodes.values():
                out.emit_all(GPU_WINDOWS, node.windows.close(st, node.seen_until))
                self._dirty.add(node.key)  # its closed_through moved: store it
        if flush_mark != self._flush_mark:
            self._flush_mark = flush_mark
            self._meta_dirty = True
            for node in self.nodes.values():
                tracks = len(node.usage.store)
                usage = node.usage.flush(st)
                if usage or len(node.usage.store) != tracks:
                    out.emit_all(POD_USAGE, usage)
                    self._dirty.add(node.key)
            self._watermark(st, out)

    def _alerts(self, alerts: list[Alert], out: Outputs) -> None:
        """Send alerts: the GPU health ones through the fleet partition, which adds the
        named pods' workload owners (`FleetAlert`), where there is one; the others now."""
        c = self.config
        if c.fleet_topic is None or not any(a.name in HEALTH_SEVERITY for a in alerts):
            out.emit_all(ALERTS, alerts)
            return
        st = self.stream_time
        floor = None if st is None else c.frontier(st)
        for alert in alerts:
            if alert.name not in HEALTH_SEVERITY:
                out.emit(ALERTS, alert)
                continue
            at = alert.ts if floor is None else max(alert.ts, floor + 1)
            told = encode_input(FleetAlert(ts=at, alert=alert))
            out.emit_raw(c.fleet_topic, b"", told, FLEET_PARTITION)

    def _fleet(self, node: NodeRuntime, view: FleetNode | FleetUse, out: Outputs) -> None:
        """Send what changed of a node's capacity to the fleet partition."""
        topic = self.config.fleet_topic
        if topic is not None:
            self._dirty.add(node.key)
            out.emit_raw(topic, b"", encode_input(view), FLEET_PARTITION)

    def _watermark(self, st: int, out: Outputs) -> None:
        """Missing telemetry of the nodes at stream time `st`."""
        base = self.config.rules
        for node in self.nodes.values():
            rules = base.of(node.cluster)
            node.alert, alerts = on_watermark(
                node.alert, st, rules, telemetry_missing_after_s=rules.telemetry_missing_after_s
            )
            if alerts:
                self._alerts(alerts, out)
                self._dirty.add(node.key)
                if self.config.fleet_topic is not None:
                    firing = {uuid for uuid, _, _ in _idle(node.alert)}
                    # Dated by when telemetry counts as missing (the alert's own time), not
                    # by the stream time it was found at, which depends on what came when.
                    lost_at = _lost_at(alerts)
                    at = (st if lost_at is None else lost_at) + 1
                    use = node_after_idle_ended(node.fleet_use, firing, at)
                    if use is not None:
                        node.fleet_use = use
                        self._fleet(node, use, out)


def _lost_at(alerts: list[Alert]) -> int | None:
    """When the node's telemetry went missing, by the NodeTelemetryMissing among `alerts`
    that fires (in event time, whatever came when); None where none does."""
    for a in alerts:
        if a.name == "NodeTelemetryMissing" and a.status == "firing":
            return a.ts
    return None


def _idle(alert: NodeAlertState) -> list[tuple[str, int, tuple[str, ...]]]:
    """The GPUs whose GpuIdleAllocated alert fires: uuid, idle since, holders (`ns/pod`)."""
    out: list[tuple[str, int, tuple[str, ...]]] = []
    for uuid, run in alert.idle.items():
        if run.firing:
            labels = run.labels
            if "pods" in labels:
                pods = tuple(labels["pods"].split(","))
            elif "pod" in labels:
                pods = (f"{labels.get('namespace', '')}/{labels['pod']}",)
            else:
                pods = ()
            out.append((uuid, run.since, pods))
    return out


def _later(a: int | None, b: int | None) -> int | None:
    """The later of two optional times."""
    if a is None:
        return b
    return a if b is None else max(a, b)
