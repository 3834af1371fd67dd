"""Splits one GPU's sampled interval among the pods that hold or compute on it (docs/DESIGN.md §4).

A pod appears in a split when the sample's allocations list the GPU for it (a holder) or
when one of its processes runs on the GPU without an allocation (a leak: a share, but
`allocated_fraction` 0). Holders share allocation equally (1/k each, time-slicing
replicas); compute share follows docs/DESIGN.md §4:

- exclusive: a GPU with sharing `exclusive` (or a MIG instance, which is hardware-isolated)
  and at most one pod: that pod's share is the device reading, even when its processes are
  not listed or not resolved to it (the design's rule; NVML may list nothing it can map).
- process: otherwise, where any process on the GPU has `sm_pct`: the pod's processes'
  `sm_pct` summed, scaled down by one factor for the whole GPU when all processes together
  exceed the device reading (or 100 % where the device reading is unknown). A process
  without `sm_pct` next to ones that have it counts 0, as the node agent reports a process
  the driver sampled nothing for.
- memory_share: no per-process SM data, device reading known: the reading split by the
  pods' part of the GPU memory all processes use (processes of no pod keep theirs, which
  stays unattributed).
- unknown: no device reading and no per-process data; no share is claimed.

A holder with no process on a shared GPU has share 0 whenever the GPU's use is known at all
(a device reading or per-process data): it demonstrably computes nothing there. Unknown is
never idle: `idle` is None wherever the share or reading it rests on is None. The hot path
(one holder, no other pod) allocates one PodShare and one GpuSplit and nothing else.
"""

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgspec

from schemas.fields import AttributionMethod
from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import Allocation, GpuReading, NvmlSample

__all__ = [
    "AllocationIndex",
    "GpuSets",
    "GpuSplit",
    "PodShare",
    "SampleView",
    "index_allocations",
    "physical_and_instances",
    "sample_view",
    "split_gpu",
]

_PCT = 100.0  # readings are percent; shares are ratios 0..1
# Slots of the per-pod accumulator list: SM % sum, memory bytes sum, 1.0 if any memory known.
_SM, _MEM, _MEM_KNOWN = 0, 1, 2
_WHOLE = frozenset({"exclusive", "mig"})  # one pod on these owns the whole (instance's) reading


class PodShare(msgspec.Struct, frozen=True, gc=False):
    """One pod on one GPU over one interval.

    `share` is the pod's compute share 0..1 (None: unknown); `vram_bytes` the sum of its
    processes' memory (0 without processes, None when every reading is unknown); `idle` the
    pod's own idleness: its share under the idle threshold (None when the share is unknown).
    """

    uid: PodUid
    allocated_fraction: float
    share: float | None
    vram_bytes: int | None
    method: AttributionMethod
    idle: bool | None


class GpuSplit(msgspec.Struct, frozen=True, gc=False):
    """One GPU over one interval: the device reading and each pod's part of it.

    `util` is the device reading 0..1; `unattributed` what no pod explains (util minus the
    known shares, never negative); both None when the reading is unknown. `holders` is k, the
    number of distinct pods the allocations list for the GPU.
    """

    util: float | None
    idle: bool | None
    unattributed: float | None
    holders: int
    pods: tuple[PodShare, ...]


class AllocationIndex(NamedTuple):
    """A sample's allocations by GPU (holders, deduplicated) and pod names by uid."""

    holders: dict[GpuUuid, list[PodUid]]
    names: dict[PodUid, tuple[str, str]]


class GpuSets(NamedTuple):
    """A sample's GPU entries seen two ways, so nothing is counted twice.

    `physical`: entries without `parent_uuid` (whole GPUs and MIG-mode parents): node totals
    such as power and GPU count. `accountable`: entries that are not another entry's parent
    (whole GPUs and MIG instances): the units that are split, windowed and priced. A MIG
    parent is the entry whose uuid some other entry names as `parent_uuid`; it has no
    processes and no allocations of its own, and counting it would double its instances.
    """

    physical: tuple[GpuReading, ...]
    accountable: tuple[GpuReading, ...]


class SampleView(NamedTuple):
    """What the integrals and the alert rules both read of a sample, worked out once."""

    allocations: AllocationIndex
    accountable: tuple[GpuReading, ...]


def sample_view(sample: NvmlSample) -> SampleView:
    """A sample's allocations by GPU and its accountable GPUs."""
    return SampleView(
        index_allocations(sample.allocations), physical_and_instances(sample).accountable
    )


def physical_and_instances(sample: NvmlSample) -> GpuSets:
    """The physical GPUs and the accountable entries (whole GPUs and MIG instances)."""
    gpus = sample.gpus
    parents = {gpu.parent_uuid for gpu in gpus if gpu.parent_uuid is not None}
    if not parents:  # the common case: no MIG, both views are the entries themselves
        return GpuSets(gpus, gpus)
    return GpuSets(
        tuple(gpu for gpu in gpus if gpu.parent_uuid is None),
        tuple(gpu for gpu in gpus if gpu.uuid not in parents),
    )


def index_allocations(allocations: Iterable[Allocation]) -> AllocationIndex:
    """Holders per GPU (a pod listed twice for one GPU, by two containers, counts once)."""
    holders: dict[GpuUuid, list[PodUid]] = {}
    names: dict[PodUid, tuple[str, str]] = {}
    for item in allocations:
        uid = item.pod_uid
        names[uid] = (item.namespace, item.pod)
        for uuid in item.device_ids:
            pods = holders.get(uuid)
            if pods is None:
                holders[uuid] = [uid]
            elif uid not in pods:
                pods.append(uid)
    return AllocationIndex(holders, names)


def split_gpu(gpu: GpuReading, holders: Sequence[PodUid], idle_util_pct: float) -> GpuSplit:
    """Split one GPU's interval among its holders and the pods with processes on it."""
    util_pct = gpu.util_pct
    util = None if util_pct is None else util_pct / _PCT
    device_idle = None if util_pct is None else util_pct < idle_util_pct
    if len(holders) == 1 and util is not None and gpu.sharing in _WHOLE:
        sole = _sole_holder(gpu, holders[0], util, device_idle)
        if sole is not None:  # the hot path: one pod holds a GPU no other pod runs on
            return sole
    held = list(dict.fromkeys(holders)) if len(holders) > 1 else list(holders)
    k = len(held)
    fraction = 1.0 / k if k else 0.0
    per_pod, sm_total, mem_total, has_sm = _group(gpu)
    pods = held + [uid for uid in per_pod if uid not in held] if per_pod else held

    if util is not None and len(pods) <= 1 and gpu.sharing in _WHOLE:
        if not pods:
            return GpuSplit(util, device_idle, util, 0, ())
        uid = pods[0]  # the holder if there is one (k <= 1 here), else a lone leaking pod
        vram = _vram(per_pod.get(uid))
        only = PodShare(uid, fraction, util, vram, "exclusive", device_idle)
        return GpuSplit(util, device_idle, 0.0, k, (only,))

    method, slot, scale = _weights(util, has_sm, sm_total, mem_total)
    known = util is not None or has_sm
    threshold = idle_util_pct / _PCT

    shares: list[PodShare] = []
    attributed = 0.0
    for uid in pods:
        af = fraction if uid in held else 0.0
        acc = per_pod.get(uid)
        share: float | None
        if acc is None:  # a holder with no process: it computes nothing here
            share = 0.0 if known else None
        elif slot is None:  # processes, but nothing to weigh them by
            share = None
        else:
            share = acc[slot] * scale
        vram = 0 if acc is None else _vram(acc)
        if share is None:
            shares.append(PodShare(uid, af, None, vram, "unknown", None))
        else:
            attributed += share
            shares.append(PodShare(uid, af, share, vram, method, share < threshold))
    unattributed = None if util is None else max(0.0, util - attributed)
    return GpuSplit(util, device_idle, unattributed, k, tuple(shares))


def _weights(
    util: float | None, has_sm: bool, sm_total: float, mem_total: int
) -> tuple[AttributionMethod, int | None, float]:
    """How a shared GPU is split: the method, the per-pod slot weighed, its scale to a share."""
    if has_sm:
        cap = 1.0 if util is None else util  # pods never explain more than the device
        used = sm_total / _PCT
        return "process", _SM, (cap / used if used > cap else 1.0) / _PCT
    if util is None:
        return "unknown", None, 0.0
    if mem_total > 0:
        return "memory_share", _MEM, util / mem_total
    # No reading to weigh processes by: theirs are unknown, a holder with none still has 0.
    return "memory_share", None, 0.0


def _sole_holder(gpu: GpuReading, uid: PodUid, util: float, idle: bool | None) -> GpuSplit | None:
    """The exclusive split of a GPU held by `uid` alone; None if another pod runs on it."""
    vram = 0
    known = False
    for proc in gpu.processes:
        owner = proc.pod_uid
        if owner is None:
            continue
        if owner != uid:
            return None
        mem = proc.mem_bytes
        if mem is not None:
            vram += mem
            known = True
    only = PodShare(uid, 1.0, util, vram if known else None, "exclusive", idle)
    return GpuSplit(util, idle, 0.0, 1, (only,))


def _group(gpu: GpuReading) -> tuple[dict[PodUid, list[float]], float, int, bool]:
    """Processes summed per pod, with totals over all processes (those of no pod too)."""
    per_pod: dict[PodUid, list[float]] = {}
    sm_total = 0.0
    mem_total = 0
    has_sm = False
    for proc in gpu.processes:
        sm = proc.sm_pct
        mem = proc.mem_bytes
        if sm is not None:
            has_sm = True
            sm_total += sm
        if mem is not None:
            mem_total += mem
        uid = proc.pod_uid
        if uid is None:
            continue
        acc = per_pod.get(uid)
        if acc is None:
            per_pod[uid] = [sm or 0.0, mem or 0, 0.0 if mem is None else 1.0]
        else:
            acc[_SM] += sm or 0.0
            if mem is not None:
                acc[_MEM] += mem
                acc[_MEM_KNOWN] = 1.0
    return per_pod, sm_total, mem_total, has_sm


def _vram(acc: list[float] | None) -> int | None:
    """A pod's summed process memory; None when no process of it has a reading."""
    return int(acc[_MEM]) if acc is not None and acc[_MEM_KNOWN] else None
