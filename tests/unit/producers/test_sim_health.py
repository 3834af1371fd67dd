"""SimReader's GPU health readings: healthy as the recorded GPUs, and the faults that change
them (throttling, a double-bit ECC error, a failed row remapping, a GPU off the bus)."""

from __future__ import annotations

import pytest

from gpuwatch.harness.simulate.gpus import HOT_C, SimGpu, SimReader, SimWorkload
from producers.base.ports import DeviceReading
from schemas.nvml_sample import RemappedRows

GIB = 1 << 30
MIB = 1 << 20
T0 = 1_764_374_400.0
NO_ROWS = RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=False)


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def health(gpu: DeviceReading) -> tuple[object, ...]:
    return (gpu.throttle_reasons, gpu.remapped_rows, gpu.retired_pages_pending, gpu.pcie_replays)


def node(*workloads: SimWorkload) -> tuple[SimReader, Clock]:
    clock = Clock()
    gpus = [SimGpu.preset("h100", "GPU-0", 0), SimGpu.preset("l40s", "GPU-1", 1)]
    return SimReader(gpus, workloads, seed=4, now=clock), clock


def mig_node() -> SimReader:
    parent = SimGpu.preset("h200", "GPU-H200", 0)
    small = SimGpu("MIG-a", 0, "NVIDIA H200", 16384 * MIB, 0, 0, parent.uuid, "1g.18gb")
    return SimReader([parent, small], [SimWorkload(1, "MIG-a", "training", GIB)], now=Clock())


def test_whole_gpus_read_healthy_as_the_recorded_ones() -> None:
    reader, _ = node(SimWorkload(1, "GPU-0", "training", 10 * GIB))

    busy, idle = reader.read().devices

    # No reason active, no row remapped, retired pages N/A (rows are remapped instead),
    # no PCIe replay: what the H100 and L40S captures show, replays aside (9 on the H100).
    assert health(busy) == health(idle) == ((), NO_ROWS, None, 0)
    assert (busy.ecc_dbe, busy.xid_errors) == (0, ())


def test_an_idle_gpu_reads_the_same_object_every_tick() -> None:
    reader, clock = node()

    first = reader.read().devices[1]
    clock.t += 60
    assert reader.read().devices[1] is first


def test_a_gpu_in_mig_mode_reports_no_remapped_rows_and_its_instances_no_health() -> None:
    parent, instance = mig_node().read().devices

    assert health(parent) == ((), None, None, 0)  # Remapped Rows N/A under MIG, as captured
    assert health(instance) == (None, None, None, None)


def test_a_thermal_slowdown_is_listed_and_reads_hot_while_it_lasts() -> None:
    reader, _ = node()
    before = reader.read().devices[0]

    reader.set_throttle("GPU-0", "hw_thermal_slowdown")
    during = [reader.read().devices[0] for _ in range(3)]
    reader.set_throttle("GPU-0", "hw_thermal_slowdown", active=False)
    after = reader.read().devices[0]

    assert (before.throttle_reasons, before.temp_c) == ((), 40)
    assert all((d.throttle_reasons, d.temp_c) == (("hw_thermal_slowdown",), HOT_C) for d in during)
    assert during[0] is during[2]  # idle and throttled: still one cached reading
    assert (after.throttle_reasons, after.temp_c) == ((), 40)


def test_throttling_leaves_utilization_to_the_work() -> None:
    work = SimWorkload(1, "GPU-0", "training", 10 * GIB)
    plain, plain_clock = node(work)
    hot, hot_clock = node(work)
    hot.set_throttle("GPU-0", "hw_thermal_slowdown")

    for _ in range(30):
        a, b = plain.read().devices[0], hot.read().devices[0]
        assert (b.util_pct, b.processes, b.power_w) == (a.util_pct, a.processes, a.power_w)
        assert b.temp_c == HOT_C != a.temp_c
        plain_clock.t += 1
        hot_clock.t += 1


def test_reasons_are_listed_in_throttle_reasons_order_and_only_thermal_ones_read_hot() -> None:
    reader, _ = node()

    reader.set_throttle("GPU-1", "sync_boost")
    reader.set_throttle("GPU-1", "sw_power_cap")
    gpu = reader.read().devices[1]
    assert (gpu.throttle_reasons, gpu.temp_c) == (("sw_power_cap", "sync_boost"), 40)

    reader.set_throttle("GPU-1", "sw_thermal_slowdown")
    reader.set_throttle("GPU-1", "sync_boost", active=False)
    gpu = reader.read().devices[1]
    assert (gpu.throttle_reasons, gpu.temp_c) == (("sw_power_cap", "sw_thermal_slowdown"), HOT_C)


def test_a_throttled_mig_gpu_lists_the_reason_on_the_parent_only() -> None:
    reader = mig_node()
    reader.set_throttle("GPU-H200", "hw_power_brake_slowdown")

    parent, instance = reader.read().devices

    assert parent.throttle_reasons == ("hw_power_brake_slowdown",)
    assert instance.throttle_reasons is None


@pytest.mark.parametrize(
    ("uuid", "reason", "message"),
    [
        ("GPU-0", "gpu_idle", "unknown throttle reason 'gpu_idle'"),
        ("MIG-a", "hw_slowdown", "MIG-a is not a physical GPU"),
        ("GPU-9", "hw_slowdown", "GPU-9 is not a physical GPU"),
    ],
)
def test_impossible_throttles_are_refused(uuid: str, reason: str, message: str) -> None:
    reader = mig_node()
    reader_h100, _ = node()

    with pytest.raises(ValueError, match=message):
        (reader if uuid.startswith("MIG") else reader_h100).set_throttle(uuid, reason)


def test_a_double_bit_error_is_xid_48_once_and_counts_from_then_on() -> None:
    reader, _ = node()

    reader.inject_ecc("GPU-0")
    first, second = reader.read().devices[0], reader.read().devices[0]
    reader.inject_ecc("GPU-0")
    third = reader.read().devices[0]

    pending = RemappedRows(correctable=0, uncorrectable=1, pending=True, failed=False)
    assert (first.xid_errors, first.ecc_dbe, first.remapped_rows) == ((48,), 1, pending)
    assert (second.xid_errors, second.ecc_dbe, second.remapped_rows) == ((), 1, pending)
    assert (third.xid_errors, third.ecc_dbe) == ((48,), 2)
    assert third.remapped_rows == RemappedRows(
        correctable=0, uncorrectable=2, pending=True, failed=False
    )
    assert reader.read().devices[1].ecc_dbe == 0  # the other GPU


def test_a_double_bit_error_on_a_gpu_in_mig_mode_counts_without_remapped_rows() -> None:
    reader = mig_node()
    reader.inject_ecc("GPU-H200")

    parent, instance = reader.read().devices
    reader.fail_remap("GPU-H200")  # nothing to show it on
    later, _ = reader.read().devices

    assert (parent.xid_errors, parent.ecc_dbe, parent.remapped_rows) == ((48,), 1, None)
    assert (instance.xid_errors, instance.ecc_dbe) == ((), None)
    assert (later.xid_errors, later.ecc_dbe, later.remapped_rows) == ((), 1, None)


def test_a_failed_remapping_is_reported_from_then_on() -> None:
    reader, _ = node()
    assert reader.read().devices[0].remapped_rows == NO_ROWS

    reader.fail_remap("GPU-0")

    failed = RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=True)
    assert [reader.read().devices[0].remapped_rows for _ in range(2)] == [failed, failed]
    assert reader.read().devices[1].remapped_rows == NO_ROWS


def test_xid_79_is_reported_and_the_gpu_is_lost_from_the_read_after() -> None:
    reader, _ = node(SimWorkload(1, "GPU-1", "inference", GIB))

    reader.inject_xid("GPU-1", 79)
    reported, lost, still = reader.read(), reader.read(), reader.read()
    reader.set_lost("GPU-1", lost=False)
    back = reader.read()

    assert [(d.uuid, d.xid_errors) for d in reported.devices] == [("GPU-0", ()), ("GPU-1", (79,))]
    assert reported.errors == ()
    for result in (lost, still):
        assert [d.uuid for d in result.devices] == ["GPU-0"]
        assert result.errors == ("GPU 1 GPU-1: GPU is lost",)
    assert [(d.uuid, d.xid_errors) for d in back.devices] == [("GPU-0", ()), ("GPU-1", ())]
    assert [p.pid for p in back.devices[1].processes] == [1]


def test_a_gpu_found_again_before_its_xid_79_is_read_is_never_lost() -> None:
    reader, _ = node()

    reader.inject_xid("GPU-0", 79)
    reader.set_lost("GPU-0", lost=False)

    assert reader.read().devices[0].xid_errors == (79,)
    assert len(reader.read().devices) == 2
