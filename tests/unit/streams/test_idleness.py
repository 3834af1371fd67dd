"""The idleness rule: a held GPU is idle when every holder is by its own share, and the short
cut for one holder of an exclusive GPU answers what the whole split would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_gpu_alerts_fixtures import GPU_A, POD_P, POD_Q, POD_R, T0, alloc, gpu, proc, sample

from schemas.fields import Sharing
from schemas.ids import PodUid
from schemas.nvml_sample import GpuProcess, GpuReading
from streams.core.node.idleness import gpu_idle, idle_by_gpu
from streams.core.split import split_gpu

PODS = (POD_P, POD_Q, POD_R)
THRESHOLD = 5.0


def _by_split(reading: GpuReading, holders: list[PodUid]) -> bool | None:
    """The rule spelt out: the holders' own idleness from the whole split."""
    if not holders:
        util = reading.util_pct
        return None if util is None else util < THRESHOLD
    idle = [p.idle for p in split_gpu(reading, holders, THRESHOLD).pods if p.allocated_fraction]
    return False if False in idle else None if None in idle else True


@st.composite
def readings(draw: st.DrawFn) -> tuple[GpuReading, list[PodUid]]:
    util = draw(st.one_of(st.none(), st.sampled_from([0.0, 2.0, 4.9, 5.0, 30.0, 90.0])))
    shares: list[Sharing] = ["exclusive", "exclusive", "time-slicing", "mps", "mig"]
    sharing = draw(st.sampled_from(shares))
    procs: list[GpuProcess] = []
    for pid in range(draw(st.integers(0, 3))):
        owner = draw(st.one_of(st.none(), st.sampled_from(PODS)))
        sm = draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 40.0, 80.0])))
        mem = draw(st.one_of(st.none(), st.just(1 << 30)))
        procs.append(proc(pid + 1, owner, sm=sm, mem=mem))
    # P alone most often (the short cut's case), R never: its processes are a leak's.
    holders = draw(st.sampled_from([[POD_P], [POD_P], [POD_P, POD_Q], []]))
    return gpu(GPU_A, util, *procs, sharing=sharing), holders


@settings(max_examples=300, deadline=None)
@given(readings())
def test_the_answer_is_the_holders_own_idleness_from_the_split(
    case: tuple[GpuReading, list[PodUid]],
) -> None:
    reading, holders = case
    assert gpu_idle(reading, holders, THRESHOLD) == _by_split(reading, holders)


def test_a_busy_host_process_does_not_hide_idle_holders_of_a_time_sliced_gpu() -> None:
    sliced = gpu(
        GPU_A,
        72.0,
        proc(1, POD_P, sm=1.0),
        proc(2, POD_Q, sm=1.0),
        proc(3, None, sm=70.0),
        sharing="time-slicing",
    )
    assert gpu_idle(sliced, [POD_P, POD_Q], THRESHOLD) is True
    assert gpu_idle(sliced, [], THRESHOLD) is False  # no holder: the device reading
    busy = gpu(GPU_A, 72.0, proc(1, POD_P, sm=1.0), proc(2, POD_Q, sm=70.0), sharing="mps")
    assert gpu_idle(busy, [POD_P, POD_Q], THRESHOLD) is False


def test_every_gpu_of_a_sample_with_its_holders_from_the_allocations() -> None:
    held = gpu(GPU_A, 60.0, proc(1, None, sm=60.0), proc(2, POD_P, sm=0.0), sharing="mps")
    item = sample(T0, [held], [alloc(POD_P, GPU_A)])
    assert idle_by_gpu(item, THRESHOLD) == {GPU_A: True}
    assert idle_by_gpu(sample(T0, [held]), THRESHOLD) == {GPU_A: False}
