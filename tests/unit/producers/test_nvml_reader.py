"""NvmlReader against recorded H100, H200 (MIG) and L40S captures: values, N/A and failures."""

from __future__ import annotations

import ctypes.util

import pynvml
import pytest
from fixtures.nvml.recorded_nvml import RecordedNvml, node

from producers.base.ports import DeviceReading, ProcessReading
from producers.nvml.reader import NvmlReader, NvmlUnavailable, mig_profile_name

MIB = 1 << 20
H100 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-0000-0000-0000-000000000001"
GPU2 = "GPU-22222222-0000-0000-0000-000000000002"
MIG = [f"MIG-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(5)]


def read_one(fake: RecordedNvml) -> DeviceReading:
    result = NvmlReader(fake).read()
    assert result.errors == ()
    (device,) = result.devices
    return device


def test_h100_under_load_reads_as_captured() -> None:
    gpu = read_one(RecordedNvml.of("h100_80gb_hbm3", "load"))

    assert gpu.uuid == H100
    assert gpu.index == 0
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert (gpu.parent_uuid, gpu.mig_profile, gpu.mig_enabled) == (None, None, False)
    assert (gpu.util_pct, gpu.mem_util_pct) == (100.0, 11.0)
    assert gpu.mem_used_bytes == 19818 * MIB  # nvidia-smi "Used", reserved 479 MiB not in it
    assert gpu.mem_total_bytes == 81559 * MIB == 85520809984
    assert gpu.power_w == pytest.approx(629.45)
    assert (gpu.temp_c, gpu.ecc_dbe, gpu.xid_errors, gpu.mps) == (59, 0, (), False)
    # pmon: gpu_burn 99 % in every sample; the two memhogs hold memory and have no sample.
    assert gpu.processes == (
        ProcessReading(pid=11327, mem_bytes=2566 * MIB, sm_pct=0.0),
        ProcessReading(pid=11328, mem_bytes=1542 * MIB, sm_pct=0.0),
        ProcessReading(pid=11345, mem_bytes=15690 * MIB, sm_pct=99.0),
    )


def test_h100_idle_reads_zero_utilization_and_no_processes() -> None:
    gpu = read_one(RecordedNvml.of("h100_80gb_hbm3", "idle"))

    assert (gpu.util_pct, gpu.mem_util_pct, gpu.mem_used_bytes) == (0.0, 0.0, 0)
    assert gpu.power_w == pytest.approx(69.85)
    assert (gpu.temp_c, gpu.processes) == (41, ())


def test_l40s_process_sm_is_the_mean_of_the_pmon_samples() -> None:
    gpu = read_one(RecordedNvml.of("l40s", "load"))

    assert gpu.model == "NVIDIA L40S"
    assert gpu.mig_enabled is False  # MIG mode N/A on an L40S: NotSupported, not an error
    assert (gpu.util_pct, gpu.mem_util_pct, gpu.temp_c) == (9.0, 2.0, 54)
    assert (gpu.mem_used_bytes, gpu.mem_total_bytes) == (1235 * MIB, 46068 * MIB)
    assert gpu.power_w == pytest.approx(110.24)
    ffmpeg_a, ffmpeg_b = gpu.processes
    assert (ffmpeg_a.pid, ffmpeg_a.mem_bytes) == (20037, 538 * MIB)
    assert ffmpeg_a.sm_pct == pytest.approx((2 + 2 + 1 + 0 + 2) / 5)
    assert (ffmpeg_b.pid, ffmpeg_b.mem_bytes) == (20038, 681 * MIB)
    assert ffmpeg_b.sm_pct == pytest.approx((6 + 5 + 8 + 7 + 5) / 5)


def test_l40s_idle_busy_device_without_processes_is_reported_as_is() -> None:
    gpu = read_one(RecordedNvml.of("l40s", "idle"))

    assert (gpu.util_pct, gpu.processes, gpu.mem_used_bytes) == (100.0, (), 0)


def test_h200_mig_parent_and_instances() -> None:
    result = NvmlReader(RecordedNvml.of("h200_mig", "load")).read()

    assert result.errors == ()
    parent, *instances = result.devices
    assert parent.uuid == H100
    assert (parent.parent_uuid, parent.mig_profile, parent.mig_enabled) == (None, None, True)
    assert (parent.util_pct, parent.mem_util_pct) == (None, None)  # N/A under MIG, never 0
    assert (parent.mem_used_bytes, parent.mem_total_bytes) == (16959 * MIB, 143771 * MIB)
    assert parent.power_w == pytest.approx(294.94)
    assert (parent.temp_c, parent.ecc_dbe, parent.processes) == (36, 0, ())

    assert [i.uuid for i in instances] == MIG
    # The names nvidia-smi -L shows for these five MIG devices.
    assert [i.mig_profile for i in instances] == [
        "1c.3g.71gb",
        "2c.3g.71gb",
        "2g.35gb",
        "1g.18gb",
        "1g.18gb",
    ]
    assert [i.mem_used_bytes // MIB for i in instances] == [16925, 16925, 17, 9, 9]
    assert [i.mem_total_bytes // MIB for i in instances] == [71424, 71424, 33280, 16384, 16384]
    for instance in instances:
        assert (instance.parent_uuid, instance.mig_enabled, instance.index) == (H100, True, 0)
        assert instance.model == "NVIDIA H200"
        assert (instance.util_pct, instance.mem_util_pct, instance.power_w) == (None, None, None)
        assert (instance.temp_c, instance.ecc_dbe, instance.xid_errors) == (None, None, ())
    assert instances[1].processes == (
        ProcessReading(pid=12249, mem_bytes=2194 * MIB, sm_pct=None),
        ProcessReading(pid=12250, mem_bytes=1170 * MIB, sm_pct=None),
        ProcessReading(pid=12267, mem_bytes=13526 * MIB, sm_pct=None),
    )
    assert all(i.processes == () for i in instances if i.uuid != MIG[1])


@pytest.mark.parametrize("raw_sentinel", [False, True])
def test_mig_process_memory_without_privileges_is_none(raw_sentinel: bool) -> None:
    fake = RecordedNvml.of("h200_mig", "load", privileged=False)
    fake.raw_not_available = raw_sentinel  # pynvml maps NVML_VALUE_NOT_AVAILABLE to None; older not

    result = NvmlReader(fake).read()

    assert result.errors == ()
    processes = result.devices[2].processes
    assert [p.pid for p in processes] == [12249, 12250, 12267]
    assert all(p.mem_bytes is None and p.sm_pct is None for p in processes)


def test_mig_idle_instances_have_memory_but_no_processes() -> None:
    result = NvmlReader(RecordedNvml.of("h200_mig", "idle")).read()

    assert [d.mem_used_bytes // MIB for d in result.devices] == [55, 22, 22, 17, 9, 9]
    assert result.devices[0].temp_c == 28
    assert all(d.processes == () for d in result.devices)


@pytest.mark.parametrize(
    ("gi", "ci", "mib", "gpu_mib", "name"),
    [
        (1, 1, 16384, 143771, "1g.18gb"),  # H200, from the capture
        (2, 2, 33280, 143771, "2g.35gb"),
        (3, 1, 71424, 143771, "1c.3g.71gb"),  # 70.5 GB rounds half up, as nvidia-smi
        (7, 7, 143360, 143771, "7g.141gb"),
        (1, 1, 9856, 81559, "1g.10gb"),  # H100 80GB
        (3, 3, 40192, 81559, "3g.40gb"),
    ],
)
def test_mig_profile_names(gi: int, ci: int, mib: int, gpu_mib: int, name: str) -> None:
    assert mig_profile_name(gi, ci, mib, gpu_mib * MIB) == name


def test_process_utilization_not_found_means_zero_where_device_utilization_is_known() -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    reader = NvmlReader(fake)
    assert reader.read().devices[0].processes[2].sm_pct == 99.0

    # No sample newer than the last one seen: the driver answers NotFound.
    again = reader.read().devices[0]
    assert [p.sm_pct for p in again.processes] == [0.0, 0.0, 0.0]

    fake.tick()  # the driver sampled again
    assert reader.read().devices[0].processes[2].sm_pct == 99.0


def test_process_without_sample_is_none_when_device_utilization_is_unknown() -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    fake.fail(H100, "nvmlDeviceGetUtilizationRates", pynvml.NVMLError_NotSupported)

    gpu = read_one(fake)

    assert gpu.util_pct is None
    assert [p.sm_pct for p in gpu.processes] == [None, None, 99.0]


def test_process_utilization_not_supported_is_none() -> None:
    fake = RecordedNvml.of("l40s", "load")
    fake.fail(H100, "nvmlDeviceGetProcessUtilization", pynvml.NVMLError_NotSupported)

    gpu = read_one(fake)

    assert gpu.util_pct == 9.0
    assert [p.sm_pct for p in gpu.processes] == [None, None]
    assert [p.mem_bytes for p in gpu.processes] == [538 * MIB, 681 * MIB]


def test_mps_clients_are_processes_and_a_pid_listed_twice_counts_once() -> None:
    fake = RecordedNvml.of("l40s", "load")
    # Not from a capture: an MPS client 30001, and 20037 again without a memory figure.
    fake.mps[H100] = [(30001, 100), (20037, None)]

    gpu = read_one(fake)

    assert [(p.pid, p.mem_bytes) for p in gpu.processes] == [
        (20037, 538 * MIB),
        (20038, 681 * MIB),
        (30001, 100 * MIB),
    ]
    assert gpu.processes[2].sm_pct == 0.0  # running, no sample, device utilization known
    assert gpu.mps is True


@pytest.mark.parametrize(
    "call", ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "nvmlDeviceGetTotalEccErrors"]
)
def test_unsupported_reading_is_none_not_zero(call: str) -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    fake.fail(H100, call, pynvml.NVMLError_NotSupported)

    gpu = read_one(fake)

    readings = {
        "nvmlDeviceGetPowerUsage": gpu.power_w,
        "nvmlDeviceGetTemperature": gpu.temp_c,
        "nvmlDeviceGetTotalEccErrors": gpu.ecc_dbe,
    }
    assert readings.pop(call) is None
    assert None not in readings.values()


def test_driver_without_memory_v2_falls_back_to_v1_with_reserved_memory_in_used() -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    fake.memory_v2 = False

    gpu = read_one(fake)

    assert gpu.mem_used_bytes == (81559 - 61263) * MIB  # total - free, as NVML v1 reports


def three_gpu_node() -> RecordedNvml:
    return node(
        ("h100_80gb_hbm3", "load", H100), ("l40s", "load", GPU1), ("h200_mig", "load", GPU2)
    )


def test_a_lost_gpu_is_an_error_line_and_the_others_are_read() -> None:
    fake = three_gpu_node()
    reader = NvmlReader(fake)
    assert len(reader.read().devices) == 1 + 1 + 6

    fake.fail(GPU1, "*", pynvml.NVMLError_GpuIsLost)
    result = reader.read()

    assert result.errors == (f"GPU 1 {GPU1}: GPU is lost",)
    assert [d.uuid for d in result.devices] == [H100, GPU2, *MIG]


def test_a_failing_call_skips_that_device_only() -> None:
    fake = three_gpu_node()
    fake.fail(H100, "nvmlDeviceGetPowerUsage", pynvml.NVMLError_Unknown)

    result = NvmlReader(fake).read()

    assert result.errors == (f"GPU 0 {H100}: Unknown Error",)
    assert [d.uuid for d in result.devices] == [GPU1, GPU2, *MIG]
    assert result.devices[0].processes[1].sm_pct == pytest.approx(6.2)


def test_a_failing_mig_instance_skips_that_instance_only() -> None:
    fake = RecordedNvml.of("h200_mig", "load")
    fake.fail(MIG[1], "nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLError_Unknown)

    result = NvmlReader(fake).read()

    assert result.errors == (f"GPU 0 {MIG[1]}: Unknown Error",)
    assert [d.uuid for d in result.devices] == [H100, MIG[0], *MIG[2:]]


def test_gpu_count_failure_is_an_error_not_an_exception() -> None:
    fake = RecordedNvml.of("l40s", "load")
    fake.fail("*", "nvmlDeviceGetCount", pynvml.NVMLError_Unknown)

    result = NvmlReader(fake).read()

    assert (result.devices, result.errors) == ((), ("nvmlDeviceGetCount: Unknown Error",))


def test_xid_events_are_reported_once_on_their_gpu() -> None:
    fake = three_gpu_node()
    reader = NvmlReader(fake)
    reader.read()  # registers every GPU for Xid events

    fake.xid(GPU1, 79)
    fake.xid(GPU1, 48)
    fake.xid(GPU2, 94)
    first: dict[str, tuple[int, ...]] = {d.uuid: d.xid_errors for d in reader.read().devices}
    second = [d.xid_errors for d in reader.read().devices]

    assert first[GPU1] == (79, 48)
    assert first[GPU2] == (94,)  # a MIG GPU's Xid goes to the physical GPU
    assert first[H100] == first[MIG[0]] == ()
    assert set(second) == {()}


def test_xid_events_not_supported_is_never_fatal() -> None:
    fake = RecordedNvml.of("l40s", "load")
    fake.xid_unsupported.add(H100)
    reader = NvmlReader(fake)

    assert reader.read().errors == ()
    fake.xid(H100, 79)  # not registered: never delivered
    assert reader.read().devices[0].xid_errors == ()


def test_init_failure_raises_nvml_unavailable() -> None:
    fake = RecordedNvml.of("l40s", "load")
    fake.init_error = pynvml.NVMLError_DriverNotLoaded()

    with pytest.raises(
        NvmlUnavailable, match="no usable NVIDIA driver here; use --backend sim"
    ) as info:
        NvmlReader(fake)
    assert isinstance(info.value.__cause__, pynvml.NVMLError_DriverNotLoaded)


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="an NVIDIA driver is installed"
)
def test_real_pynvml_without_a_driver_raises_nvml_unavailable() -> None:
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        NvmlReader()


def test_close_frees_events_and_shuts_down_once() -> None:
    fake = RecordedNvml.of("l40s", "load")
    reader = NvmlReader(fake)

    reader.close()
    reader.close()

    assert fake.calls.count("nvmlEventSetFree") == 1
    assert fake.calls.count("nvmlShutdown") == 1
