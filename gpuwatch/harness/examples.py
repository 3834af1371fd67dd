"""One valid example message per schema, as JSON-ready dicts: test fixtures and documentation."""

import copy
from typing import Any, Final

__all__ = ["EXAMPLES", "example"]

GPU_0: Final = "GPU-8f3c2a1e-5b7d-4c9a-8e6f-1d2b3c4a5e6f"
GPU_1: Final = "GPU-2b9e7c44-a1d0-4f3b-9c55-7e8d1a2b3c4d"
POD_UID: Final = "6f1c8a2e-4b3d-4e5f-9a7b-1c2d3e4f5a6b"
POD_UID_2: Final = "0d4e9b71-c6a2-48f3-b5d9-2e7a1f3c8b60"
POD_UID_3: Final = "a3c5e7f9-1b2d-4f6a-8c0e-9d7b5a3c1e2f"

# docs/DESIGN.md §3.1, with the elided uuids completed.
NVML_SAMPLE: Final[dict[str, Any]] = {
    "schema": "gpuwatch.nvml.sample/v1",
    "node": "gpu-node-17",
    "ts": 1764412345000,
    "interval_ms": 1000,
    "seq": 81234,
    "gpus": [
        {
            "uuid": GPU_0,
            "index": 0,
            "model": "NVIDIA H100 80GB HBM3",
            "parent_uuid": None,
            "mig_profile": None,
            "sharing": "exclusive",
            "util_pct": 87.0,
            "mem_util_pct": 41.0,
            "mem_used_bytes": 61203283968,
            "mem_total_bytes": 85520809984,
            "power_w": 512.3,
            "temp_c": 61,
            "xid_errors": [],
            "ecc_dbe": 0,
            "processes": [
                {
                    "pid": 4242,
                    "mem_bytes": 60129542144,
                    "sm_pct": 85.0,
                    "pod_uid": POD_UID,
                    "container": "trainer",
                }
            ],
        }
    ],
    "allocations": [
        {
            "pod_uid": POD_UID,
            "namespace": "ml",
            "pod": "train-0",
            "container": "trainer",
            "resource": "nvidia.com/gpu",
            "device_ids": [GPU_0],
        }
    ],
}

# docs/DESIGN.md §3.2, with the elided uid completed.
K8S_POD: Final[dict[str, Any]] = {
    "schema": "gpuwatch.k8s.pod/v1",
    "type": "MODIFIED",
    "ts": 1764412345000,
    "resource_version": "912345",
    "uid": POD_UID,
    "namespace": "ml",
    "name": "train-0",
    "node": "gpu-node-17",
    "phase": "Running",
    "created_at": 1764400000000,
    "scheduled_at": 1764400002000,
    "started_at": 1764400030000,
    "finished_at": None,
    "gpu_request": {"nvidia.com/gpu": 1},
    "conditions": [{"type": "PodScheduled", "status": "True", "reason": None, "message": None}],
    "containers": [
        {"name": "trainer", "state": "running", "reason": None, "exit_code": None, "restarts": 0}
    ],
    "labels": {"team": "vision", "project": "llm-pretrain"},
    "owner": {"kind": "Job", "name": "llm-pretrain"},
    "priority_class": "research",
    "queue": None,
}

K8S_NODE: Final[dict[str, Any]] = {
    "schema": "gpuwatch.k8s.node/v1",
    "type": "MODIFIED",
    "node": "gpu-node-17",
    "ts": 1764412340000,
    "gpu_capacity": {"nvidia.com/gpu": 8},
    "gpu_allocatable": {"nvidia.com/gpu": 8},
    "gpu_product": "NVIDIA-H100-80GB-HBM3",
    "labels": {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "nodepool": "h100-ondemand",
        "nvidia.com/gpu.replicas": "1",
    },
    "ready": True,
    "unschedulable": False,
}

POD_USAGE: Final[dict[str, Any]] = {
    "schema": "gpuwatch.pod.usage/v1",
    "uid": POD_UID,
    "node": "gpu-node-17",
    "ts": 1764412340000,
    "end_ts": 1764412345000,
    "gpus": [
        {
            "uuid": GPU_0,
            "model": "NVIDIA H100 80GB HBM3",
            "sharing": "exclusive",
            "allocated_seconds": 5.0,
            "used_gpu_seconds": 4.35,
            "idle_seconds": 0.0,
            "vram_byte_seconds": 306016419840.0,
            "vram_peak_bytes": 61203283968,
            "energy_joules": 2228.5,
            "share_mean": 0.87,
            "cost_usd": 0.0055,
            "waste_usd": 0.0,
            "method": "exclusive",
        }
    ],
    "idle_since": None,
    "samples": 5,
}

POD_LIFECYCLE: Final[dict[str, Any]] = {
    "schema": "gpuwatch.pod.lifecycle/v1",
    "uid": POD_UID,
    "namespace": "ml",
    "pod": "train-0",
    "node": "gpu-node-17",
    "labels": {"team": "vision", "project": "llm-pretrain"},
    "ts": 1764412645000,
    "from_state": "running",
    "to_state": "stalled",
    "reason": "Idle",
    "queued_ms": 30000,
    "running_ms": 12615000,
    "stalled_ms": 0,
}

ATTRIBUTION: Final[dict[str, Any]] = {
    "schema": "gpuwatch.attribution/v1",
    "uid": POD_UID,
    "namespace": "ml",
    "pod": "train-0",
    "node": "gpu-node-17",
    "labels": {"team": "vision", "project": "llm-pretrain"},
    "owner": {"kind": "Job", "name": "llm-pretrain"},
    "ts": 1764412380000,
    "window_start": 1764412320000,
    "window_end": 1764412380000,
    "state": "running",
    "gpus": [
        {
            "uuid": GPU_0,
            "model": "NVIDIA H100 80GB HBM3",
            "sharing": "exclusive",
            "allocated_gpu_seconds": 60.0,
            "used_gpu_seconds": 51.6,
            "idle_gpu_seconds": 3.0,
            "vram_peak_bytes": 61203283968,
            "cost_usd": 0.0658,
            "method": "exclusive",
        }
    ],
    "allocated_gpu_seconds": 60.0,
    "used_gpu_seconds": 51.6,
    "idle_gpu_seconds": 3.0,
    "vram_byte_seconds": 3672197038080.0,
    "vram_peak_bytes": 61203283968,
    "energy_joules": 26161.2,
    "cost_usd": 0.0658,
    "waste_usd": 0.0033,
    "method": "exclusive",
    "work_units": {"steps": 600.0},
    "cost_per_unit": {"steps": 0.000109667},
}

GPU_WINDOW: Final[dict[str, Any]] = {
    "schema": "gpuwatch.gpu.window/v1",
    "uuid": GPU_1,
    "node": "gpu-node-17",
    "model": "NVIDIA H100 80GB HBM3",
    "parent_uuid": None,
    "ts": 1764412380000,
    "window_start": 1764412320000,
    "window_end": 1764412380000,
    "util_mean_pct": 31.5,
    "busy_seconds": 24.0,
    "idle_seconds": 36.0,
    "allocated_seconds": 60.0,
    "allocated_idle_seconds": 36.0,
    "unallocated_seconds": 0.0,
    "attributed_ratio": 0.92,
    "unattributed_ratio": 0.08,
    "pods": [
        {
            "uid": POD_UID_2,
            "namespace": "research",
            "pod": "notebook-ana-0",
            "allocated_seconds": 30.0,
            "used_gpu_seconds": 17.4,
            "idle_seconds": 12.0,
            "share_mean": 0.58,
            "vram_peak_bytes": 21474836480,
        },
        {
            "uid": POD_UID_3,
            "namespace": "ml",
            "pod": "eval-3",
            "allocated_seconds": 30.0,
            "used_gpu_seconds": 0.0,
            "idle_seconds": 30.0,
            "share_mean": 0.0,
            "vram_peak_bytes": 1073741824,
        },
    ],
}

ALERT: Final[dict[str, Any]] = {
    "schema": "gpuwatch.alert/v1",
    "fingerprint": "b1946ac92492d234",
    "name": "GpuIdleAllocated",
    "status": "firing",
    "severity": "warning",
    "ts": 1764412380000,
    "since": 1764410580000,
    "subject": {"kind": "gpu", "uid": None, "uuid": GPU_1, "node": "gpu-node-17"},
    "labels": {"node": "gpu-node-17", "gpu": GPU_1, "namespace": "research"},
    "summary": "GPU GPU-2b9e7c44 on gpu-node-17 allocated and idle for 30m",
    "value": 1800.0,
}

CAPACITY: Final[dict[str, Any]] = {
    "schema": "gpuwatch.capacity/v1",
    "ts": 1764412380000,
    "model": "NVIDIA H100 80GB HBM3",
    "resource": "nvidia.com/gpu",
    "free": 6,
    "stranded": 6,
    "reclaimable": 1,
    "free_by_node": {"gpu-node-17": 2, "gpu-node-18": 2, "gpu-node-19": 2},
    "reclaimable_gpus": [
        {
            "node": "gpu-node-20",
            "uuid": "GPU-5f0c2a8e-1b2c-4d5e-8f90-0a1b2c3d4e5f",
            "since": 1764412200000,
            "pods": ["ml-team/notebook-7"],
        }
    ],
    "queued": 1,
    "blocked": 1,
    "product": "NVIDIA-H100-80GB-HBM3",
}

# A Kueue Workload of a 4-pod Job waiting for quota (docs/DESIGN.md §3.2).
K8S_WORKLOAD: Final[dict[str, Any]] = {
    "schema": "gpuwatch.k8s.workload/v1",
    "type": "MODIFIED",
    "ts": 1764412345000,
    "resource_version": "912377",
    "uid": "0b1c2d3e-4f50-4617-8829-3a4b5c6d7e8f",
    "namespace": "research",
    "name": "job-llm-pretrain-3f2a1",
    "created_at": 1764411100000,
    "queue": "research",
    "cluster_queue": None,
    "priority": 100,
    "priority_class": "research",
    "active": True,
    "pods": 4,
    "gpu_request": {"nvidia.com/gpu": 32},
    "conditions": [
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "Pending",
            "message": "couldn't assign flavors to pod set main: insufficient unused quota "
            "for nvidia.com/gpu in flavor h100, 24 more needed",
            "at": 1764411101000,
        }
    ],
    "owner": {"kind": "Job", "name": "llm-pretrain"},
    "job_uid": "7e6d5c4b-3a29-4817-8f6e-5d4c3b2a1908",
    "labels": {"team": "vision", "project": "llm-pretrain"},
    "admitted_at": None,
    "finished_at": None,
}

# The same workload's transition when Kueue admitted it after 20 minutes.
WORKLOAD_LIFECYCLE: Final[dict[str, Any]] = {
    "schema": "gpuwatch.workload.lifecycle/v1",
    "uid": "0b1c2d3e-4f50-4617-8829-3a4b5c6d7e8f",
    "namespace": "research",
    "name": "job-llm-pretrain-3f2a1",
    "queue": "research",
    "cluster_queue": "gpu-cq",
    "job_uid": "7e6d5c4b-3a29-4817-8f6e-5d4c3b2a1908",
    "owner": {"kind": "Job", "name": "llm-pretrain"},
    "labels": {"team": "vision", "project": "llm-pretrain"},
    "pods": 4,
    "gpu_request": {"nvidia.com/gpu": 32},
    "ts": 1764412300000,
    "from_state": "queued",
    "to_state": "admitted",
    "reason": None,
    "message": None,
    "queued_ms": 1200000,
    "admitted_ms": 0,
}

# train-0's steps over one scrape interval: 15 s at 10 steps a second.
WORK_UNITS: Final[dict[str, Any]] = {
    "schema": "gpuwatch.work.units/v1",
    "uid": POD_UID,
    "namespace": "ml",
    "pod": "train-0",
    "node": "gpu-node-17",
    "ts": 1764412335000,
    "start": 1764412320000,
    "units": {"steps": 150.0, "samples": 4800.0},
    "resets": [],
    "missing": [],
}

DEADLETTER: Final[dict[str, Any]] = {
    "schema": "gpuwatch.deadletter/v1",
    "source_topic": "gpuwatch.nvml.samples",
    "partition": 3,
    "offset": 1048576,
    "ts": 1764412345120,
    "key": "gpu-node-17",
    "error": "gpuwatch.nvml.sample/v1: $.ts: Expected `int`, got `str`",
    "raw": '{"schema": "gpuwatch.nvml.sample/v1", "node": "gpu-node-17", "ts": "soon"}',
    "raw_encoding": "utf-8",
}

EXAMPLES: Final[dict[str, dict[str, Any]]] = {
    message["schema"]: message
    for message in (
        NVML_SAMPLE,
        K8S_POD,
        K8S_NODE,
        POD_USAGE,
        POD_LIFECYCLE,
        ATTRIBUTION,
        GPU_WINDOW,
        ALERT,
        CAPACITY,
        K8S_WORKLOAD,
        WORKLOAD_LIFECYCLE,
        WORK_UNITS,
        DEADLETTER,
    )
}
"""Schema name -> example message; read-only, use `example()` for a copy to change."""


def example(schema_name: str) -> dict[str, Any]:
    """A deep copy of the example message of a schema; KeyError when there is none."""
    return copy.deepcopy(EXAMPLES[schema_name])
