"""Builders of node samples for the GPU and node alert tests (no tests here)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from schemas.alert import Alert
from schemas.fields import Sharing
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import Allocation, GpuProcess, GpuReading, NvmlSample
from schemas.settings import RuleSettings
from streams.core.node.gpu_alerts import NodeAlertState, on_sample

S = 1000
T0 = 1_764_400_000_000
NODE = NodeName("gpu-node-17")
MODEL = "NVIDIA H100 80GB HBM3"
GIB = 1 << 30
RULES = RuleSettings()  # idle under 5 %
GPU_A = GpuUuid("GPU-aaaaaaaa-0000-4000-8000-000000000000")
GPU_B = GpuUuid("GPU-bbbbbbbb-0000-4000-8000-000000000000")
MIG_1 = GpuUuid("MIG-11111111-0000-4000-8000-000000000000")
POD_P = PodUid("pppppppp-0000-4000-8000-000000000000")
POD_Q = PodUid("qqqqqqqq-0000-4000-8000-000000000000")
POD_R = PodUid("rrrrrrrr-0000-4000-8000-000000000000")
NAMES = {POD_P: ("ml", "train-0"), POD_Q: ("ml", "eval-1"), POD_R: ("research", "nb-2")}


def proc(
    pid: int, pod: PodUid | None, *, mem: int | None = GIB, sm: float | None = None
) -> GpuProcess:
    """A process on a GPU, of `pod` (None: a host process)."""
    return GpuProcess(pid=pid, mem_bytes=mem, sm_pct=sm, pod_uid=pod, container=None)


def gpu(
    uuid: GpuUuid,
    util: float | None,
    *procs: GpuProcess,
    sharing: Sharing = "exclusive",
    **changes: Any,
) -> GpuReading:
    """An H100 reading with `util` % utilization (None: unknown)."""
    fields: dict[str, Any] = {
        "uuid": uuid,
        "index": 0 if uuid == GPU_A else 1,
        "model": MODEL,
        "parent_uuid": None,
        "mig_profile": None,
        "sharing": sharing,
        "util_pct": util,
        "mem_util_pct": None,
        "mem_used_bytes": 2 * GIB * len(procs),
        "mem_total_bytes": 80 * GIB,
        "power_w": 100.0,
        "temp_c": 40,
        "xid_errors": (),
        "ecc_dbe": 0,
        "processes": procs,
    }
    fields.update(changes)
    return GpuReading(**fields)


def alloc(uid: PodUid, *devices: GpuUuid) -> Allocation:
    """The kubelet's allocation of `devices` to a pod named as in NAMES."""
    namespace, name = NAMES[uid]
    return Allocation(
        pod_uid=uid,
        namespace=namespace,
        pod=name,
        container="main",
        resource="nvidia.com/gpu",
        device_ids=devices,
    )


def sample(
    ts: int,
    gpus: Sequence[GpuReading],
    allocations: Sequence[Allocation] = (),
    *,
    seq: int | None = None,
    interval_ms: int = S,
) -> NvmlSample:
    """A node sample of [ts, ts + interval_ms); `seq` defaults to the second since T0."""
    return NvmlSample(
        schema="gpuwatch.nvml.sample/v1",
        node=NODE,
        ts=ts,
        interval_ms=interval_ms,
        seq=(ts - T0) // S if seq is None else seq,
        gpus=tuple(gpus),
        allocations=tuple(allocations),
    )


def run(
    state: NodeAlertState | None, samples: Iterable[NvmlSample], **params: int
) -> tuple[NodeAlertState, list[Alert], int]:
    """Apply samples in order: the last state, all alerts, all missing seqs."""
    out: list[Alert] = []
    lost = 0
    for item in samples:
        state, alerts, missing = on_sample(state, item, RULES, **params)
        out += alerts
        lost += missing
    assert state is not None
    return state, out, lost


def brief(alerts: Iterable[Alert]) -> list[tuple[str, str, int, int, float | None]]:
    """(name, status, ts - T0, since - T0, value) of each alert, times in ms from T0."""
    return [(a.name, a.status, a.ts - T0, a.since - T0, a.value) for a in alerts]
