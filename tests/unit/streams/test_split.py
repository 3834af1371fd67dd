"""split_gpu: compute shares, allocation, idleness and leaks of one GPU interval.

The rules: docs/DESIGN.md §4.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from readings import GIB, IDLE_PCT, A, B, C, D, gpu, proc

from gpuwatch.harness.examples import GPU_0, POD_UID, example
from schemas.codec import Codec
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import Allocation, GpuReading, NvmlSample
from streams.core.split import GpuSplit, index_allocations, physical_and_instances, split_gpu


def by_uid(split: GpuSplit) -> dict[PodUid, tuple[float, float | None, str, bool | None]]:
    return {p.uid: (p.allocated_fraction, p.share, p.method, p.idle) for p in split.pods}


def test_design_example_exclusive_h100_decoded_through_the_codec() -> None:
    raw = msgspec.json.encode(example("gpuwatch.nvml.sample/v1"))
    sample = Codec(NvmlSample).decode(raw)
    holders = index_allocations(sample.allocations).holders
    split = split_gpu(sample.gpus[0], holders[GpuUuid(GPU_0)], IDLE_PCT)
    # One pod holds the exclusive GPU: its share is the device reading 87 % -> 0.87; its VRAM
    # is its one process's 60129542144 bytes; the pod explains everything.
    (pod,) = split.pods
    assert pod.uid == POD_UID
    assert (pod.allocated_fraction, pod.share, pod.method) == (1.0, 0.87, "exclusive")
    assert pod.vram_bytes == 60129542144
    assert pod.idle is False
    assert (split.util, split.idle, split.unattributed, split.holders) == (0.87, False, 0.0, 1)


def test_time_slicing_with_process_sm_50_30_0_at_80() -> None:
    # sm 50 + 30 + 0 = 80 % = the device's 80 %: no scaling, shares 0.5, 0.3, 0; each holds
    # 1/3; C is idle on the GPU (0 < 5 %) although the device is busy.
    g = gpu(proc(A, 50.0, 20 * GIB), proc(B, 30.0, 10 * GIB), proc(C, 0.0, 2 * GIB), util=80.0)
    split = split_gpu(g, [A, B, C], IDLE_PCT)
    third = 1 / 3
    assert by_uid(split) == {
        A: (third, 0.5, "process", False),
        B: (third, 0.3, "process", False),
        C: (third, 0.0, "process", True),
    }
    assert split.idle is False
    assert split.unattributed == pytest.approx(0.0, abs=1e-12)


def test_process_shares_scaled_down_to_the_device_reading() -> None:
    # sm 60 + 40 + 20 = 120 % > device 80 %: scale 0.8 / 1.2 = 2/3 -> 0.4, 0.2667, 0.1333.
    g = gpu(proc(A, 60.0), proc(B, 40.0), proc(C, 20.0), util=80.0)
    shares = {p.uid: p.share for p in split_gpu(g, [A, B, C], IDLE_PCT).pods}
    assert shares == pytest.approx({A: 0.4, B: 0.8 / 3, C: 0.4 / 3})


def test_process_of_no_pod_keeps_its_part_unattributed() -> None:
    # sm: A 40, a host process 40; device 60 %: total 80 > 60 -> scale 0.75; A 0.3, rest 0.3.
    g = gpu(proc(A, 40.0), proc(None, 40.0), util=60.0, sharing="mps")
    split = split_gpu(g, [A], IDLE_PCT)
    assert split.pods[0].share == pytest.approx(0.3)
    assert split.unattributed == pytest.approx(0.3)


def test_memory_share_without_process_sm() -> None:
    # No sm_pct: device 80 % split by VRAM 15 : 4 : 1 GiB of 20 -> 0.6, 0.16, 0.04; C is
    # under 5 % and idle. D holds a replica but runs nothing: 0, idle.
    g = gpu(proc(A, None, 15 * GIB), proc(B, None, 4 * GIB), proc(C, None, 1 * GIB), util=80.0)
    split = split_gpu(g, [A, B, C, D], IDLE_PCT)
    got = by_uid(split)
    assert {uid: v[1] for uid, v in got.items()} == pytest.approx(
        {A: 0.6, B: 0.16, C: 0.04, D: 0.0}
    )
    assert {uid: v[2:] for uid, v in got.items()} == {
        A: ("memory_share", False),
        B: ("memory_share", False),
        C: ("memory_share", True),
        D: ("memory_share", True),
    }
    assert {p.uid: p.vram_bytes for p in split.pods} == {A: 15 * GIB, B: 4 * GIB, C: GIB, D: 0}
    assert all(p.allocated_fraction == 0.25 for p in split.pods)


def test_memory_share_without_any_memory_reading_is_unknown_for_pods_with_processes() -> None:
    g = gpu(proc(A), proc(B), util=50.0)
    got = by_uid(split_gpu(g, [A, B, C], IDLE_PCT))
    # A and B run something, but nothing tells how much: unknown, never idle. C runs
    # nothing on a GPU whose reading is known: 0 and idle.
    assert got[A] == (1 / 3, None, "unknown", None)
    assert got[B] == (1 / 3, None, "unknown", None)
    assert got[C] == (1 / 3, 0.0, "memory_share", True)


def test_mig_instance_without_utilization_is_unknown_not_idle() -> None:
    inst = gpu(proc(A, None, 9 * GIB), sharing="mig", uuid="MIG-1", parent_uuid="GPU-p")
    split = split_gpu(inst, [A], IDLE_PCT)
    assert (split.util, split.idle, split.unattributed) == (None, None, None)
    assert by_uid(split) == {A: (1.0, None, "unknown", None)}
    assert split.pods[0].vram_bytes == 9 * GIB


def test_mig_instance_with_process_sm_uses_it() -> None:
    inst = gpu(proc(A, 30.0), sharing="mig", uuid="MIG-1", parent_uuid="GPU-p")
    split = split_gpu(inst, [A], IDLE_PCT)
    assert by_uid(split) == {A: (1.0, 0.3, "process", False)}
    assert split.unattributed is None  # no device reading to compare with


def test_mig_instance_with_utilization_and_one_pod_is_exclusive() -> None:
    inst = gpu(proc(A), sharing="mig", util=2.0, uuid="MIG-1", parent_uuid="GPU-p")
    assert by_uid(split_gpu(inst, [A], IDLE_PCT)) == {A: (1.0, 0.02, "exclusive", True)}


def test_leak_gets_a_share_but_no_allocation() -> None:
    # B runs on A's exclusive GPU without an allocation: two pods, so per-process shares.
    g = gpu(proc(A, 60.0, 40 * GIB), proc(B, 20.0, 8 * GIB), util=80.0, sharing="exclusive")
    got = by_uid(split_gpu(g, [A], IDLE_PCT))
    assert got == {A: (1.0, 0.6, "process", False), B: (0.0, 0.2, "process", False)}


def test_lone_leak_on_an_unallocated_exclusive_gpu_takes_the_device_reading() -> None:
    g = gpu(proc(B, None, GIB), util=30.0, sharing="exclusive")
    split = split_gpu(g, [], IDLE_PCT)
    assert by_uid(split) == {B: (0.0, 0.3, "exclusive", False)}
    assert split.holders == 0


def test_holder_without_process() -> None:
    busy = gpu(proc(A, 40.0), util=40.0)
    assert by_uid(split_gpu(busy, [A, B], IDLE_PCT))[B] == (0.5, 0.0, "process", True)
    unknown = gpu(proc(A), util=None)
    assert by_uid(split_gpu(unknown, [A, B], IDLE_PCT))[B] == (0.5, None, "unknown", None)


def test_exclusive_holder_takes_the_reading_even_with_unlisted_processes() -> None:
    # NVML listed nothing it could map; on an exclusive GPU the device reading is the pod's.
    split = split_gpu(gpu(proc(None, None, GIB), util=87.0, sharing="exclusive"), [A], IDLE_PCT)
    assert by_uid(split) == {A: (1.0, 0.87, "exclusive", False)}
    assert split.pods[0].vram_bytes is None


def test_a_gpu_listed_twice_for_one_pod_counts_once() -> None:
    split = split_gpu(gpu(proc(A, 10.0), util=10.0), [A, A, B], IDLE_PCT)
    assert split.holders == 2
    assert [(p.uid, p.allocated_fraction) for p in split.pods] == [(A, 0.5), (B, 0.5)]


def test_idle_threshold_is_strictly_under() -> None:
    assert split_gpu(gpu(util=5.0), [], IDLE_PCT).idle is False
    assert split_gpu(gpu(util=4.9), [], IDLE_PCT).idle is True
    assert split_gpu(gpu(util=None), [], IDLE_PCT).idle is None


def test_index_allocations_dedupes_containers_and_names_pods() -> None:
    def alloc(uid: PodUid, container: str, *uuids: str) -> Allocation:
        return Allocation(
            pod_uid=uid,
            namespace="ml",
            pod=f"p-{uid}",
            container=container,
            resource="nvidia.com/gpu",
            device_ids=tuple(GpuUuid(u) for u in uuids),
        )

    index = index_allocations(
        [alloc(A, "one", "GPU-1", "GPU-2"), alloc(A, "two", "GPU-1"), alloc(B, "x", "GPU-1")]
    )
    assert index.holders == {"GPU-1": [A, B], "GPU-2": [A]}
    assert index.names == {A: ("ml", f"p-{A}"), B: ("ml", f"p-{B}")}


def test_physical_and_instances_keeps_mig_parents_out_of_accounting() -> None:
    whole = gpu(uuid="GPU-whole", sharing="exclusive", util=10.0)
    parent = gpu(uuid="GPU-p", sharing="mig")
    inst = [gpu(uuid=f"MIG-{i}", sharing="mig", parent_uuid="GPU-p") for i in (1, 2)]
    sample = NvmlSample(
        schema="gpuwatch.nvml.sample/v1",
        node=NodeName("n"),
        ts=0,
        interval_ms=1000,
        seq=0,
        gpus=(whole, parent, *inst),
        allocations=(),
    )
    sets = physical_and_instances(sample)
    assert [g.uuid for g in sets.physical] == ["GPU-whole", "GPU-p"]
    assert [g.uuid for g in sets.accountable] == ["GPU-whole", "MIG-1", "MIG-2"]
    plain = NvmlSample(**{**msgspec.structs.asdict(sample), "gpus": (whole,)})
    assert physical_and_instances(plain) == (plain.gpus, plain.gpus)


# --- properties -------------------------------------------------------------------------

PODS = st.sampled_from([A, B, C, D, None])
PROCS = st.builds(
    proc,
    PODS,
    st.none() | st.floats(0, 100),
    st.none() | st.integers(0, 80 * GIB),
)
GPUS = st.builds(
    lambda procs, sharing, util: gpu(*procs, sharing=sharing, util=util),
    st.lists(PROCS, max_size=6),
    st.sampled_from(["exclusive", "time-slicing", "mps", "mig"]),
    st.none() | st.floats(0, 100),
)
HOLDERS = st.lists(st.sampled_from([A, B, C, D]), max_size=5)
THRESHOLDS = st.floats(0, 100)


@given(GPUS, HOLDERS, THRESHOLDS)
def test_shares_never_exceed_the_device(g: GpuReading, holders: list[PodUid], idle: float) -> None:
    split = split_gpu(g, holders, idle)
    known = [p.share for p in split.pods if p.share is not None]
    assert all(0.0 <= s <= 1.0 + 1e-12 for s in known)
    assert sum(known) <= 1.0 + 1e-9
    if split.util is not None:
        assert sum(known) <= split.util + 1e-9
        assert split.unattributed is not None
        assert split.unattributed >= 0.0
        assert sum(known) + split.unattributed == pytest.approx(split.util, abs=1e-9)
    else:
        assert split.unattributed is None
        assert split.idle is None


@given(GPUS, HOLDERS, THRESHOLDS)
def test_allocation_and_membership(g: GpuReading, holders: list[PodUid], idle: float) -> None:
    split = split_gpu(g, holders, idle)
    uids = [p.uid for p in split.pods]
    assert len(uids) == len(set(uids))
    assert set(uids) == set(holders) | {p.pod_uid for p in g.processes if p.pod_uid is not None}
    assert split.holders == len(set(holders))
    fractions = sum(p.allocated_fraction for p in split.pods)
    assert fractions == pytest.approx(1.0 if holders else 0.0)
    for p in split.pods:
        assert (p.allocated_fraction > 0) == (p.uid in holders)
        assert (p.idle is None) == (p.share is None)
        assert (p.method == "unknown") == (p.share is None)
        if p.idle is not None and p.method != "exclusive":
            assert p.idle == (p.share is not None and p.share < idle / 100)


@given(GPUS, HOLDERS, THRESHOLDS)
def test_same_input_same_split(g: GpuReading, holders: list[PodUid], idle: float) -> None:
    assert split_gpu(g, holders, idle) == split_gpu(g, list(holders), idle)
