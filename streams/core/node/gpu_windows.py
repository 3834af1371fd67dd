"""Per-GPU idle and waste windows: integrals bucketed by (GPU uuid, window start).

Computed where node samples land (partitioned by node), so no repartition is needed. Each
bucket is a `GpuWindowAcc`, a msgspec Struct that encodes to plain JSON and can live in a
Faust Table keyed by `(uuid, window_start)`; `GpuWindows` is the bucket map plus the index
that finds the buckets stream time closes.

Pods in `pods[]` are named from the sample's allocations. A pod seen only through a leaking
process holds no allocation, so the node side cannot name it: its `namespace` and `pod` are
"" (its uid still identifies it; `allocated_seconds` 0 marks it as a leak).
"""

from collections.abc import MutableMapping
from typing import Final

import msgspec

from schemas.fields import DEFAULT_CLUSTER
from schemas.gpu_window import GpuWindow, PodWindowShare
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import GpuReading
from streams.core.integrals import GpuIntegrals, SampleIntegrals, share_mean
from streams.core.windows import closable, is_late, split_interval

__all__ = ["GpuWindowAcc", "GpuWindows", "KeptWindow", "PodWindowAcc"]

_SCHEMA: Final = "gpuwatch.gpu.window/v1"
_PCT = 100.0


class PodWindowAcc(msgspec.Struct, gc=False):
    """One pod's integrals on one GPU within one window."""

    uid: PodUid
    namespace: str = ""
    pod: str = ""
    allocated_seconds: float = 0.0
    used_gpu_seconds: float = 0.0
    share_seconds: float = 0.0
    idle_seconds: float = 0.0
    vram_peak_bytes: int = 0

    def share(self) -> PodWindowShare:
        """The pod's line in the closed window."""
        return PodWindowShare(
            uid=self.uid,
            namespace=self.namespace,
            pod=self.pod,
            allocated_seconds=self.allocated_seconds,
            used_gpu_seconds=self.used_gpu_seconds,
            idle_seconds=self.idle_seconds,
            share_mean=share_mean(self.used_gpu_seconds, self.share_seconds),
            vram_peak_bytes=self.vram_peak_bytes,
        )


class GpuWindowAcc(msgspec.Struct, gc=False):
    """One GPU's integrals within `[window_start, window_end)`; plain, serialisable data."""

    uuid: GpuUuid
    node: NodeName
    model: str
    parent_uuid: GpuUuid | None
    window_start: int
    window_end: int
    seconds: float = 0.0
    busy_seconds: float = 0.0
    idle_seconds: float = 0.0
    allocated_seconds: float = 0.0
    allocated_idle_seconds: float = 0.0
    unallocated_seconds: float = 0.0
    util_seconds: float = 0.0
    util_known_seconds: float = 0.0
    attributed_seconds: float = 0.0
    unattributed_seconds: float = 0.0
    pods: dict[PodUid, PodWindowAcc] = msgspec.field(default_factory=dict)

    def add(self, gpu: GpuIntegrals, names: dict[PodUid, tuple[str, str]]) -> None:
        """Add the integrals of an interval (or the piece of one) inside this window."""
        self.seconds += gpu.seconds
        self.busy_seconds += gpu.busy_seconds
        self.idle_seconds += gpu.idle_seconds
        self.allocated_seconds += gpu.allocated_seconds
        self.allocated_idle_seconds += gpu.allocated_idle_seconds
        self.unallocated_seconds += gpu.unallocated_seconds
        self.util_seconds += gpu.util_seconds
        self.util_known_seconds += gpu.util_known_seconds
        self.attributed_seconds += gpu.attributed_seconds
        self.unattributed_seconds += gpu.unattributed_seconds
        pods = self.pods
        for p in gpu.pods:
            acc = pods.get(p.uid)
            if acc is None or not acc.pod:
                acc = self._named(p.uid, names)
            acc.allocated_seconds += p.allocated_seconds
            acc.used_gpu_seconds += p.used_gpu_seconds
            acc.share_seconds += p.share_seconds
            acc.idle_seconds += p.idle_seconds
            acc.vram_peak_bytes = max(acc.vram_peak_bytes, p.vram_peak_bytes)

    def add_part(self, gpu: GpuIntegrals, f: float, names: dict[PodUid, tuple[str, str]]) -> None:
        """`add(scaled(gpu, f), names)` without making the scaled integrals: the same
        products (`scaled`'s), added in the same order, so the same sums."""
        self.seconds += gpu.seconds * f
        self.busy_seconds += gpu.busy_seconds * f
        self.idle_seconds += gpu.idle_seconds * f
        self.allocated_seconds += gpu.allocated_seconds * f
        self.allocated_idle_seconds += gpu.allocated_idle_seconds * f
        self.unallocated_seconds += gpu.unallocated_seconds * f
        self.util_seconds += gpu.util_seconds * f
        self.util_known_seconds += gpu.util_known_seconds * f
        self.attributed_seconds += gpu.attributed_seconds * f
        self.unattributed_seconds += gpu.unattributed_seconds * f
        pods = self.pods
        for p in gpu.pods:
            acc = pods.get(p.uid)
            if acc is None or not acc.pod:
                acc = self._named(p.uid, names)
            acc.allocated_seconds += p.allocated_seconds * f
            acc.used_gpu_seconds += p.used_gpu_seconds * f
            acc.share_seconds += p.share_seconds * f
            acc.idle_seconds += p.idle_seconds * f
            acc.vram_peak_bytes = max(acc.vram_peak_bytes, p.vram_peak_bytes)

    def _named(self, uid: PodUid, names: dict[PodUid, tuple[str, str]]) -> PodWindowAcc:
        """The pod's bucket, made if new, named from the sample's allocations if unnamed."""
        acc = self.pods.get(uid)
        if acc is None:
            acc = self.pods[uid] = PodWindowAcc(uid)
        if not acc.pod:
            name = names.get(uid)
            if name is not None:
                acc.namespace, acc.pod = name
        return acc

    def close(self, cluster: str = DEFAULT_CLUSTER, revision: int = 0) -> GpuWindow:
        """The `gpu.window` record of this window, of a GPU of `cluster`; pods in uid order,
        so replays match."""
        known = self.util_known_seconds
        explained = self.attributed_seconds + self.unattributed_seconds
        attributed = min(1.0, self.attributed_seconds / explained) if explained > 0 else None
        return GpuWindow(
            schema=_SCHEMA,
            uuid=self.uuid,
            node=self.node,
            model=self.model,
            parent_uuid=self.parent_uuid,
            ts=self.window_end,
            window_start=self.window_start,
            window_end=self.window_end,
            util_mean_pct=min(_PCT, _PCT * self.util_seconds / known) if known > 0 else None,
            busy_seconds=self.busy_seconds,
            idle_seconds=self.idle_seconds,
            allocated_seconds=self.allocated_seconds,
            allocated_idle_seconds=self.allocated_idle_seconds,
            unallocated_seconds=self.unallocated_seconds,
            attributed_ratio=attributed,
            unattributed_ratio=None if attributed is None else 1.0 - attributed,
            pods=tuple(self.pods[uid].share() for uid in sorted(self.pods)),
            cluster=cluster,
            revision=revision,
        )


class KeptWindow(msgspec.Struct, gc=False, omit_defaults=True):
    """A closed window kept for revision: its buckets and how many copies went out."""

    acc: GpuWindowAcc
    copies: int = 0
    """Copies emitted so far: the next one's `revision`."""
    revised: bool = False
    """Data came for it since its last copy."""


class GpuWindows:
    """The open GPU windows of a node, closed by stream time, and the closed ones still
    revisable.

    `store` may be any mapping (a Faust Table in the worker): buckets are mutated in place, so
    a changelog-backed store must be written back by the caller where it wants durability.
    `closed_through` is the stream time of the last `close`; a window it closed is never
    reopened. Data for it that comes within `horizon_ms` (of `closed_through`) of the
    window's end revises it: the window is kept in `revisable`, the data added, and the
    whole record emitted again with the next `revision` (`revisions`). Later data is late
    (`add` says so; the caller counts `late_events_total`). `cluster` is the cluster of the
    node the windows are of (their records carry it).

    What is kept for revision: a node's samples come in order (one agent, one key), and a
    sample starting before the node's last one ended is a redelivery, so data can only
    come late for windows after the node's newest sample (`covered` at `close`). A window
    the node's samples covered to its end when it closed is complete and is not kept; one
    they did not (the node silent, its agent buffering) is. So a fleet whose nodes report
    on time keeps nothing, and a node that went quiet keeps the one window it was in; the
    windows of its silence have no bucket until its data comes.
    """

    def __init__(
        self,
        window_ms: int,
        lateness_ms: int,
        store: MutableMapping[tuple[GpuUuid, int], GpuWindowAcc] | None = None,
        closed_through: int | None = None,
        cluster: str = DEFAULT_CLUSTER,
        *,
        horizon_ms: int = 0,
        revisable: MutableMapping[tuple[GpuUuid, int], KeptWindow] | None = None,
    ) -> None:
        self.window_ms = window_ms
        self.cluster = cluster
        self.lateness_ms = lateness_ms
        self.horizon_ms = horizon_ms
        self.store: MutableMapping[tuple[GpuUuid, int], GpuWindowAcc] = (
            {} if store is None else store
        )
        self.revisable: MutableMapping[tuple[GpuUuid, int], KeptWindow] = (
            {} if revisable is None else revisable
        )
        """Closed windows data may still come for, by (uuid, start)."""
        self.closed_through = closed_through
        self._open: dict[int, list[GpuUuid]] = {}
        for uuid, start in self.store:
            self._open.setdefault(start, []).append(uuid)

    def add(self, sample: SampleIntegrals) -> bool:
        """Bucket a node sample's integrals; True when some of it was late (and left out).

        A part for a closed window within the horizon goes into the kept window, to be
        emitted again by `revisions`."""
        parts = split_interval(sample.ts, sample.end_ts - sample.ts, self.window_ms)
        late = False
        store, names = self.store, sample.names
        for part in parts:
            start = part.window_start
            whole = part.fraction == 1.0
            if is_late(start, self.closed_through, self.window_ms, self.lateness_ms):
                if not self._revisable(start):
                    late = True
                    continue
                for gpu, integrals in sample.gpus:
                    kept = self.revisable.get((gpu.uuid, start))
                    if kept is None:
                        fresh = KeptWindow(self._acc(sample.node, gpu, start))
                        kept = self.revisable[(gpu.uuid, start)] = fresh
                    if whole:
                        kept.acc.add(integrals, names)
                    else:
                        kept.acc.add_part(integrals, part.fraction, names)
                    kept.revised = True
                continue
            for gpu, integrals in sample.gpus:
                acc = store.get((gpu.uuid, start))
                if acc is None:
                    acc = self._bucket(sample.node, gpu, start)
                if whole:
                    acc.add(integrals, names)
                else:
                    acc.add_part(integrals, part.fraction, names)
        return late

    def revisions(self, until: int | None = None) -> list[GpuWindow]:
        """The kept windows data came for since their last copy, emitted again; with `until`
        (the end of the node's newest sample) only those ending by then, which are complete
        and forgotten: the node's data has passed them, nothing more can come for them."""
        due = [
            key
            for key, kept in self.revisable.items()
            if kept.revised and (until is None or kept.acc.window_end <= until)
        ]
        out = []
        for key in sorted(due, key=lambda k: (k[1], k[0])):
            kept = self.revisable[key]
            out.append(kept.acc.close(self.cluster, kept.copies))
            kept.copies += 1
            kept.revised = False
            if until is not None:
                del self.revisable[key]
        return out

    def close(self, stream_time: int, covered: int | None = None) -> list[GpuWindow]:
        """Close every window stream time has passed (end + lateness), oldest first; then
        the kept windows revised since their last copy, and forget those past the horizon.

        `covered` is the end of the node's newest sample: a window it does not reach is
        kept for revision (the class's doc)."""
        if self.closed_through is None or stream_time > self.closed_through:
            self.closed_through = stream_time
        out = []
        keep = self.horizon_ms > 0
        for start in closable(self._open, stream_time, self.window_ms, self.lateness_ms):
            for uuid in sorted(self._open.pop(start)):
                acc = self.store.pop((uuid, start))
                out.append(acc.close(self.cluster))
                if keep and (covered is None or covered < acc.window_end):
                    self.revisable[(uuid, start)] = KeptWindow(acc, copies=1)
        if self.revisable:
            out.extend(self.revisions())
            # Past the horizon, or complete (the node's data has passed its end).
            for key, kept in list(self.revisable.items()):
                end = kept.acc.window_end
                if not self._revisable(key[1]) or (covered is not None and end <= covered):
                    del self.revisable[key]
        return out

    def _revisable(self, start: int) -> bool:
        """Whether data for the closed window starting at `start` still revises it."""
        return (
            self.horizon_ms > 0
            and self.closed_through is not None
            and start + self.window_ms > self.closed_through - self.horizon_ms
        )

    def _acc(self, node: NodeName, gpu: GpuReading, start: int) -> GpuWindowAcc:
        return GpuWindowAcc(
            gpu.uuid, node, gpu.model, gpu.parent_uuid, start, start + self.window_ms
        )

    def _bucket(self, node: NodeName, gpu: GpuReading, start: int) -> GpuWindowAcc:
        """A new bucket of a GPU's window."""
        acc = self.store[(gpu.uuid, start)] = self._acc(node, gpu, start)
        self._open.setdefault(start, []).append(gpu.uuid)
        return acc
