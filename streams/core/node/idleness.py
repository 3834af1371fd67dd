"""Whether a GPU is idle over a sampled interval: one rule for the idle alert and the live view.

A GPU that pods hold is idle when every one of them is idle by its own compute share
(`split.split_gpu`, docs/DESIGN.md §4): on a time-sliced GPU a holder doing nothing while a
process of no pod, or a pod without an allocation, keeps the device busy is idle, and a
holder whose share is unknown makes the GPU's idleness unknown, however low the device
reading. A GPU no pod holds is idle by its device reading. Unknown is never idle: None.

`GpuIdleAllocated` (`gpu_alerts`) and the `idle_since` of `gpuwatch:gpu:{uuid}` (the Redis
sink's `LiveGpus`) both ask this module, so the live view's idle run and the alert's are
the same run.
"""

from collections.abc import Sequence

from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import GpuReading, NvmlSample
from streams.core.split import index_allocations, split_gpu

__all__ = ["gpu_idle", "idle_by_gpu"]


def gpu_idle(gpu: GpuReading, holders: Sequence[PodUid], idle_util_pct: float) -> bool | None:
    """Whether `gpu` is idle over the sample, `holders` being the pods allocated on it."""
    util = gpu.util_pct
    if not holders:
        return None if util is None else util < idle_util_pct
    if len(holders) == 1 and util is not None and gpu.sharing == "exclusive":
        holder = holders[0]
        for proc in gpu.processes:
            owner = proc.pod_uid
            if owner is not None and owner != holder:
                break  # another pod runs on it: the whole split
        else:
            return util < idle_util_pct  # split_gpu's sole holder, without building the split
    idle = [
        pod.idle for pod in split_gpu(gpu, holders, idle_util_pct).pods if pod.allocated_fraction
    ]
    return False if False in idle else None if None in idle else True


def idle_by_gpu(sample: NvmlSample, idle_util_pct: float) -> dict[GpuUuid, bool | None]:
    """`gpu_idle` of every GPU entry of a node sample, its holders from the allocations."""
    holders = index_allocations(sample.allocations).holders if sample.allocations else {}
    return {
        gpu.uuid: gpu_idle(gpu, holders.get(gpu.uuid, ()), idle_util_pct) for gpu in sample.gpus
    }
