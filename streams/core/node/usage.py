"""Node-side pre-aggregation of per-pod GPU usage into `pod.usage` messages (docs/DESIGN.md §4).

`pod.usage` is the pipeline's one repartition (node -> pod uid); one message per GPU-sample
would cost the fleet 40,000 messages/s. A pod's intervals are summed here into one
`PodUsage` per pod per flush period, keeping everything the pod side needs with event-time
precision: integrals, peak VRAM, `[ts, end_ts)` and `idle_since`.

Flush rule. A pod's pending message covers contiguous event time and is emitted when:
- its data reaches the next multiple of `flush_ms` or the end of its window (`add`), so a
  message never straddles a window and a sample that does is cut in two by fraction
  (except a whole sample with nothing pending and no units: one message across the end,
  which the pod side cuts by the same fraction to the same bits);
- stream time passes that boundary without its data reaching it (`flush`): a pod that ended,
  a node that went quiet;
- the next sample does not start where the last ended (a gap: lost samples), or
- the pod stops being idle: the message ending at its last idle instant carries the
  `idle_since` of the run, so a stall that ended mid-period is still seen.

`idle_since` is the start of the current run of samples in which the pod was idle (its own
share under the threshold) on every GPU allocated to it; unknown shares, no allocation and
gaps end a run, since unknown is not idle. It is carried across messages for as long as the
pod's samples stay contiguous. A sample that starts before the pod's last one ended overlaps
usage already counted (a redelivery after a restart) and is dropped (`overlapping`).
"""

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Final

import msgspec

from schemas.fields import DEFAULT_CLUSTER, AttributionMethod, Sharing
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import GpuReading, PodWork
from schemas.pod_usage import GpuUsage, PodUsage
from streams.core.integrals import (
    PRECISION,
    PodGpuIntegrals,
    PodIntegrals,
    SampleIntegrals,
    share_mean,
)
from streams.core.windows import Part, split_interval, window_start

__all__ = ["FLUSH_MS", "GpuUsageAcc", "PendingUsage", "PodTrack", "UsageAggregator"]

FLUSH_MS = 10_000  # 10 samples a message at 1 Hz (docs/DESIGN.md §4: an order of magnitude fewer)
_SCHEMA: Final = "gpuwatch.pod.usage/v1"


class GpuUsageAcc(PodGpuIntegrals, kw_only=True, gc=False):
    """One GPU's integrals for one pod within a pending message."""

    uuid: GpuUuid
    model: str
    sharing: Sharing
    method: AttributionMethod
    share_seconds: float = 0.0

    def add(self, p: PodIntegrals, f: float) -> None:
        """Add fraction `f` of one interval's integrals (peaks whole)."""
        self.allocated_seconds += p.allocated_seconds * f
        self.used_gpu_seconds += p.used_gpu_seconds * f
        self.share_seconds += p.share_seconds * f
        self.idle_seconds += p.idle_seconds * f
        self.vram_byte_seconds += p.vram_byte_seconds * f
        self.energy_joules += p.energy_joules * f
        self.cost_usd += p.cost_usd * f
        self.waste_usd += p.waste_usd * f
        self.vram_peak_bytes = max(self.vram_peak_bytes, p.vram_peak_bytes)
        method = p.method
        if method != self.method and PRECISION[method] > PRECISION[self.method]:
            self.method = method  # the least precise wins

    def add_whole(self, p: PodIntegrals) -> None:
        """`add(p, 1.0)` without the multiplications (x * 1.0 is x: the same sums)."""
        self.allocated_seconds += p.allocated_seconds
        self.used_gpu_seconds += p.used_gpu_seconds
        self.share_seconds += p.share_seconds
        self.idle_seconds += p.idle_seconds
        self.vram_byte_seconds += p.vram_byte_seconds
        self.energy_joules += p.energy_joules
        self.cost_usd += p.cost_usd
        self.waste_usd += p.waste_usd
        self.vram_peak_bytes = max(self.vram_peak_bytes, p.vram_peak_bytes)
        method = p.method
        if method != self.method and PRECISION[method] > PRECISION[self.method]:
            self.method = method  # the least precise wins

    def usage(self) -> GpuUsage:
        """The GPU's entry in the message."""
        return GpuUsage(
            uuid=self.uuid,
            model=self.model,
            sharing=self.sharing,
            allocated_seconds=self.allocated_seconds,
            used_gpu_seconds=self.used_gpu_seconds,
            idle_seconds=self.idle_seconds,
            vram_byte_seconds=self.vram_byte_seconds,
            vram_peak_bytes=self.vram_peak_bytes,
            energy_joules=self.energy_joules,
            share_mean=share_mean(self.used_gpu_seconds, self.share_seconds),
            cost_usd=self.cost_usd,
            waste_usd=min(self.waste_usd, self.cost_usd),  # equal up to rounding when idle
            method=self.method,
        )


class PendingUsage(msgspec.Struct, gc=False, omit_defaults=True):
    """A pod's message in the making: `[ts, end_ts)` inside one window, due at `due`."""

    ts: int
    end_ts: int
    window_start: int
    due: int
    samples: int = 0
    gpus: dict[GpuUuid, GpuUsageAcc] = msgspec.field(default_factory=dict)
    units: dict[str, float] | None = None
    """Units of work the samples so far brought (their `work`), by name."""


class PodTrack(msgspec.Struct, gc=False):
    """What is kept of a pod between its samples: where they end, its idle run, its message."""

    uid: PodUid
    node: NodeName
    last_end: int
    idle_since: int | None = None
    pending: PendingUsage | None = None


class UsageAggregator:
    """The pods of a partition's nodes, each with its pending `PodUsage`.

    `store` may be any mapping keyed by pod uid (a Faust Table in the worker); tracks are
    mutated in place. Tracks of pods silent for a whole window are forgotten by `flush`.
    `cluster` is the cluster of the node (or nodes) the pods run on; the messages carry it.
    """

    def __init__(
        self,
        window_ms: int,
        flush_ms: int = FLUSH_MS,
        store: MutableMapping[PodUid, PodTrack] | None = None,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        if window_ms <= 0 or flush_ms <= 0:
            raise ValueError("window_ms and flush_ms must be positive")
        self.cluster = cluster
        self.window_ms = window_ms
        self.flush_ms = flush_ms
        self.store: MutableMapping[PodUid, PodTrack] = {} if store is None else store
        self.overlapping = 0
        """Pod-samples dropped because they overlap usage already counted."""
        self.late = 0
        """Samples of pods whose usage was cut at the frontier (`add(late_until=...)`)."""
        self.units_dropped = 0
        """Pods' units of work left out: the pod had no usage in the sample, or the part
        of the sample they belong to was late."""
        self._due: dict[int, list[PodUid]] = {}
        self._sweep_at = 0  # stream time of the next look for silent pods
        for uid, track in self.store.items():
            if track.pending is not None:
                self._due.setdefault(track.pending.due, []).append(uid)

    def add(
        self,
        sample: SampleIntegrals,
        late_until: int | None = None,
        work: Sequence[PodWork] = (),
    ) -> list[PodUsage]:
        """Take a node sample's integrals in; return the messages it completed.

        Usage before `late_until` (the partition's usage frontier: everything ending there
        has been sent and the pod side may have closed it) is late: that part of the
        sample is left out and the sample counted in `late`.

        `work` is the units of work the sample brought, by pod (`NvmlSample.work`): they
        go with the pod's usage of the sample's first part (the window of its start), so
        they count in the window of the scrape. Units of a pod with no usage in the
        sample, or whose first part is late, are counted in `units_dropped`.
        """
        per_pod: dict[PodUid, list[tuple[GpuReading, PodIntegrals]]] = {}
        for gpu, integrals in sample.gpus:
            for pod in integrals.pods:
                items = per_pod.get(pod.uid)
                if items is None:
                    per_pod[pod.uid] = [(gpu, pod)]
                else:
                    items.append((gpu, pod))
        out: list[PodUsage] = []
        if per_pod:
            parts = split_interval(sample.ts, sample.end_ts - sample.ts, self.window_ms)
            if late_until is not None and sample.ts < late_until:
                parts = _after(parts, late_until)
                self.late += 1
            done = {w.pod_uid: w.units for w in work if w.units}
            if done and not (parts and parts[0].start_ms == sample.ts):
                self.units_dropped += len(done)  # the sample's start is late
                done = {}
            for uid, items in per_pod.items():
                self._add_pod(sample, uid, items, parts, out, units=done.pop(uid, None))
            self.units_dropped += len(done)  # pods with no usage in the sample
        elif work:
            self.units_dropped += sum(1 for w in work if w.units)
        return out

    def flush(self, until_ts: int) -> list[PodUsage]:
        """Messages whose flush boundary stream time `until_ts` has reached."""
        out: list[PodUsage] = []
        dues = sorted(due for due in self._due if due <= until_ts)
        for due in dues:
            for uid in self._due.pop(due):
                track = self.store.get(uid)
                if (
                    track is not None
                    and track.pending is not None
                    and track.pending.due <= until_ts
                ):
                    out.append(self._emit(track))
        if until_ts >= self._sweep_at:  # about once per flush period of stream time
            self._sweep_at = until_ts + self.flush_ms
            silent = until_ts - self.window_ms
            for uid in [u for u, t in self.store.items() if t.last_end <= silent]:
                track = self.store.pop(uid)
                if track.pending is not None:
                    out.append(self._emit(track))
        return out

    def due_by(self, until_ts: int) -> bool:
        """Whether a pending message's flush boundary is at or before `until_ts`."""
        return bool(self._due) and min(self._due) <= until_ts

    def flush_behind(self, until_ts: int, node_end: int) -> list[PodUsage]:
        """Messages whose flush boundary stream time `until_ts` has passed, of the pods
        whose data ended before `node_end` (the end of their node's newest sample).

        For a node behind stream time (its data late): stream time passed these boundaries
        before its data made usage for them, so no `flush` will come for them; a pod its
        data still reaches goes on to its boundary (`add`), one its data left is emitted,
        as stream time passing the boundary would have done on time."""
        out: list[PodUsage] = []
        for due in sorted(due for due in self._due if due <= until_ts):
            waiting = []
            for uid in self._due.pop(due):
                track = self.store.get(uid)
                if track is None or track.pending is None or track.pending.due != due:
                    continue
                if track.last_end < node_end:
                    out.append(self._emit(track))
                else:
                    waiting.append(uid)
            if waiting:
                self._due[due] = waiting
        return out

    def _add_pod(
        self,
        sample: SampleIntegrals,
        uid: PodUid,
        items: list[tuple[GpuReading, PodIntegrals]],
        parts: tuple[Part, ...],
        out: list[PodUsage],
        *,
        units: Mapping[str, float] | None = None,
    ) -> None:
        ts = sample.ts
        track = self.store.get(uid)
        if track is not None and ts < track.last_end:
            self.overlapping += 1
            return
        if track is None or ts > track.last_end:  # new, or after a gap: nothing carries over
            if track is not None and track.pending is not None:
                out.append(self._emit(track))
            track = self.store[uid] = PodTrack(uid, sample.node, ts)
        idle_since = track.idle_since
        if _idle_everywhere(items):
            idle_since = ts if idle_since is None else idle_since
        else:
            if track.idle_since is not None and track.pending is not None:
                out.append(self._emit(track))  # its end is the run's last idle instant
            idle_since = None
        if len(parts) > 1 and track.pending is None and units is None and parts[0].start_ms == ts:
            # A whole sample across a window end, nothing pending: one message of it. The
            # pod side cuts it at the window end by the same fraction (`add_usage`), to the
            # same bits: a long sample is one message, not one per window it touches.
            track.idle_since = idle_since
            self._add_whole_sample(track, parts, items, out)
            track.last_end = sample.end_ts
            return
        for part in parts:
            pending = track.pending
            if pending is not None and (
                part.window_start != pending.window_start or part.start_ms >= pending.due
            ):
                out.append(self._emit(track))
                pending = None
            if pending is None:
                pending = track.pending = self._pending(uid, part)
            _add_items(pending.gpus, items, part.fraction)
            if units:
                done = pending.units
                if done is None:
                    done = pending.units = {}
                for name, count in units.items():
                    done[name] = done.get(name, 0.0) + count
                units = None  # the first part's: the window of the sample's start
            pending.end_ts = part.end_ms
            pending.samples += 1
            track.idle_since = idle_since  # the state at the end of what pending now covers
        track.last_end = sample.end_ts
        if track.pending is not None and track.pending.end_ts >= track.pending.due:
            out.append(self._emit(track))

    def _add_whole_sample(
        self,
        track: PodTrack,
        parts: tuple[Part, ...],
        items: list[tuple[GpuReading, PodIntegrals]],
        out: list[PodUsage],
    ) -> None:
        first = parts[0]
        pending = track.pending = PendingUsage(
            first.start_ms, parts[-1].end_ms, first.window_start, first.start_ms, samples=1
        )
        _add_items(pending.gpus, items, 1.0)
        out.append(self._emit(track))

    def _pending(self, uid: PodUid, part: Part) -> PendingUsage:
        flush_due = window_start(part.start_ms, self.flush_ms) + self.flush_ms
        due = min(flush_due, part.window_start + self.window_ms)
        self._due.setdefault(due, []).append(uid)
        return PendingUsage(part.start_ms, part.start_ms, part.window_start, due)

    def _emit(self, track: PodTrack) -> PodUsage:
        pending = track.pending
        assert pending is not None  # callers check; a message needs its pending usage
        track.pending = None
        return PodUsage(
            schema=_SCHEMA,
            uid=track.uid,
            node=track.node,
            ts=pending.ts,
            end_ts=pending.end_ts,
            gpus=tuple(acc.usage() for acc in pending.gpus.values()),
            idle_since=track.idle_since,
            samples=pending.samples,
            cluster=self.cluster,
            units=pending.units or {},
        )


def _add_items(
    gpus: dict[GpuUuid, GpuUsageAcc], items: list[tuple[GpuReading, PodIntegrals]], f: float
) -> None:
    """Fraction `f` of each GPU's integrals into its accumulator, made if new."""
    for gpu, pod in items:
        acc = gpus.get(gpu.uuid)
        if acc is None:
            acc = gpus[gpu.uuid] = GpuUsageAcc(
                uuid=gpu.uuid, model=gpu.model, sharing=gpu.sharing, method=pod.method
            )
        if f == 1.0:
            acc.add_whole(pod)
        else:
            acc.add(pod, f)


def _after(parts: tuple[Part, ...], cut: int) -> tuple[Part, ...]:
    """The pieces of an interval after `cut` (a piece across it cut by fraction)."""
    kept = []
    for part in parts:
        if part.end_ms <= cut:
            continue
        if part.start_ms < cut:
            share = (part.end_ms - cut) / (part.end_ms - part.start_ms)
            kept.append(Part(part.window_start, cut, part.end_ms, part.fraction * share))
        else:
            kept.append(part)
    return tuple(kept)


def _idle_everywhere(items: list[tuple[GpuReading, PodIntegrals]]) -> bool:
    """Idle (known share under the threshold) on every GPU it holds, and it holds one."""
    held = False
    for _gpu, pod in items:
        if pod.allocated_seconds > 0:
            if pod.idle is not True:
                return False
            held = True
    return held
