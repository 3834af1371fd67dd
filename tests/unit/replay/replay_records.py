"""Hand-made records of one incident for the replay unit tests, built from the schema examples.

ml/train-0 (uid TRAIN) queues, runs from T0 + 30 s, stalls at T0 + 300 s and completes at
T0 + 900 s on GPU_0 of gpu-node-17; ml/other-0 (uid OTHER) runs beside it on GPU_1. The
story's range is [T0, T0 + 20 min].
"""

from __future__ import annotations

from typing import Any

import msgspec

from gpuwatch.harness.examples import GPU_0, GPU_1, POD_UID, POD_UID_2, example
from gpuwatch.replay.story import Collected
from gpuwatch.timerange import TimeRange
from schemas import Alert, Attribution, GpuWindow, K8sNode, K8sPod, NvmlSample, PodLifecycle

T0 = 1_764_412_800_000  # 2025-11-29 10:40:00 UTC
S = 1000
MIN = 60 * S
GIB = 1 << 30
TRAIN = POD_UID
OTHER = POD_UID_2
NODE = "gpu-node-17"
SPAN = TimeRange(T0, T0 + 20 * MIN)


def lifecycle(
    uid: str, ts: int, from_state: str | None, to_state: str, **more: Any
) -> PodLifecycle:
    data = example("gpuwatch.pod.lifecycle/v1")
    name = "train-0" if uid == TRAIN else "other-0"
    data.update(uid=uid, pod=name, ts=ts, from_state=from_state, to_state=to_state, reason=None)
    data.update(more)
    return msgspec.convert(data, PodLifecycle)


def attribution(uid: str, start: int, *, used: float, idle: float, cost: float, waste: float,
                gpu: str = GPU_0, state: str = "running",
                revision: int = 0) -> Attribution:  # fmt: skip
    data = example("gpuwatch.attribution/v1")
    data.update(revision=revision)
    name = "train-0" if uid == TRAIN else "other-0"
    data.update(uid=uid, pod=name, window_start=start, window_end=start + MIN, ts=start + MIN)
    data.update(used_gpu_seconds=used, idle_gpu_seconds=idle, cost_usd=cost, waste_usd=waste)
    data.update(state=state, allocated_gpu_seconds=60.0)
    data["gpus"][0].update(uuid=gpu, used_gpu_seconds=used, idle_gpu_seconds=idle, cost_usd=cost)
    return msgspec.convert(data, Attribution)


def alert(name: str, status: str, ts: int, *, uid: str | None = None, gpu: str | None = None,
          labels: dict[str, str] | None = None) -> Alert:  # fmt: skip
    data = example("gpuwatch.alert/v1")
    kind = "pod" if uid else "gpu"
    data.update(
        name=name, status=status, ts=ts, since=ts - 60 * S, fingerprint=f"{name}-{uid or gpu}"
    )
    data["subject"] = {"kind": kind, "uid": uid, "uuid": gpu, "node": NODE}
    data["labels"] = labels or {}
    data["summary"] = f"{name} {status}"
    return msgspec.convert(data, Alert)


def gpu_window(uuid: str, start: int, pods: list[str], util: float, revision: int = 0) -> GpuWindow:
    data = example("gpuwatch.gpu.window/v1")
    data.update(revision=revision)
    data.update(uuid=uuid, window_start=start, window_end=start + MIN, ts=start + MIN)
    data.update(util_mean_pct=util)
    share = data["pods"][0]
    data["pods"] = [
        {**share, "uid": uid, "namespace": "ml", "pod": "train-0" if uid == TRAIN else "other-0"}
        for uid in pods
    ]
    return msgspec.convert(data, GpuWindow)


def pod_event(uid: str, ts: int, phase: str = "Running") -> K8sPod:
    data = example("gpuwatch.k8s.pod/v1")
    data.update(uid=uid, ts=ts, phase=phase, name="train-0" if uid == TRAIN else "other-0")
    return msgspec.convert(data, K8sPod)


def node_event(ts: int, ready: bool) -> K8sNode:
    data = example("gpuwatch.k8s.node/v1")
    data.update(ts=ts, ready=ready)
    return msgspec.convert(data, K8sNode)


def sample(seq: int, ts: int, *, util0: float | None, mem0_gib: float, holder: str | None = TRAIN,
           util1: float | None = 40.0) -> NvmlSample:  # fmt: skip
    """GPU_0 held by `holder` (None: nobody), GPU_1 by OTHER."""
    data = example("gpuwatch.nvml.sample/v1")
    gpu0 = data["gpus"][0]
    gpu0.update(util_pct=util0, mem_used_bytes=int(mem0_gib * GIB))
    gpu1 = {**gpu0, "uuid": GPU_1, "index": 1, "util_pct": util1, "mem_used_bytes": 5 * GIB}
    data.update(seq=seq, ts=ts, gpus=[gpu0, gpu1])
    allocation = data["allocations"][0]
    allocations = [{**allocation, "pod_uid": OTHER, "pod": "other-0", "device_ids": [GPU_1]}]
    if holder is not None:
        name = "train-0" if holder == TRAIN else "other-0"
        allocations.append({**allocation, "pod_uid": holder, "pod": name, "device_ids": [GPU_0]})
    data["allocations"] = allocations
    return msgspec.convert(data, NvmlSample)


def incident() -> Collected:
    """Every record of the incident, with a duplicate and records outside the range."""
    found = Collected()
    for record in [
        lifecycle(TRAIN, T0 - MIN, None, "queued", reason="Unschedulable"),  # before the range
        lifecycle(TRAIN, T0 + 30 * S, "queued", "running", queued_ms=90_000),
        lifecycle(TRAIN, T0 + 5 * MIN, "running", "stalled", reason="Idle", running_ms=270_000),
        lifecycle(TRAIN, T0 + 5 * MIN, "running", "stalled", reason="Idle", running_ms=270_000),
        lifecycle(TRAIN, T0 + 15 * MIN, "stalled", "finished", reason="Completed"),
        lifecycle(OTHER, T0 + 2 * MIN, None, "running", node=NODE),
        attribution(TRAIN, T0, used=30.0, idle=20.0, cost=0.0658, waste=0.0219),
        attribution(TRAIN, T0 + MIN, used=51.6, idle=3.0, cost=0.0658, waste=0.0033),
        attribution(TRAIN, T0 + MIN, used=51.6, idle=3.0, cost=0.0658, waste=0.0033),
        attribution(TRAIN, T0 + 60 * MIN, used=1.0, idle=59.0, cost=0.0658, waste=0.0647),
        attribution(OTHER, T0 + MIN, used=24.0, idle=0.0, cost=0.0658, waste=0.0, gpu=GPU_1),
        alert("GpuIdleAllocated", "firing", T0 + 4 * MIN, gpu=GPU_0,
              labels={"node": NODE, "gpu": GPU_0, "namespace": "ml", "pod": "train-0"}),
        alert("PodStalled", "firing", T0 + 5 * MIN, uid=TRAIN),
        alert("PodStalled", "resolved", T0 + 15 * MIN, uid=TRAIN),
        alert("PodStalled", "firing", T0 + 6 * MIN, uid=OTHER),
        alert("GpuIdleAllocated", "firing", T0 + 7 * MIN, gpu=GPU_1,
              labels={"node": NODE, "gpu": GPU_1, "pods": "ml/other-0"}),
        gpu_window(GPU_0, T0 + MIN, [TRAIN], 86.0),
        gpu_window(GPU_1, T0 + MIN, [OTHER], 40.0),
        pod_event(TRAIN, T0 + 30 * S),
        node_event(T0 + 10 * MIN, ready=False),
    ]:  # fmt: skip
        found.add(record)
    return found
