"""Readings of the node agent's tests: one whole H100, changed field by field."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from producers.base.ports import DeviceReading, ProcessReading
from schemas.ids import GpuUuid

GIB = 1 << 30
GPU_X = GpuUuid("GPU-8f3c6a1e-58d2-8a34-1b2c-9d0e7f6a5b4c")


def device(uuid: GpuUuid = GPU_X, index: int = 0, *pids: int, **changes: Any) -> DeviceReading:
    """A busy whole H100 with a process of `GIB * pid` bytes per pid, then `changes`."""
    base = DeviceReading(
        uuid=uuid,
        index=index,
        model="NVIDIA H100 80GB HBM3",
        parent_uuid=None,
        mig_profile=None,
        mig_enabled=False,
        util_pct=87.0,
        mem_util_pct=41.0,
        mem_used_bytes=60 * GIB,
        mem_total_bytes=80 * GIB,
        power_w=512.3,
        temp_c=61,
        xid_errors=(),
        ecc_dbe=0,
        processes=tuple(ProcessReading(pid, GIB * pid, 10.0) for pid in pids),
    )
    return replace(base, **changes)
