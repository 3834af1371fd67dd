"""NvmlReader's GPU health readings and Xid placement against the recorded captures:
clock event reasons, remapped rows, retired pages, PCIe replays, and Xids of MIG instances."""

from __future__ import annotations

from typing import Any, cast

import pynvml
import pytest
from fixtures.nvml.recorded_nvml import NO_INSTANCE, Event, Handle, RecordedNvml, node

from producers.base.ports import DeviceReading
from producers.nvml.api import NvmlApi
from producers.nvml.reader import NvmlReader, throttle_reasons
from schemas.nvml_sample import THROTTLE_REASONS, RemappedRows

H100 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-0000-0000-0000-000000000001"
GPU2 = "GPU-22222222-0000-0000-0000-000000000002"
MIG = [f"MIG-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(5)]
NO_ROWS_REMAPPED = RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=False)
HEALTH_CALLS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetPcieReplayCounter",
)

# Bits as NVML defines them (nvml.h), written out so that a wrong pynvml name shows.
IDLE, APP_CLOCKS, SW_POWER_CAP, HW_SLOWDOWN = 0x1, 0x2, 0x4, 0x8
SYNC_BOOST, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE, DISPLAY = 0x10, 0x20, 0x40, 0x80, 0x100


def health(gpu: DeviceReading) -> tuple[object, ...]:
    return (gpu.throttle_reasons, gpu.remapped_rows, gpu.retired_pages_pending, gpu.pcie_replays)


def read_all(fake: RecordedNvml) -> tuple[DeviceReading, ...]:
    result = NvmlReader(fake).read()
    assert result.errors == ()
    return result.devices


@pytest.mark.parametrize(
    ("fixture", "phase", "expected"),
    [
        # -q: Idle Active (bit 0x1, never named), every other reason Not Active; Remapped
        # Rows 0 / 0 / No / No; Retired Pages N/A; Replays Since Reset 9.
        ("h100_80gb_hbm3", "idle", ((), NO_ROWS_REMAPPED, None, 9)),
        ("h100_80gb_hbm3", "load", ((), NO_ROWS_REMAPPED, None, 9)),
        # Under MIG: Remapped Rows N/A, Retired Pages N/A, Replays 0.
        ("h200_mig", "idle", ((), None, None, 0)),
        ("h200_mig", "load", ((), None, None, 0)),
        # SW Power Capping's counter is non-zero, but the reason is Not Active at the read.
        ("l40s", "idle", ((), NO_ROWS_REMAPPED, None, 0)),
        ("l40s", "load", ((), NO_ROWS_REMAPPED, None, 0)),
    ],
)
def test_each_recorded_gpu_reads_its_captured_health(
    fixture: str, phase: str, expected: tuple[object, ...]
) -> None:
    gpu, *instances = read_all(RecordedNvml.of(fixture, phase))

    assert health(gpu) == expected
    assert len(instances) == (5 if fixture == "h200_mig" else 0)
    for instance in instances:  # the parent GPU carries them
        assert health(instance) == (None, None, None, None)


def test_the_idle_bit_of_the_capture_is_never_a_throttle_reason() -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "idle")
    assert int(fake.gpus[0]["clocks_event_reasons_active"], 16) == IDLE  # as captured

    assert read_all(fake)[0].throttle_reasons == ()


def test_thermal_and_power_brake_slowdowns_are_named_in_throttle_reasons_order() -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    # Not from a capture: the power brake asserted on a hot GPU, with the bits a GPU also
    # sets that slow nothing that runs (idle, application and display clock settings).
    fake.clock_events(H100, HW_POWER_BRAKE | HW_THERMAL | IDLE | APP_CLOCKS | DISPLAY)

    assert read_all(fake)[0].throttle_reasons == ("hw_thermal_slowdown", "hw_power_brake_slowdown")


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, ()),
        (IDLE | APP_CLOCKS | DISPLAY, ()),
        (SW_POWER_CAP, ("sw_power_cap",)),
        (HW_SLOWDOWN | HW_THERMAL, ("hw_slowdown", "hw_thermal_slowdown")),
        (SYNC_BOOST | SW_THERMAL, ("sw_thermal_slowdown", "sync_boost")),
        (0x1FF, THROTTLE_REASONS),
        (0xFFFFFFFFFFFFFFFF, THROTTLE_REASONS),  # bits of later drivers are not named
    ],
)
def test_clock_event_bitmask_to_names(mask: int, names: tuple[str, ...]) -> None:
    assert throttle_reasons(mask) == names


@pytest.mark.parametrize(
    "error", [pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound]
)
@pytest.mark.parametrize("call", HEALTH_CALLS)
def test_an_unsupported_health_call_is_none_and_the_rest_is_read(
    call: str, error: type[pynvml.NVMLError]
) -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    fake.gpus[0]["retired_pages_pending"] = False  # so that every reading starts known
    fake.fail(H100, call, error)
    if call == "nvmlDeviceGetCurrentClocksEventReasons":  # no fallback to take either
        fake.fail(H100, "nvmlDeviceGetCurrentClocksThrottleReasons", error)

    (gpu,) = read_all(fake)

    readings = dict(zip(HEALTH_CALLS, health(gpu), strict=True))
    assert readings.pop(call) is None
    assert None not in readings.values()
    assert gpu.power_w is not None  # the GPU's other readings are all there


def test_another_health_call_error_skips_the_gpu_like_any_other_call() -> None:
    fake = node(("h100_80gb_hbm3", "load", H100), ("l40s", "load", GPU1))
    fake.fail(H100, "nvmlDeviceGetPcieReplayCounter", pynvml.NVMLError_Unknown)

    result = NvmlReader(fake).read()

    assert result.errors == (f"GPU 0 {H100}: Unknown Error",)
    assert [d.uuid for d in result.devices] == [GPU1]


def test_a_driver_before_535_is_asked_the_older_name_once_it_said_function_not_found() -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    fake.clock_events_v2 = False
    fake.clock_events(H100, SW_THERMAL)
    reader = NvmlReader(fake)

    first, second = reader.read().devices[0], reader.read().devices[0]

    assert first.throttle_reasons == second.throttle_reasons == ("sw_thermal_slowdown",)
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 2
    assert fake.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 0  # refused: no entry


class OldPynvml:
    """A pynvml from before 12.535: no `nvmlDeviceGetCurrentClocksEventReasons` at all."""

    def __init__(self, fake: RecordedNvml) -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        return getattr(self._fake, name)


def test_a_pynvml_without_the_newer_name_reads_throttle_reasons() -> None:
    fake = RecordedNvml.of("l40s", "load")
    fake.clock_events(H100, HW_SLOWDOWN | SW_POWER_CAP)

    gpu = NvmlReader(cast(NvmlApi, OldPynvml(fake))).read().devices[0]

    assert gpu.throttle_reasons == ("sw_power_cap", "hw_slowdown")
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 1


def test_health_is_one_call_each_per_physical_gpu_per_read() -> None:
    fake = node(
        ("h100_80gb_hbm3", "load", H100), ("l40s", "load", GPU1), ("h200_mig", "load", GPU2)
    )
    reader = NvmlReader(fake)

    for _ in range(2):
        assert len(reader.read().devices) == 3 + 5

    for call in HEALTH_CALLS:
        assert fake.calls.count(call) == 2 * 3, call  # never on the 5 MIG devices
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" not in fake.calls
    assert "nvmlDeviceGetGpuInstanceId" not in fake.calls  # only when an Xid names one


def test_remapping_and_retirement_as_a_failing_gpu_reports_them() -> None:
    fake = RecordedNvml.of("h100_80gb_hbm3", "load")
    # Not from a capture: a DBE remapped (pending until reset) and a remapping that failed;
    # pages pending retirement as a GPU before Ampere reports them.
    fake.gpus[0]["remapped_rows"] = {
        "correctable": 2,
        "uncorrectable": 1,
        "pending": 1,
        "failure": 1,
    }
    fake.gpus[0]["retired_pages_pending"] = True

    (gpu,) = read_all(fake)

    assert gpu.remapped_rows == RemappedRows(
        correctable=2, uncorrectable=1, pending=True, failed=True
    )
    assert gpu.retired_pages_pending is True


def mig_reader(phase: str = "load") -> tuple[RecordedNvml, NvmlReader]:
    fake = RecordedNvml.of("h200_mig", phase)
    reader = NvmlReader(fake)
    reader.read()  # registers the GPU for Xid events
    return fake, reader


def xids(reader: NvmlReader) -> dict[str, tuple[int, ...]]:
    result = reader.read()
    assert result.errors == ()
    return {d.uuid: d.xid_errors for d in result.devices}


def test_an_xid_of_a_mig_instance_lands_on_that_instance() -> None:
    fake, reader = mig_reader()
    fake.xid(MIG[3], 31)  # GPU instance 9, compute instance 0: the first 1g.18gb

    assert xids(reader) == {H100: (), MIG[0]: (), MIG[1]: (), MIG[2]: (), MIG[3]: (31,), MIG[4]: ()}
    assert set(xids(reader).values()) == {()}  # reported once


def test_an_xid_of_one_compute_instance_lands_on_it_alone() -> None:
    fake, reader = mig_reader()
    fake.xid(MIG[1], 13)  # GPU instance 2 has two compute instances (1c and 2c); CI 1

    found = xids(reader)

    assert (found[MIG[0]], found[MIG[1]], found[H100]) == ((), (13,), ())


def test_an_xid_of_a_whole_gpu_instance_lands_on_each_of_its_compute_instances() -> None:
    fake, reader = mig_reader()
    fake.xid(MIG[0], 43, compute_instance=False)  # GPU instance 2, no compute instance named

    found = xids(reader)

    assert (found[MIG[0]], found[MIG[1]], found[MIG[2]], found[H100]) == ((43,), (43,), (), ())


def test_xids_of_the_gpu_and_of_an_instance_in_one_read() -> None:
    fake, reader = mig_reader("idle")
    fake.xid(H100, 79)
    fake.xid(MIG[4], 31)
    fake.xid(H100, 48)

    found = xids(reader)

    assert found[H100] == (79, 48)
    assert found[MIG[4]] == (31,)
    assert fake.calls.count("nvmlDeviceGetGpuInstanceId") == 5  # once per MIG device
    assert fake.calls.count("nvmlDeviceGetComputeInstanceId") == 1  # of GI 10's device alone


def test_an_xid_of_an_instance_no_longer_there_stays_on_the_gpu() -> None:
    fake, reader = mig_reader()
    kind = pynvml.nvmlEventTypeXidCriticalError
    fake.events.append(Event(Handle(0), kind, 43, 5, NO_INSTANCE))  # GI 5: destroyed meanwhile

    assert xids(reader)[H100] == (43,)


def test_an_xid_of_an_instance_that_cannot_be_read_stays_on_the_gpu() -> None:
    fake, reader = mig_reader()
    fake.fail(MIG[3], "nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLError_Unknown)
    fake.xid(MIG[3], 31)

    result = reader.read()

    assert result.errors == (f"GPU 0 {MIG[3]}: Unknown Error",)
    assert {d.uuid: d.xid_errors for d in result.devices}[H100] == (31,)


def test_a_failing_instance_id_call_leaves_the_xid_on_the_gpu_and_the_instance_read() -> None:
    fake, reader = mig_reader()
    fake.fail(MIG[3], "nvmlDeviceGetGpuInstanceId", pynvml.NVMLError_Unknown)
    fake.xid(MIG[3], 31)

    found = xids(reader)

    assert (found[H100], found[MIG[3]]) == ((31,), ())
