"""SimReader: deterministic workload-driven readings with the semantics of the real driver."""

from __future__ import annotations

import itertools

import pytest

from gpuwatch.harness.simulate.gpus import (
    CONTEXT_OVERHEAD_BYTES,
    SimGpu,
    SimReader,
    SimWorkload,
    WorkloadKind,
)
from producers.base.ports import ReadResult

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_764_374_400.0  # 2025-11-29 00:00 UTC
H100 = SimGpu.preset("h100", "GPU-0", 0)


class Clock:
    """The injected `now`: advanced by the test, never by the wall clock."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def series(reader: SimReader, clock: Clock, seconds: int, step: float = 1.0) -> list[ReadResult]:
    results = []
    for _ in range(seconds):
        results.append(reader.read())
        clock.t += step
    return results


def one_gpu(kind: WorkloadKind, mem: int = 20 * GIB) -> tuple[SimReader, Clock]:
    clock = Clock()
    reader = SimReader([H100], [SimWorkload(100, H100.uuid, kind, mem)], seed=7, now=clock)
    return reader, clock


def test_same_seed_and_clock_give_the_same_readings() -> None:
    def run(seed: int) -> list[ReadResult]:
        clock = Clock()
        gpus = [SimGpu.preset("h100", f"GPU-{i}", i) for i in range(4)]
        kinds: list[WorkloadKind] = ["training", "inference", "crashloop", "notebook"]
        work = [SimWorkload(10 + i, g.uuid, kinds[i], GIB) for i, g in enumerate(gpus)]
        return series(SimReader(gpus, work, seed=seed, now=clock), clock, 120)

    assert run(seed=1) == run(seed=1)
    assert run(seed=1) != run(seed=2)


def test_training_runs_high_with_short_data_loader_pauses() -> None:
    reader, clock = one_gpu("training")

    utils = [r.devices[0].util_pct for r in series(reader, clock, 600)]

    assert all(u is not None and 0.0 <= u <= 100.0 for u in utils)
    busy = [u for u in utils if u is not None and u >= 83.0]
    assert len(busy) >= 0.85 * len(utils)
    pauses = [
        len(list(run)) for low, run in itertools.groupby(utils, key=lambda u: (u or 0) < 5) if low
    ]
    assert 600 / 90 - 1 <= len(pauses) <= 600 / 40 + 1  # one pause every 40-90 s
    assert all(1 <= n <= 7 for n in pauses)  # of 2-6 s, sampled at 1 Hz


def test_notebook_holds_memory_at_zero_utilization() -> None:
    reader, _ = one_gpu("notebook", mem=30 * GIB)

    gpu = reader.read().devices[0]

    assert (gpu.util_pct, gpu.mem_util_pct) == (0.0, 0.0)
    assert gpu.mem_used_bytes == 30 * GIB + CONTEXT_OVERHEAD_BYTES
    assert [(p.pid, p.mem_bytes, p.sm_pct) for p in gpu.processes] == [(100, 30 * GIB, 0.0)]
    assert (gpu.power_w, gpu.temp_c) == (70.0, 40)  # idle power of the H100 capture


def test_an_idle_gpu_reads_as_the_captured_idle_h100() -> None:
    reader = SimReader([H100], now=Clock())

    gpu = reader.read().devices[0]

    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.mem_total_bytes == 85520809984  # 81559 MiB
    assert (gpu.util_pct, gpu.mem_used_bytes, gpu.processes, gpu.power_w) == (0.0, 0, (), 70.0)


def test_inference_follows_the_daily_curve() -> None:
    reader, clock = one_gpu("inference")

    def util_at(hour: float) -> float:
        clock.t = T0 + hour * 3600
        util = reader.read().devices[0].util_pct
        assert util is not None
        return util

    peak, night = util_at(15), util_at(3)
    assert peak > 45.0
    assert night < 0.4 * peak


def test_crashloop_appears_and_disappears_with_growing_back_off() -> None:
    reader, clock = one_gpu("crashloop")

    present = [bool(r.devices[0].processes) for r in series(reader, clock, 900)]

    gaps = [len(list(run)) for up, run in itertools.groupby(present) if not up]
    assert present[0] is True
    assert [round(g / 10) * 10 for g in gaps[:4]] == [10, 20, 40, 80]
    assert max(gaps) <= 300


def test_utilization_never_exceeds_100_and_processes_share_the_device() -> None:
    clock = Clock()
    work = [SimWorkload(pid, H100.uuid, "training", 10 * GIB) for pid in (1, 2, 3)]
    reader = SimReader([H100], work, seed=3, now=clock)

    for result in series(reader, clock, 300):
        gpu = result.devices[0]
        sms = [p.sm_pct for p in gpu.processes]
        assert gpu.util_pct is not None
        assert gpu.util_pct <= 100.0
        assert sum(s for s in sms if s is not None) == pytest.approx(gpu.util_pct)
        assert gpu.power_w is not None
        assert gpu.power_w == pytest.approx(70.0 + 630.0 * gpu.util_pct / 100)


def test_process_memory_sums_to_used_memory_plus_context_overhead() -> None:
    clock = Clock()
    work = [
        SimWorkload(1, H100.uuid, "training", 40 * GIB),
        SimWorkload(2, H100.uuid, "crashloop", 7 * GIB),
        SimWorkload(3, H100.uuid, "idle", 512 * MIB),
    ]
    reader = SimReader([H100], work, seed=5, now=clock)

    counts = set()
    for result in series(reader, clock, 200):
        gpu = result.devices[0]
        mems = [p.mem_bytes for p in gpu.processes]
        counts.add(len(mems))
        assert (
            gpu.mem_used_bytes
            == sum(m for m in mems if m is not None) + len(mems) * CONTEXT_OVERHEAD_BYTES
        )
    assert counts == {2, 3}  # with and without the crash-looping process


def h200_mig(clock: Clock) -> SimReader:
    parent = SimGpu.preset("h200", "GPU-H200", 0)
    small = SimGpu("MIG-a", 0, "NVIDIA H200", 16384 * MIB, 0, 0, parent.uuid, "1g.18gb")
    big = SimGpu("MIG-b", 0, "NVIDIA H200", 71424 * MIB, 0, 0, parent.uuid, "3g.71gb")
    work = [
        SimWorkload(1, "MIG-b", "training", 13526 * MIB),
        SimWorkload(2, "MIG-a", "notebook", 2 * GIB),
    ]
    return SimReader([parent, small, big], work, seed=9, now=clock)


def test_mig_instances_report_none_where_drivers_do() -> None:
    result = h200_mig(Clock(T0 + 1000)).read()

    parent, small, big = result.devices
    assert (parent.mig_enabled, parent.parent_uuid, parent.util_pct, parent.processes) == (
        True,
        None,
        None,
        (),
    )
    assert parent.mem_used_bytes == small.mem_used_bytes + big.mem_used_bytes
    assert parent.power_w is not None
    assert parent.power_w > 78.0  # the training instance draws power on the parent
    for instance in (small, big):
        assert (instance.parent_uuid, instance.mig_enabled) == ("GPU-H200", True)
        assert (instance.util_pct, instance.mem_util_pct) == (None, None)
        assert (instance.power_w, instance.temp_c, instance.ecc_dbe) == (None, None, None)
        assert all(p.mem_bytes is None and p.sm_pct is None for p in instance.processes)
    assert big.mig_profile == "3g.71gb"
    assert big.mem_used_bytes == 13526 * MIB + CONTEXT_OVERHEAD_BYTES
    assert [p.pid for p in big.processes] == [1]


def test_workloads_start_and_stop() -> None:
    clock = Clock()
    reader = SimReader([H100], now=clock)
    reader.add_workload(SimWorkload(5, H100.uuid, "training", GIB, start_s=T0 + 10))

    assert reader.read().devices[0].processes == ()  # not started yet
    clock.t = T0 + 10
    assert [p.pid for p in reader.read().devices[0].processes] == [5]
    assert reader.remove_workload(5) is True
    assert reader.remove_workload(5) is False
    gpu = reader.read().devices[0]
    assert (gpu.processes, gpu.mem_used_bytes, gpu.util_pct) == ((), 0, 0.0)


def test_an_mps_gpu_reads_mps_while_it_has_clients() -> None:
    clock = Clock()
    gpu = SimGpu("GPU-M", 0, "NVIDIA L40S", 46068 * MIB, 37.0, 350.0, mps=True)
    reader = SimReader([gpu], now=clock)
    assert reader.read().devices[0].mps is False  # the daemon alone: nothing NVML can see

    reader.add_workload(SimWorkload(1, "GPU-M", "inference", GIB))
    assert reader.read().devices[0].mps is True
    assert reader.read().devices[0].processes[0].pid == 1


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (SimWorkload(1, "GPU-0", "training", 80 * GIB), "does not fit"),
        (SimWorkload(1, "GPU-9", "training", GIB), "cannot run processes"),
        (SimWorkload(1, "GPU-H200", "training", GIB), "cannot run processes"),
    ],
)
def test_impossible_workloads_are_refused(workload: SimWorkload, message: str) -> None:
    reader = h200_mig(Clock())
    reader_h100 = SimReader([H100], now=Clock())

    with pytest.raises(ValueError, match=message):
        (reader_h100 if workload.gpu_uuid == "GPU-0" else reader).add_workload(workload)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload kind"):
        SimWorkload(1, "GPU-0", "mining", GIB)  # type: ignore[arg-type]


def test_xids_are_reported_once_and_a_lost_gpu_is_an_error_line() -> None:
    clock = Clock()
    other = SimGpu.preset("l40s", "GPU-1", 1)
    reader = SimReader([H100, other], now=clock)

    reader.inject_xid("GPU-1", 31)
    reader.inject_xid("GPU-1", 13)
    assert [d.xid_errors for d in reader.read().devices] == [(), (31, 13)]
    assert [d.xid_errors for d in reader.read().devices] == [(), ()]

    reader.set_lost("GPU-0")
    result = reader.read()
    assert result.errors == ("GPU 0 GPU-0: GPU is lost",)
    assert [d.uuid for d in result.devices] == ["GPU-1"]
    reader.set_lost("GPU-0", lost=False)
    assert len(reader.read().devices) == 2
