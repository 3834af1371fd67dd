"""Builders of GPU readings for the split and integral tests (no tests here)."""

from __future__ import annotations

from typing import Any

from schemas.fields import Sharing
from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import GpuProcess, GpuReading

GIB = 1 << 30
IDLE_PCT = 5.0  # the default idle threshold
A, B, C, D = (PodUid(f"pod-{name}") for name in "abcd")
H100 = "NVIDIA H100 80GB HBM3"  # $4.00 per hour in the built-in table


def proc(pod: PodUid | None, sm: float | None = None, mem: int | None = None) -> GpuProcess:
    """A process of `pod` (None: a host process) at `sm` % with `mem` bytes."""
    return GpuProcess(pid=100, mem_bytes=mem, sm_pct=sm, pod_uid=pod, container=None)


def gpu(
    *procs: GpuProcess,
    sharing: Sharing = "time-slicing",
    util: float | None = None,
    uuid: str = "GPU-x",
    **changes: Any,
) -> GpuReading:
    """An 80 GiB H100 running `procs`, every reading but `util` unknown unless changed."""
    fields: dict[str, Any] = {
        "uuid": GpuUuid(uuid),
        "index": 0,
        "model": H100,
        "parent_uuid": None,
        "mig_profile": None,
        "sharing": sharing,
        "util_pct": util,
        "mem_util_pct": None,
        "mem_used_bytes": 0,
        "mem_total_bytes": 80 * GIB,
        "power_w": None,
        "temp_c": None,
        "xid_errors": (),
        "ecc_dbe": None,
        "processes": procs,
    }
    fields.update(changes)
    return GpuReading(**fields)
