"""The story of `gpuwatch replay`: its subject, range, events, and the digest of raw samples.

Pure types and folding; which records concern the subject is `gpuwatch.replay.match`,
reading Kafka `gpuwatch.replay.read`, printing and plotting `gpuwatch.replay.view`. A pod
is named by namespace/name and found by uid in the records (one name can have had several
uids: a recreated StatefulSet pod).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from gpuwatch.timerange import TimeRange
from schemas import (
    Alert,
    Attribution,
    GpuWindow,
    K8sNode,
    K8sPod,
    K8sWorkload,
    NvmlSample,
    PodLifecycle,
)

__all__ = [
    "KIND_ORDER",
    "Collected",
    "Event",
    "GpuSamples",
    "Point",
    "SampleDigest",
    "Scope",
    "StateBand",
    "Story",
    "Subject",
]

SubjectKind = Literal["pod", "gpu", "node"]
EventKind = Literal[
    "node", "workload", "lifecycle", "alert", "attribution", "gpu_window", "samples"
]
KIND_ORDER: dict[EventKind, int] = {
    "node": 0,
    "workload": 1,
    "lifecycle": 2,
    "alert": 3,
    "attribution": 4,
    "gpu_window": 5,
    "samples": 6,
}
"""Order of events at one instant: a transition before the alert and window it explains."""


@dataclass(frozen=True)
class Subject:
    """What the story is about: a pod (`namespace/name`), a GPU uuid or a node name, of one
    cluster (`cluster`) or of any (None) where many clusters feed one pipeline."""

    kind: SubjectKind
    value: str
    cluster: str | None = None

    @classmethod
    def parse(
        cls, pod: str | None, gpu: str | None, node: str | None, cluster: str | None = None
    ) -> Subject:
        """The one subject given; ValueError when none, several, or a pod without namespace."""
        given = [(k, v) for k, v in (("pod", pod), ("gpu", gpu), ("node", node)) if v]
        if len(given) != 1:
            raise ValueError("give one of --pod NS/NAME, --gpu UUID or --node NAME")
        kind, value = given[0]
        if kind == "pod":
            namespace, _, name = value.partition("/")
            if not namespace or not name or "/" in name:
                raise ValueError(f"--pod wants NAMESPACE/NAME, not {value!r}")
        return cls(kind, value, cluster)  # type: ignore[arg-type]

    @property
    def pod(self) -> tuple[str, str]:
        """(namespace, name) of a pod subject."""
        namespace, _, name = self.value.partition("/")
        return namespace, name

    @property
    def needle(self) -> bytes:
        """Bytes every raw record about the subject contains: a cheap filter before decoding."""
        return (self.pod[1] if self.kind == "pod" else self.value).encode()

    def of(self, value: Any) -> bool:
        """Whether a record belongs to the subject's cluster (any, when none is given)."""
        return self.cluster is None or value.cluster == self.cluster

    def names(self, namespace: str | None, name: str | None) -> bool:
        """A pod subject named `namespace/name`."""
        return self.kind == "pod" and (namespace, name) == self.pod

    def __str__(self) -> str:
        where = "" if self.cluster is None else f" of cluster {self.cluster}"
        return f"{self.kind} {self.value}{where}"


@dataclass
class Collected:
    """Decoded records of the range that may concern the subject (filtered loosely)."""

    lifecycle: list[PodLifecycle] = field(default_factory=list)
    attribution: list[Attribution] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    gpu_windows: list[GpuWindow] = field(default_factory=list)
    pods: list[K8sPod] = field(default_factory=list)
    nodes: list[K8sNode] = field(default_factory=list)
    workloads: list[K8sWorkload] = field(default_factory=list)

    def add(self, value: Any) -> None:
        """File a decoded record by its type."""
        for record_type, name in _FILED_AS:
            if isinstance(value, record_type):
                getattr(self, name).append(value)
                return
        raise TypeError(f"not a replay record: {type(value).__name__}")


_FILED_AS: tuple[tuple[type, str], ...] = (
    (PodLifecycle, "lifecycle"),
    (Attribution, "attribution"),
    (Alert, "alerts"),
    (GpuWindow, "gpu_windows"),
    (K8sPod, "pods"),
    (K8sNode, "nodes"),
    (K8sWorkload, "workloads"),
)
"""The list of `Collected` each record type goes to."""


@dataclass
class Scope:
    """What the subject turned out to be: its pods (uid -> ns/name), nodes and GPUs."""

    uids: dict[str, str] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)
    gpus: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)
    """Uids of the pods' controllers (a Job): its Kueue workload's story is theirs too."""

    @property
    def empty(self) -> bool:
        """Nothing in the records named the subject."""
        return not (self.uids or self.nodes or self.gpus)


class GpuSamples(msgspec.Struct, frozen=True, kw_only=True):
    """The raw node samples of one GPU for the subject: count, utilization, VRAM, losses."""

    uuid: str
    node: str
    model: str
    count: int
    first_ts: int
    last_end_ts: int
    util_known: int
    util_mean_pct: float | None
    util_max_pct: float | None
    vram_peak_bytes: int
    mem_total_bytes: int
    seq_gaps: int
    """Samples missing in the node agent's seq over the range (the node's, not the GPU's)."""
    seq_resets: int
    """Times the node's seq went backwards (an agent restart)."""


@dataclass(frozen=True)
class Event:
    """One line of the story."""

    kind: EventKind
    ts: int
    record: PodLifecycle | Attribution | Alert | GpuWindow | K8sNode | K8sWorkload | GpuSamples


@dataclass(frozen=True)
class Point:
    """One sample of one GPU, for the plot."""

    ts: int
    util_pct: float | None
    mem_used_bytes: int


@dataclass(frozen=True)
class StateBand:
    """A pod in one state over `[start_ms, end_ms)`."""

    uid: str
    state: str
    start_ms: int
    end_ms: int


@dataclass
class Story:
    """Everything `gpuwatch replay` shows."""

    subject: Subject
    range: TimeRange
    scope: Scope
    events: list[Event]
    samples: list[GpuSamples]
    series: dict[str, list[Point]]
    bands: list[StateBand]
    notes: list[str] = field(default_factory=list)


@dataclass
class _GpuAcc:
    node: str
    model: str
    count: int = 0
    first_ts: int = 0
    last_end_ts: int = 0
    util_known: int = 0
    util_sum: float = 0.0
    util_max: float | None = None
    vram_peak: int = 0
    mem_total: int = 0


class SampleDigest:
    """Folds the raw node samples of the range into per-GPU summaries (and plot points)."""

    def __init__(
        self, subject: Subject, span: TimeRange, scope: Scope, *, keep_series: bool = False
    ) -> None:
        self.subject, self.span, self.scope = subject, span, scope
        self.keep_series = keep_series
        self.series: dict[str, list[Point]] = {}
        self._gpus: dict[str, _GpuAcc] = {}
        self._last_seq: dict[str, int] = {}
        self._gaps: dict[str, int] = {}
        self._resets: dict[str, int] = {}

    def add(self, sample: NvmlSample) -> None:
        """One node sample; those outside the range or of other GPUs change nothing."""
        if not self.span.holds(sample.ts):
            return
        chosen = self._chosen(sample)
        if chosen or sample.node in self.scope.nodes:
            self._seq(sample)  # the node's losses, while the pod holds a GPU there or not
        for gpu in sample.gpus:
            if gpu.uuid not in chosen:
                continue
            acc = self._gpus.setdefault(gpu.uuid, _GpuAcc(sample.node, gpu.model))
            if acc.count == 0:
                acc.first_ts = sample.ts
            acc.count += 1
            acc.last_end_ts = max(acc.last_end_ts, sample.ts + sample.interval_ms)
            if gpu.util_pct is not None:
                acc.util_known += 1
                acc.util_sum += gpu.util_pct
                acc.util_max = max(acc.util_max or 0.0, gpu.util_pct)
            acc.vram_peak = max(acc.vram_peak, gpu.mem_used_bytes)
            acc.mem_total = max(acc.mem_total, gpu.mem_total_bytes)
            if self.keep_series:
                point = Point(sample.ts, gpu.util_pct, gpu.mem_used_bytes)
                self.series.setdefault(gpu.uuid, []).append(point)

    def _chosen(self, sample: NvmlSample) -> set[str]:
        """The GPUs of this sample that are the subject's (for a pod: allocated to it now)."""
        subject = self.subject
        chosen: set[str]
        if subject.kind != "pod":
            if subject.kind == "node":
                chosen = {g.uuid for g in sample.gpus} if sample.node == subject.value else set()
            else:
                chosen = {g.uuid for g in sample.gpus if subject.value in (g.uuid, g.parent_uuid)}
            for allocation in sample.allocations:  # the holders, whose transitions tell too
                if chosen.intersection(allocation.device_ids):
                    self.scope.uids[allocation.pod_uid] = f"{allocation.namespace}/{allocation.pod}"
            if chosen:
                self.scope.nodes.add(sample.node)
            return chosen
        chosen = set()
        for allocation in sample.allocations:
            if allocation.pod_uid in self.scope.uids or subject.names(
                allocation.namespace, allocation.pod
            ):
                self.scope.uids[allocation.pod_uid] = subject.value
                self.scope.nodes.add(sample.node)
                self.scope.gpus.update(allocation.device_ids)
                chosen.update(allocation.device_ids)
        return chosen

    def _seq(self, sample: NvmlSample) -> None:
        node, last = sample.node, self._last_seq.get(sample.node)
        if last is not None and sample.seq > last + 1:
            self._gaps[node] = self._gaps.get(node, 0) + sample.seq - last - 1
        elif last is not None and sample.seq < last:
            self._resets[node] = self._resets.get(node, 0) + 1
        self._last_seq[node] = sample.seq

    def summaries(self) -> list[GpuSamples]:
        """One summary per GPU seen, by node then uuid."""
        out = []
        for uuid, acc in sorted(self._gpus.items(), key=lambda kv: (kv[1].node, kv[0])):
            out.append(
                GpuSamples(
                    uuid=uuid,
                    node=acc.node,
                    model=acc.model,
                    count=acc.count,
                    first_ts=acc.first_ts,
                    last_end_ts=acc.last_end_ts,
                    util_known=acc.util_known,
                    util_mean_pct=acc.util_sum / acc.util_known if acc.util_known else None,
                    util_max_pct=acc.util_max,
                    vram_peak_bytes=acc.vram_peak,
                    mem_total_bytes=acc.mem_total,
                    seq_gaps=self._gaps.get(acc.node, 0),
                    seq_resets=self._resets.get(acc.node, 0),
                )
            )
        return out
