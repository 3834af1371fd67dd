"""Builders of the records WorkerMetrics reads, a settable clock, and readers of its values
and of its text exposition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.harness.examples import example
from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.capacity import Capacity
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from schemas.pod_usage import PodUsage
from sinks.prometheus.metrics import WorkerMetrics

T0 = 1_764_412_000_000  # event time of the first record, epoch ms
S = 1000


class Clock:
    """A clock the test moves: `clock.now = 310.0`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def worker(clock: Clock | None = None, **kw: Any) -> WorkerMetrics:
    """A WorkerMetrics on a fresh registry."""
    return WorkerMetrics(CollectorRegistry(), clock=clock or Clock(), **kw)


def value(metrics: WorkerMetrics, name: str, **labels: str) -> float | None:
    """The sample's value read back through the registry (None when absent)."""
    return metrics.registry.get_sample_value(name, labels)


def series(metrics: WorkerMetrics, name: str) -> list[dict[str, str]]:
    """The label sets of every sample called `name`."""
    return [dict(s.labels) for m in metrics.registry.collect() for s in m.samples if s.name == name]


POD = {"namespace": "ml", "pod": "train-0", "team": "vision", "node": "n1"}


def lifecycle(uid: str = "u1", to: str = "running", ts: int = T0, **kw: Any) -> PodLifecycle:
    """A transition of pod `uid` (ml/train-0 of team vision on n1 unless told)."""
    raw = example("gpuwatch.pod.lifecycle/v1") | {"uid": uid, "to_state": to, "ts": ts}
    raw |= {"node": "n1", "from_state": None, "queued_ms": 0, "running_ms": 0, "stalled_ms": 0}
    raw |= kw
    return msgspec.convert(raw, PodLifecycle)


def attribution(uid: str = "u1", start: int = T0, **kw: Any) -> Attribution:
    """A one-minute window of pod `uid` from `start`: cost 0.0658, waste 0.0033 unless told."""
    raw = example("gpuwatch.attribution/v1") | {"uid": uid, "node": "n1"}
    raw |= {"window_start": start, "window_end": start + 60 * S, "ts": start + 60 * S}
    raw |= kw
    return msgspec.convert(raw, Attribution)


def usage(uid: str = "u1", ts: int = T0, share: float | None = 0.5, vram: int = 10) -> PodUsage:
    """Five seconds of pod `uid` on the example GPU."""
    raw = example("gpuwatch.pod.usage/v1") | {"uid": uid, "ts": ts, "end_ts": ts + 5 * S}
    raw["gpus"][0] |= {"share_mean": share, "vram_peak_bytes": vram}
    return msgspec.convert(raw, PodUsage)


def window(uuid: str = "GPU-1", start: int = T0, **kw: Any) -> GpuWindow:
    """A one-minute window of GPU `uuid` on n1: 36 s idle, all of it allocated, unless told."""
    raw = example("gpuwatch.gpu.window/v1") | {"uuid": uuid, "node": "n1", "model": "H100"}
    raw |= {"window_start": start, "window_end": start + 60 * S, "ts": start + 60 * S}
    raw |= kw
    return msgspec.convert(raw, GpuWindow)


def gpu(uuid: str, util: float | None = 50.0, pods: tuple[str | None, ...] = (), **kw: Any) -> Any:
    """A GPU reading with one process per entry of `pods` (None: a process of no pod)."""
    raw = example("gpuwatch.nvml.sample/v1")["gpus"][0] | {"uuid": uuid, "util_pct": util}
    raw["model"] = "H100"
    proc = raw["processes"][0]
    raw["processes"] = [proc | {"pid": 100 + i, "pod_uid": p} for i, p in enumerate(pods)]
    return raw | kw


def sample(node: str, ts: int, gpus: list[Any], held: dict[str, list[str]]) -> NvmlSample:
    """A node sample; `held` maps a pod uid to the device ids the kubelet allocated it."""
    raw = example("gpuwatch.nvml.sample/v1") | {"node": node, "ts": ts, "gpus": gpus}
    alloc = raw["allocations"][0]
    raw["allocations"] = [alloc | {"pod_uid": u, "device_ids": d} for u, d in held.items()]
    return msgspec.convert(raw, NvmlSample)


def alert(fingerprint: str = "f1", status: str = "firing", ts: int = T0) -> Alert:
    """The example GpuIdleAllocated alert."""
    raw = example("gpuwatch.alert/v1") | {"fingerprint": fingerprint, "status": status, "ts": ts}
    return msgspec.convert(raw, Alert)


def capacity(ts: int = T0, free: dict[str, int] | None = None, **kw: Any) -> Capacity:
    """The example capacity of H100s (nvidia.com/gpu) as of `ts`, free on the nodes of `free`
    (its three nodes with two each unless told); `free` is their sum."""
    raw = example("gpuwatch.capacity/v1") | {"ts": ts, "model": "H100"}
    if free is not None:
        raw |= {"free_by_node": free, "free": sum(free.values())}
    raw |= kw
    return msgspec.convert(raw, Capacity)


Samples = set[tuple[str, tuple[tuple[str, str], ...], float]]


def parsed(text: bytes) -> Samples:
    """(name, sorted labels, value) of every sample of a text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def populated() -> WorkerMetrics:
    """A worker with a value in every family, and label values that need escaping."""
    metrics = worker()
    metrics.observe_lifecycle(lifecycle(to="queued", ts=T0, pod='we"ird\\pod'))
    metrics.observe_lifecycle(lifecycle("u2", to="running", ts=T0 + 30 * S))
    metrics.observe_usage(usage("u2", ts=T0 + 30 * S))
    metrics.observe_attribution(attribution("u2", start=T0))
    metrics.observe_gpu_window(window("GPU-1", T0))
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1", 3.0, pods=("x",))], {"u2": ["GPU-1"]}))
    metrics.observe_alert(alert())
    metrics.observe_capacity(capacity(free={"n1": 2, 'we"ird\\node': 1}))
    metrics.count_event("gpuwatch.nvml.samples", 3)
    metrics.count_deadletter("gpuwatch.k8s.pods", "schema")
    metrics.set_lag(2.5)
    return metrics


def pods(n: int, to: str = "running") -> Iterator[PodLifecycle]:
    """Transitions of n distinct pods, built once from the example."""
    first = lifecycle(to=to)
    for i in range(n):
        yield PodLifecycle(**{**{f: getattr(first, f) for f in first.__struct_fields__},
                              "uid": f"uid-{i}", "pod": f"job-{i}", "ts": T0 + i})  # fmt: skip
