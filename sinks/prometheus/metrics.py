"""gpuwatch's Prometheus metrics (docs/DESIGN.md §5): fed with decoded records, rendered at scrape.

Two processes feed one each: `gpuwatch sink metrics` the pods, GPUs and the fleet's
capacity (sinks/prometheus/feed.py, from the topics), the worker its pipeline's counters and
the stream's alerts as it emits them (gpuwatch/run/worker_sinks.py).

Cardinality is bounded: label names are fixed (team is the one pod label read), values are
cleaned, a finished pod's series go after `finished_grace_s`, and pods, GPUs, firing alert
series, capacity keys and counter label sets each have a cap; refused updates count in
`gpuwatch_metrics_series_dropped_total`.

Each process exports what its partitions hold: pods of its pod-uid partitions (lifecycle,
usage, attribution, pod alerts), GPUs of its node (or GPU) partitions (samples, windows, GPU
and node alerts), capacity keys of its capacity partitions, so sums over replicas count
everything once. On a rebalance call `forget(pods=..., nodes=..., capacity=...)` for what was
revoked and re-observe the lifecycle state of the pods assigned (and the firing alerts,
which the stream does not repeat: alerts.py).

GPU health (throttle reasons, ECC, row remapping, PCIe replays) is the last sample's, kept
as read and turned into series at scrape time; a null reading has no series. Xid errors
count per GPU and code from each sample later than the GPU's last (a redelivered sample
counts once, an older one not at all).

Window-derived counters (cost, waste, idle seconds) count each window once, and a window
the worker revises (the same `(uid | uuid, window_start)` again with a higher `revision`)
by the difference to what was counted for it, never the whole record again; a redelivered
copy or a lower revision adds nothing (`CountedWindows`, sinks/prometheus/marks.py). Memory
is bounded: the figures counted are remembered for the revision horizon (an hour of event
time, `keep_revisions_for`) and for at most `max_counted_windows` windows of pods and as
many of GPUs; past either, a revision of a forgotten window adds nothing (the counters
miss its difference rather than count the window twice). A window older than the newest
counted for its pod or GPU and not remembered is a replay and is not counted; the marks
live in this process, so records re-consumed after a restart, or by a new owner after a
rebalance, count again; marks of the least recently seen pods and GPUs are forgotten past
`2 * max_pod_series` and `max_gpu_series` keys.

A pod's share on a GPU is its own compute share: pod.usage's mean, or a window's used over
allocated GPU-seconds only where the pod held the GPU alone (on a GPU shared by k pods that
ratio is k times its share). Usage of a pod not known yet (a backlog brings usage before
the lifecycle that names the pod) waits for it, for the latest `max_pod_series` such pods.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet

from prometheus_client import REGISTRY, CollectorRegistry

from schemas.alert import Alert
from schemas.attribution import Attribution, GpuAttribution
from schemas.capacity import Capacity
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from sinks.prometheus.alerts import FiringAlerts, NodeRef, NodeSet
from sinks.prometheus.capacity import CapacitySeries
from sinks.prometheus.collector import (
    GPU_LABELS,
    POD_LABELS,
    GpuSeries,
    MetricsServeError,
    PodSeries,
    Snapshot,
    WorkerCollector,
    clean,
    label_text,
    serve,
)
from sinks.prometheus.marks import CountedWindows, Marks

__all__ = ["Marks", "MetricsServeError", "NodeRef", "PipelineCounts", "WorkerMetrics", "serve"]

GPU_STALE_S = 30.0  # GPU gauges hide 30 s after the last sample: the node's telemetry is missing
STALE_POD_S = 86_400.0  # a pod with no record for a day is forgotten (its finish was lost)
SWEEP_EVERY_S = 10.0  # full scans for quiet pods and GPUs at most this often, not every scrape
MAX_UNITS = 16  # units of work shown per pod: an annotation names a handful
REVISION_HORIZON_S = 3600.0  # the worker's default GPUWATCH_REVISION_HORIZON_S
_NOBODY: AbstractSet[str] = frozenset()
_COUNTERS = ("cost_usd", "waste_usd", "events", "deadletter", "alerts")


PipelineCounts = dict[str, dict[tuple[str, ...], float]]
"""Counters kept by the stream processors, by family name (`gpuwatch_events`...) and labels;
added to this object's own at scrape time."""


def _pod_labels(
    namespace: str, pod: str, team: str | None, node: str | None, cluster: str
) -> tuple[str, str, str, str, str]:
    """A pod's label values, in the order of POD_LABELS."""
    return (clean(namespace), clean(pod), clean(team), clean(node), clean(cluster))


def _window_share(gpu: GpuAttribution) -> float | None:
    """The pod's own compute share over a window, where the window tells it: on a GPU the
    pod held alone (`exclusive`), its used over its allocated GPU-seconds; None otherwise.

    The seconds of a GPU shared by k pods count 1/k to each while the used seconds are the
    pod's own share times the seconds, so their ratio is k times the share (a pod at 30 %
    of a GPU time-sliced three ways read 0.9). pod.usage carries the pod's own share.
    """
    seconds = gpu.allocated_gpu_seconds
    if gpu.method != "exclusive" or seconds <= 0:
        return None
    return min(1.0, gpu.used_gpu_seconds / seconds)


class WorkerMetrics:
    """Metric state of one worker process, rendered by a custom collector at scrape time."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        max_pod_series: int = 50_000,
        max_gpu_series: int = 100_000,
        max_label_sets: int = 10_000,
        max_alert_series: int = 50_000,
        max_capacity_keys: int = 1000,
        max_counted_windows: int = 100_000,
        revision_horizon_s: float = REVISION_HORIZON_S,
        finished_grace_s: float = 300.0,
        gpu_stale_s: float = GPU_STALE_S,
        team_label: str = "team",
        clock: Callable[[], float] = time.monotonic,
        pipeline: Callable[[], PipelineCounts] | None = None,
    ) -> None:
        self.registry = REGISTRY if registry is None else registry
        self._pipeline = pipeline
        self._max_pods, self._max_gpus = max_pod_series, max_gpu_series
        self._max_sets = max_label_sets
        self._grace_s, self._gpu_stale_s, self._team = finished_grace_s, gpu_stale_s, team_label
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, PodSeries] = {}
        self._finished: OrderedDict[str, float] = OrderedDict()  # uid -> clock when finished
        self._removed = Marks(2 * max_pod_series)  # uid -> finish ts: replays do not revive it
        self._gpus: dict[str, GpuSeries] = {}
        horizon_ms = round(revision_horizon_s * 1000)
        self._pod_windows = CountedWindows(
            keys=2 * max_pod_series, size=max_counted_windows, horizon_ms=horizon_ms
        )
        self._gpu_windows = CountedWindows(
            keys=max_gpu_series, size=max_counted_windows, horizon_ms=horizon_ms
        )
        # uid -> uuid -> (model, share, VRAM, end_ts): the newest usage of pods not known yet
        self._early: OrderedDict[str, dict[str, tuple[str, float | None, int, int]]]
        self._early = OrderedDict()
        self._alert_marks = Marks(max_label_sets)
        self._firing = FiringAlerts(max_alert_series)
        self._capacity = CapacitySeries(max_capacity_keys)
        self._counters: dict[str, dict[tuple[str, ...], float]] = {n: {} for n in _COUNTERS}
        self._dropped = {"pod": 0.0, "gpu": 0.0, "alert": 0.0, "capacity": 0.0, "label_set": 0.0}
        self._lag_s: float | None = None
        self._stream_ms = 0
        self._swept = float("-inf")
        self.registry.register(WorkerCollector(self.snapshot))

    def observe_lifecycle(self, rec: PodLifecycle) -> None:
        """The pod's state from a transition; one older than the state shown is ignored."""
        now, team = self._clock(), rec.labels.get(self._team)
        with self._lock:
            self._advance(rec.ts)
            labels = _pod_labels(rec.namespace, rec.pod, team, rec.node, rec.cluster)
            pod = self._pod(rec.uid, labels, now, rec.ts)
            if pod is None or rec.ts < pod.state_ts:
                return
            if labels != pod.labels:
                pod.labels, pod.text = labels, label_text(POD_LABELS, labels)
            spent = {"queued": rec.queued_ms, "running": rec.running_ms, "stalled": rec.stalled_ms}
            pod.state, pod.state_ts = rec.to_state, rec.ts
            pod.state_base_ms = spent.get(rec.to_state, 0)
            if rec.to_state == "finished":
                self._finished[rec.uid] = now
                self._finished.move_to_end(rec.uid)
            else:
                self._finished.pop(rec.uid, None)

    def observe_usage(self, rec: PodUsage) -> None:
        """Live share and VRAM of a pod; kept for a pod not known yet from its lifecycle or
        attribution (they name it) until they come.

        A backlog brings a pod's usage before its lifecycle: the worker writes pod.usage
        first and the pod side's records from it, and a consumer reads topics at their own
        pace. Dropped, the usage left the share to the windows.
        """
        now = self._clock()
        with self._lock:
            self._advance(rec.end_ts)
            pod = self._pods.get(rec.uid)
            if pod is None:
                self._keep_early(rec)
                return
            pod.touched = now
            for gpu in rec.gpus:
                pod.put_gpu(gpu.uuid, gpu.model, gpu.share_mean, gpu.vram_peak_bytes, rec.end_ts)

    def observe_attribution(self, rec: Attribution) -> None:
        """Cost and waste of a closed window (once per identity, a revision by its
        difference), and the pod's VRAM and, on a GPU it held alone, its share."""
        now, team = self._clock(), rec.labels.get(self._team)
        with self._lock:
            self._advance(rec.window_end)
            figures = (rec.cost_usd, rec.waste_usd)
            added = self._pod_windows.count(rec.uid, rec.window_start, rec.revision, figures)
            if added is not None:
                key = (clean(rec.namespace), clean(team), clean(rec.cluster))
                self._add("cost_usd", key, added[0])
                self._add("waste_usd", key, added[1])
            pod = self._pods.get(rec.uid)
            if pod is None and rec.state != "finished":
                labels = _pod_labels(rec.namespace, rec.pod, team, rec.node, rec.cluster)
                pod = self._pod(rec.uid, labels, now, rec.ts)
            if pod is None:
                return
            pod.touched = now
            if (rec.window_start, rec.revision) >= (pod.per_unit_ts, pod.per_unit_rev):
                pod.per_unit_ts, pod.per_unit_rev = rec.window_start, rec.revision
                pod.per_unit = {
                    clean(unit): usd
                    for unit, usd in sorted(rec.cost_per_unit.items())[:MAX_UNITS]
                    if usd is not None
                }
            for gpu in rec.gpus:
                share = _window_share(gpu)
                size, end = gpu.vram_peak_bytes, rec.window_end
                pod.put_gpu(gpu.uuid, gpu.model, share, size, end, window=rec.revision)

    def observe_gpu_window(self, rec: GpuWindow) -> None:
        """Idle seconds of a closed GPU window, allocated and not, once per (uuid,
        window_start), a revision by its difference."""
        now = self._clock()
        with self._lock:
            self._advance(rec.window_end)
            gpu = self._gpu(rec.uuid, rec.node, rec.model, rec.cluster, now)
            if gpu is None:
                return
            held = rec.allocated_idle_seconds
            figures = (held, max(0.0, rec.idle_seconds - held))
            added = self._gpu_windows.count(rec.uuid, rec.window_start, rec.revision, figures)
            if added is None:
                return
            gpu.touched = now
            gpu.idle_allocated_s += added[0]
            gpu.idle_unallocated_s += added[1]

    def observe_sample(self, sample: NvmlSample) -> None:
        """Live utilization, allocation, unallocated access and health of the node's GPUs;
        the Xid errors of each sample later than the GPU's last counted once."""
        holders: dict[str, set[str]] = {}
        for alloc in sample.allocations:
            for device in alloc.device_ids:
                holders.setdefault(device, set()).add(alloc.pod_uid)
        mig_held = {g.parent_uuid for g in sample.gpus if g.parent_uuid and g.uuid in holders}
        now = self._clock()
        with self._lock:
            self._advance(sample.ts + sample.interval_ms)
            for reading in sample.gpus:
                gpu = self._gpu(reading.uuid, sample.node, reading.model, sample.cluster, now)
                if gpu is None or sample.ts < gpu.sample_ts:
                    continue  # capped, or an older sample replayed
                held: AbstractSet[str] = holders.get(reading.uuid, _NOBODY)
                if reading.parent_uuid is not None:
                    held = held | holders.get(reading.parent_uuid, _NOBODY)
                allocated = reading.uuid in holders or reading.uuid in mig_held
                if reading.xid_errors and sample.ts > gpu.sample_ts:  # not a redelivery
                    self._dropped["label_set"] += gpu.count_xids(reading.xid_errors)
                gpu.apply(reading, held, allocated=allocated, ts=sample.ts, now=now)

    def observe_alert(self, alert: Alert) -> None:
        """Count an in-stream alert message once per (fingerprint, ts); show it while firing."""
        with self._lock:
            self._advance(alert.ts)
            if self._alert_marks.advance(alert.fingerprint, alert.ts):
                self._add("alerts", (alert.name, alert.severity, alert.status, alert.cluster), 1.0)
            self._dropped["alert"] += self._firing.observe(alert)

    def observe_capacity(self, rec: Capacity) -> None:
        """The capacity picture of the record's (cluster, model, resource), unless the one
        shown is as new or newer."""
        with self._lock:
            self._advance(rec.ts)
            self._dropped["capacity"] += self._capacity.observe(rec)

    def keep_revisions_for(self, horizon_s: float) -> None:
        """How long (event time behind the newest window) the figures counted per window are
        kept for its revisions: the worker's revision horizon (`windows.revision_horizon_s`)."""
        with self._lock:
            horizon_ms = max(0, round(horizon_s * 1000))
            self._pod_windows.horizon_ms = self._gpu_windows.horizon_ms = horizon_ms

    def show_firing(self, alert: Alert) -> None:
        """Show an alert a restored state says is firing, without counting it as a message
        (it was counted by the process that received it)."""
        with self._lock:
            self._dropped["alert"] += self._firing.observe(alert)

    def count_event(self, topic: str, n: int = 1) -> None:
        """`n` records of `topic` processed."""
        with self._lock:
            self._add("events", (clean(topic),), float(n))

    def count_deadletter(self, topic: str, reason_class: str) -> None:
        """One record of `topic` dead-lettered; `reason_class` is a short, bounded word."""
        with self._lock:
            self._add("deadletter", (clean(topic), clean(reason_class)), 1.0)

    def set_lag(self, seconds: float) -> None:
        """Wall time minus the event time processed; negative (clock skew) reads as 0."""
        with self._lock:
            self._lag_s = max(0.0, seconds)

    def forget(
        self,
        *,
        pods: Iterable[str] = (),
        gpus: Iterable[str] = (),
        nodes: Iterable[NodeRef] = (),
        capacity: Iterable[str] = (),
    ) -> None:
        """Drop the series of pods (uids), GPUs (uuids), nodes and capacity keys
        (`capacity_key`s) of revoked partitions.

        A node is `(cluster, node)`, or a bare node name for that name in every cluster
        (what a partition keyed by node name holds). With them go the firing alerts they
        own: a pod's alerts, a GPU's and a node's (and the GPU alerts of the node's GPUs).
        """
        pods, gpus, gone_nodes = list(pods), list(gpus), NodeSet(nodes)
        with self._lock:
            self._capacity.forget(capacity)
            self._firing.forget(pods, gpus, gone_nodes)
            for uid in pods:
                self._pods.pop(uid, None)
                self._finished.pop(uid, None)
                self._early.pop(uid, None)
            for uuid in gpus:
                self._gpus.pop(uuid, None)
            if gone_nodes:
                for uuid, g in list(self._gpus.items()):
                    if (g.cluster_raw, g.node_raw) in gone_nodes:
                        del self._gpus[uuid]

    def expire(self, now: float | None = None) -> None:
        """Remove finished pods past their grace, and pods and GPUs gone quiet."""
        with self._lock:
            self._expire(self._clock() if now is None else now)

    def snapshot(self) -> Snapshot:
        """Expire, then copy out what a scrape renders (the collector calls it)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            counters = {f"gpuwatch_{n}": dict(v) for n, v in self._counters.items()}
            for name, values in (self._pipeline() if self._pipeline else {}).items():
                family = counters.setdefault(name, {})
                for key, value in values.items():
                    family[key] = family.get(key, 0.0) + value
            sets = sum(len(values) for values in self._counters.values())
            counters["gpuwatch_metrics_series_dropped"] = {
                (k,): n for k, n in self._dropped.items()
            }
            counters["gpuwatch_metrics_tracked"] = {
                ("pod",): len(self._pods), ("gpu",): len(self._gpus),
                ("alert",): len(self._firing), ("capacity",): len(self._capacity),
                ("label_set",): sets,
            }  # fmt: skip
            if self._lag_s is not None:
                counters["gpuwatch_pipeline_lag_seconds"] = {(): self._lag_s}
            stream, live = self._stream_ms, now - self._gpu_stale_s
            pods = [
                (p.labels, p.text, p.state, (p.state_base_ms + max(0, stream - p.state_ts)) / 1e3,
                 tuple((g.labels, g.text, g.share, g.memory_bytes) for g in p.gpus.values()))
                for p in self._pods.values()
            ]  # fmt: skip
            gpus = [
                (g.labels, g.text, g.sampled >= live, g.utilization, g.allocated,
                 g.unallocated_access, g.idle_allocated_s, g.idle_unallocated_s)
                for g in self._gpus.values()
            ]  # fmt: skip
            per_unit = [
                (p.labels, p.text, unit, usd)
                for p in self._pods.values()
                for unit, usd in p.per_unit.items()
            ]
            alerts = self._firing.rows()
            health = [h for g in self._gpus.values() if (h := g.health(g.sampled >= live))]
            return Snapshot(
                pods=pods, gpus=gpus, counters=counters, alerts=alerts, health=health,
                capacity=self._capacity.rows(), per_unit=per_unit,
            )  # fmt: skip

    # Below: called with the lock held.

    def _advance(self, ts_ms: int) -> None:
        self._stream_ms = max(self._stream_ms, ts_ms)

    def _add(self, name: str, key: tuple[str, ...], amount: float) -> None:
        values = self._counters[name]
        if key in values:
            values[key] += amount
        elif sum(len(v) for v in self._counters.values()) < self._max_sets:
            values[key] = amount
        else:
            self._dropped["label_set"] += 1

    def _pod(
        self, uid: str, labels: tuple[str, str, str, str, str], now: float, ts: int
    ) -> PodSeries | None:
        pod = self._pods.get(uid)
        if pod is None:
            finished = self._removed.last(uid)
            if finished is not None and ts <= finished:
                return None  # a replayed record of a pod already finished and removed
            if len(self._pods) >= self._max_pods and not self._evict_finished():
                self._dropped["pod"] += 1
                return None
            pod = self._pods[uid] = PodSeries(labels, now)
            for uuid, (model, share, size, end) in self._early.pop(uid, {}).items():
                pod.put_gpu(uuid, model, share, size, end)
        pod.touched = now
        return pod

    def _keep_early(self, rec: PodUsage) -> None:
        """The newest usage per GPU of a pod not known yet, for the latest `max_pod_series`
        such pods; none of a pod finished and removed."""
        finished = self._removed.last(rec.uid)
        if finished is not None and rec.end_ts <= finished:
            return
        early = self._early.get(rec.uid)
        if early is None:
            early = self._early[rec.uid] = {}
            if len(self._early) > self._max_pods:
                self._early.popitem(last=False)
        for gpu in rec.gpus:
            held = early.get(gpu.uuid)
            if held is None or rec.end_ts >= held[3]:
                early[gpu.uuid] = (gpu.model, gpu.share_mean, gpu.vram_peak_bytes, rec.end_ts)

    def _gpu(self, uuid: str, node: str, model: str, cluster: str, now: float) -> GpuSeries | None:
        gpu = self._gpus.get(uuid)
        if (
            gpu is not None
            and gpu.node_raw == node
            and gpu.model_raw == model
            and gpu.cluster_raw == cluster
        ):
            return gpu
        if gpu is None and len(self._gpus) >= self._max_gpus:
            self._dropped["gpu"] += 1
            return None
        labels = (clean(node), clean(uuid), clean(model), clean(cluster))
        if gpu is None:
            gpu = self._gpus[uuid] = GpuSeries(labels, node, model, cluster, touched=now)
        else:
            gpu.labels, gpu.node_raw, gpu.model_raw = labels, node, model
            gpu.cluster_raw = cluster
            gpu.text = label_text(GPU_LABELS, labels)
        return gpu

    def _evict_finished(self) -> bool:
        if not self._finished:
            return False
        uid, _ = self._finished.popitem(last=False)
        pod = self._pods.pop(uid, None)
        if pod is not None:
            self._removed.advance(uid, pod.state_ts)
        return True

    def _expire(self, now: float) -> None:
        while self._finished and now - next(iter(self._finished.values())) >= self._grace_s:
            self._evict_finished()
        if now - self._swept < SWEEP_EVERY_S:
            return
        self._swept = now
        for uid in [u for u, p in self._pods.items() if now - p.touched >= STALE_POD_S]:
            del self._pods[uid]
            self._finished.pop(uid, None)
        for uuid in [u for u, g in self._gpus.items() if now - g.touched >= self._grace_s]:
            del self._gpus[uuid]
