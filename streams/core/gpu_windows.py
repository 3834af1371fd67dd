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
from streams.core.integrals import GpuIntegrals, SampleIntegrals, scaled, share_mean
from streams.core.windows import closable, is_late, split_interval

__all__ = ["GpuWindowAcc", "GpuWindows", "PodWindowAcc"]

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
            if acc is None:
                acc = pods[p.uid] = PodWindowAcc(p.uid)
            if not acc.pod:
                name = names.get(p.uid)
                if name is not None:
                    acc.namespace, acc.pod = name
            acc.allocated_seconds += p.allocated_seconds
            acc.used_gpu_seconds += p.used_gpu_seconds
            acc.share_seconds += p.share_seconds
            acc.idle_seconds += p.idle_seconds
            acc.vram_peak_bytes = max(acc.vram_peak_bytes, p.vram_peak_bytes)

    def close(self, cluster: str = DEFAULT_CLUSTER) -> GpuWindow:
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
        )


class GpuWindows:
    """The open GPU windows of a partition, closed by stream time.

    `store` may be any mapping (a Faust Table in the worker): buckets are mutated in place, so
    a changelog-backed store must be written back by the caller where it wants durability.
    `closed_through` is the stream time of the last `close`; a window it closed is never
    reopened: data for it is late (`add` says so; the caller counts `late_events_total`).
    `cluster` is the cluster of the node the windows are of (their records carry it).
    """

    def __init__(
        self,
        window_ms: int,
        lateness_ms: int,
        store: MutableMapping[tuple[GpuUuid, int], GpuWindowAcc] | None = None,
        closed_through: int | None = None,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        self.window_ms = window_ms
        self.cluster = cluster
        self.lateness_ms = lateness_ms
        self.store: MutableMapping[tuple[GpuUuid, int], GpuWindowAcc] = (
            {} if store is None else store
        )
        self.closed_through = closed_through
        self._open: dict[int, list[GpuUuid]] = {}
        for uuid, start in self.store:
            self._open.setdefault(start, []).append(uuid)

    def add(self, sample: SampleIntegrals) -> bool:
        """Bucket a node sample's integrals; True when some of it was late (and left out)."""
        parts = split_interval(sample.ts, sample.end_ts - sample.ts, self.window_ms)
        late = False
        store, names = self.store, sample.names
        for part in parts:
            start = part.window_start
            if is_late(start, self.closed_through, self.window_ms, self.lateness_ms):
                late = True
                continue
            whole = part.fraction == 1.0
            for gpu, integrals in sample.gpus:
                piece = integrals if whole else scaled(integrals, part.fraction)
                acc = store.get((gpu.uuid, start))
                if acc is None:
                    acc = self._bucket(sample.node, gpu, start)
                acc.add(piece, names)
        return late

    def close(self, stream_time: int) -> list[GpuWindow]:
        """Close every window stream time has passed (end + lateness); oldest first."""
        if self.closed_through is None or stream_time > self.closed_through:
            self.closed_through = stream_time
        out = []
        for start in closable(self._open, stream_time, self.window_ms, self.lateness_ms):
            for uuid in sorted(self._open.pop(start)):
                out.append(self.store.pop((uuid, start)).close(self.cluster))
        return out

    def _bucket(self, node: NodeName, gpu: GpuReading, start: int) -> GpuWindowAcc:
        """A new bucket of a GPU's window."""
        acc = GpuWindowAcc(
            gpu.uuid, node, gpu.model, gpu.parent_uuid, start, start + self.window_ms
        )
        self.store[(gpu.uuid, start)] = acc
        self._open.setdefault(start, []).append(gpu.uuid)
        return acc
