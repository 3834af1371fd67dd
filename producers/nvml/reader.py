"""The NVML GPU reader: every GPU and MIG instance of the node, read through nvidia-ml-py."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Final, NamedTuple, ParamSpec, TypeVar

import pynvml

from producers.base.ports import DeviceReading, ProcessReading, ReadResult
from producers.nvml.api import NvmlApi, Utilization
from schemas.ids import GpuUuid
from schemas.nvml_sample import THROTTLE_REASONS, RemappedRows

__all__ = ["NvmlReader", "NvmlUnavailable", "Xid", "mig_profile_name", "throttle_reasons"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

MIB = 1 << 20
GIB = 1 << 30
NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory of an older pynvml that does not map it
MAX_EVENTS_PER_READ = 256  # bound the Xid drain per tick; a storm's rest comes next tick
_UNSUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
NO_INSTANCE = 0xFFFFFFFF  # an event's GPU/compute instance id when it is for the whole GPU
# The clock event bits, by the names of THROTTLE_REASONS. pynvml 12.535+ also calls them
# nvmlClocksEventReason*; the older names are the same bits and every pynvml has them.
_REASON_BIT: Final = {
    "sw_power_cap": pynvml.nvmlClocksThrottleReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksThrottleReasonHwSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
    "sw_thermal_slowdown": pynvml.nvmlClocksThrottleReasonSwThermalSlowdown,
    "sync_boost": pynvml.nvmlClocksThrottleReasonSyncBoost,
}
_REASON_BITS: Final = tuple((name, _REASON_BIT[name]) for name in THROTTLE_REASONS)


class Xid(NamedTuple):
    """An Xid event: its code and the GPU / compute instance it names (NO_INSTANCE: none)."""

    code: int
    gpu_instance: int = NO_INSTANCE
    compute_instance: int = NO_INSTANCE


def throttle_reasons(mask: int) -> tuple[str, ...]:
    """The THROTTLE_REASONS active in a clock event bitmask, in THROTTLE_REASONS order;
    idle, application and display clock settings are never named."""
    return tuple([name for name, bit in _REASON_BITS if mask & bit])


class NvmlUnavailable(Exception):  # noqa: N818 - the name the agent and its users read
    """NVML could not start: no NVIDIA driver or library on this machine."""


def mig_profile_name(gi_slices: int, ci_slices: int, memory_mib: int, gpu_memory_bytes: int) -> str:
    """The MIG profile as nvidia-smi names it: `1g.18gb`, or `1c.3g.71gb` for a compute instance.

    The memory in the name is the instance's share of the GPU rounded up to eighths, times the
    GPU's memory in GiB rounded up, rounded half up (the rule of nvidia-smi and the device
    plugin): an H200 1g instance, 16384 MiB of 143771 MiB, is 1/8 * 141 = 17.6 -> `18gb`.
    """
    eighths = math.ceil(memory_mib * MIB * 8 / gpu_memory_bytes)
    gpu_gib = -(-gpu_memory_bytes // GIB)
    gb = math.floor(eighths * gpu_gib / 8 + 0.5)
    if ci_slices == gi_slices:
        return f"{gi_slices}g.{gb}gb"
    return f"{ci_slices}c.{gi_slices}g.{gb}gb"


def _supported(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """`fn(...)`, or None where the driver does not support it; other NVML errors propagate."""
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as err:
        if err.value in _UNSUPPORTED:
            return None
        raise


class NvmlReader:
    """Reads all GPUs and MIG instances through NVML; one per agent process.

    - Unsupported (NotSupported; FunctionNotFound on older drivers) is None. Any other NVML
      error skips that device or MIG instance this tick: `GPU <index> <uuid>: <error>`.
    - MIG on: the physical GPU is an entry (`mig_enabled`, no parent, no processes) with the
      whole GPU's power, temperature, ECC, health readings, Xids and memory; each MIG device
      an entry with `parent_uuid`, profile, memory, processes. Node totals: the entries
      without a parent.
    - Health, one call each per physical GPU per read: the active clock event reasons
      (THROTTLE_REASONS; `GetCurrentClocksThrottleReasons` on a driver or pynvml without
      `GetCurrentClocksEventReasons`), remapped rows, pages pending retirement, PCIe replays.
      MIG instances carry None for all four.
    - Xids are drained from one event set each read (without waiting) and reported once, on
      the physical GPU; where the GPU is in MIG mode and the event names a GPU instance (and
      maybe a compute instance), on the MIG devices of that instance instead.
    - Process SM%: mean of the driver's samples since the last read. A running process with
      no sample, or all when the driver says NotFound (no samples), is 0.0 where the device's
      utilization is known, else None; NotSupported (MIG) leaves all None.
    """

    def __init__(self, api: NvmlApi | None = None) -> None:
        """Start NVML; raises NvmlUnavailable where there is no driver."""
        # The pynvml module itself fits the Protocol (it has no stubs: Any to mypy).
        self._api: NvmlApi = api if api is not None else pynvml
        try:
            self._api.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(
                f"NVML unavailable ({err}): no usable NVIDIA driver here; use --backend sim"
            ) from err
        self._closed = False
        self._last_seen_us: dict[str, int] = {}
        self._uuid_by_index: dict[int, str] = {}
        self._xid_registered: set[str] = set()
        self._logged: set[str] = set()
        self._events: object | None = None
        # pynvml before 12.535 has only the older name; a driver before 535 answers
        # FunctionNotFound to the newer one (then `_clock_events` drops it).
        self._event_reasons: Callable[[object], int] | None = getattr(
            self._api, "nvmlDeviceGetCurrentClocksEventReasons", None
        )
        try:
            self._events = self._api.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            log.info("nvml xid events unavailable error=%r", str(err))

    def read(self) -> ReadResult:
        """Read every device now; a failing device is an error line, never an exception."""
        errors: list[str] = []
        xids = self._drain_xids()
        try:
            count = self._api.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            self._log_once("nvml device count failed error=%r", str(err))
            return ReadResult(devices=(), errors=(f"nvmlDeviceGetCount: {err}",))
        devices: list[DeviceReading] = []
        for index in range(count):
            self._read_gpu(index, xids, devices, errors)
        return ReadResult(devices=tuple(devices), errors=tuple(errors))

    def close(self) -> None:
        """Free the event set and shut NVML down; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._events is not None:
                self._api.nvmlEventSetFree(self._events)
            self._api.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("nvml shutdown failed error=%r", str(err))

    def _read_gpu(
        self, index: int, xids: dict[str, list[Xid]], out: list[DeviceReading], errors: list[str]
    ) -> None:
        api = self._api
        uuid = self._uuid_by_index.get(index, "?")  # a lost GPU is named as last seen
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
            uuid = self._uuid_by_index[index] = api.nvmlDeviceGetUUID(handle)
            events = xids.get(uuid, [])
            self._register_xids(handle, uuid)
            mode = _supported(api.nvmlDeviceGetMigMode, handle)
            mig = mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            gpu = self._physical(handle, index, uuid, mig, tuple(x.code for x in events))
            slots = api.nvmlDeviceGetMaxMigDeviceCount(handle) if mig else 0
        except pynvml.NVMLError as err:
            self._fail(errors, index, uuid, err)
            return
        at = len(out)
        out.append(gpu)
        # Xids naming a MIG instance go to its MIG devices; the GPU keeps the rest.
        placed: set[int] = set()
        pending = [i for i, x in enumerate(events) if x.gpu_instance != NO_INSTANCE]
        for slot in range(slots):
            mig_uuid = "?"
            try:
                mig_handle = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                mig_uuid = api.nvmlDeviceGetUUID(mig_handle)
                mine = self._instance_xids(mig_handle, events, pending) if pending else []
                codes = tuple(events[i].code for i in mine)
                out.append(self._instance(mig_handle, mig_uuid, gpu, codes))
                placed.update(mine)
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_NOT_FOUND:  # NotFound: an empty slot
                    self._fail(errors, index, mig_uuid, err)
        if placed:
            rest = tuple(x.code for i, x in enumerate(events) if i not in placed)
            out[at] = dataclasses.replace(gpu, xid_errors=rest)

    def _instance_xids(self, handle: object, events: list[Xid], pending: list[int]) -> list[int]:
        """Which of `events` (indices in `pending`) name this MIG device's GPU instance and,
        where an event names one, its compute instance. Asked only when such events wait."""
        gi = self._instance_id(self._api.nvmlDeviceGetGpuInstanceId, handle)
        mine = [i for i in pending if events[i].gpu_instance == gi]
        if any(events[i].compute_instance != NO_INSTANCE for i in mine):
            ci = self._instance_id(self._api.nvmlDeviceGetComputeInstanceId, handle)
            mine = [i for i in mine if events[i].compute_instance in (NO_INSTANCE, ci)]
        return mine

    def _instance_id(self, call: Callable[[object], int], handle: object) -> int | None:
        """A MIG device's GPU or compute instance id; None (matches no event) on an error."""
        try:
            return call(handle)
        except pynvml.NVMLError as err:
            self._log_once("nvml mig instance id failed error=%r", str(err))
            return None

    def _physical(
        self, handle: object, index: int, uuid: str, mig: bool, xids: tuple[int, ...]
    ) -> DeviceReading:
        api = self._api
        used, total = self._memory(handle)
        util = _supported(api.nvmlDeviceGetUtilizationRates, handle)
        power_mw = _supported(api.nvmlDeviceGetPowerUsage, handle)
        # Under MIG the processes belong to the instances; listing them here counts twice.
        processes, mps = ((), False) if mig else self._processes(handle, uuid, util)
        return DeviceReading(
            uuid=GpuUuid(uuid),
            index=index,
            model=api.nvmlDeviceGetName(handle),
            parent_uuid=None,
            mig_profile=None,
            mig_enabled=mig,
            util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            mem_used_bytes=used,
            mem_total_bytes=total,
            power_w=None if power_mw is None else power_mw / 1000.0,
            temp_c=_supported(api.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            xid_errors=xids,
            ecc_dbe=_supported(
                api.nvmlDeviceGetTotalEccErrors,
                handle,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            ),
            processes=processes,
            mps=mps,
            throttle_reasons=self._throttle_reasons(handle),
            remapped_rows=self._remapped_rows(handle),
            retired_pages_pending=self._retired_pages_pending(handle),
            pcie_replays=_supported(api.nvmlDeviceGetPcieReplayCounter, handle),
        )

    def _throttle_reasons(self, handle: object) -> tuple[str, ...] | None:
        mask = self._clock_events(handle)
        return None if mask is None else throttle_reasons(mask)

    def _clock_events(self, handle: object) -> int | None:
        """The clock event bitmask; the older call once the newer is missing (one call)."""
        if self._event_reasons is not None:
            try:
                return self._event_reasons(handle)
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    if err.value in _UNSUPPORTED:
                        return None
                    raise
                self._event_reasons = None  # a driver before 535: the older name from now on
        return _supported(self._api.nvmlDeviceGetCurrentClocksThrottleReasons, handle)

    def _remapped_rows(self, handle: object) -> RemappedRows | None:
        rows = _supported(self._api.nvmlDeviceGetRemappedRows, handle)
        if rows is None:
            return None
        correctable, uncorrectable, pending, failed = rows
        return RemappedRows(
            correctable=correctable,
            uncorrectable=uncorrectable,
            pending=bool(pending),
            failed=bool(failed),
        )

    def _retired_pages_pending(self, handle: object) -> bool | None:
        pending = _supported(self._api.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        return None if pending is None else pending == pynvml.NVML_FEATURE_ENABLED

    def _instance(
        self, handle: object, uuid: str, gpu: DeviceReading, xids: tuple[int, ...]
    ) -> DeviceReading:
        api = self._api
        a = _supported(api.nvmlDeviceGetAttributes, handle)
        used, total = self._memory(handle)
        util = _supported(api.nvmlDeviceGetUtilizationRates, handle)
        slices = (a.gpuInstanceSliceCount, a.computeInstanceSliceCount) if a else (0, 0)
        profile = mig_profile_name(*slices, a.memorySizeMB, gpu.mem_total_bytes) if a else None
        processes, mps = self._processes(handle, uuid, util)
        return DeviceReading(
            uuid=GpuUuid(uuid),
            index=gpu.index,
            model=gpu.model,  # the product, for prices; the slice is in mig_profile
            parent_uuid=gpu.uuid,
            mig_profile=profile,
            mig_enabled=True,
            util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            mem_used_bytes=used,
            mem_total_bytes=total,
            power_w=None,  # the parent GPU carries power, temperature and ECC
            temp_c=None,
            xid_errors=xids,
            ecc_dbe=None,
            processes=processes,
            mps=mps,
        )

    def _memory(self, handle: object) -> tuple[int, int]:
        """(used, total) bytes; v2 leaves out the reserved memory as nvidia-smi does, v1 not."""
        memory = _supported(self._api.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
        if memory is None:
            memory = self._api.nvmlDeviceGetMemoryInfo(handle)
        return memory.used, memory.total

    def _processes(
        self, handle: object, uuid: str, util: Utilization | None
    ) -> tuple[tuple[ProcessReading, ...], bool]:
        """The compute and MPS client processes, and whether there are MPS clients."""
        api = self._api
        mem_by_pid: dict[int, int | None] = {}
        mps = _supported(api.nvmlDeviceGetMPSComputeRunningProcesses, handle) or ()
        for info in (*api.nvmlDeviceGetComputeRunningProcesses(handle), *mps):
            mem = None if info.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE else info.usedGpuMemory
            if mem_by_pid.get(info.pid) is None:
                mem_by_pid[info.pid] = mem
        if not mem_by_pid:
            return (), False
        sm_by_pid, missing = self._sm_pct(handle, uuid, util is not None)
        processes = tuple(
            ProcessReading(pid=pid, mem_bytes=mem, sm_pct=sm_by_pid.get(pid, missing))
            for pid, mem in mem_by_pid.items()
        )
        return processes, bool(mps)

    def _sm_pct(
        self, handle: object, uuid: str, util_known: bool
    ) -> tuple[dict[int, float], float | None]:
        """Mean SM% by pid since the last read, and the value of a process without a sample."""
        missing = 0.0 if util_known else None
        try:
            samples = self._api.nvmlDeviceGetProcessUtilization(
                handle, self._last_seen_us.get(uuid, 0)
            )
        except pynvml.NVMLError as err:
            if err.value == pynvml.NVML_ERROR_NOT_FOUND:  # no samples since last seen
                return {}, missing
            if err.value in _UNSUPPORTED:
                return {}, None
            raise
        totals: dict[int, tuple[float, int]] = {}
        for sample in samples:
            total, count = totals.get(sample.pid, (0.0, 0))
            totals[sample.pid] = (total + sample.smUtil, count + 1)
        if samples:
            self._last_seen_us[uuid] = max(s.timeStamp for s in samples)
        return {pid: total / count for pid, (total, count) in totals.items()}, missing

    def _register_xids(self, handle: object, uuid: str) -> None:
        """Ask for Xid events of a GPU once; a GPU without them simply reports none."""
        if self._events is None or uuid in self._xid_registered:
            return
        self._xid_registered.add(uuid)
        try:
            self._api.nvmlDeviceRegisterEvents(
                handle, pynvml.nvmlEventTypeXidCriticalError, self._events
            )
        except pynvml.NVMLError as err:
            log.info("nvml xid events not available gpu=%s error=%r", uuid, str(err))

    def _drain_xids(self) -> dict[str, list[Xid]]:
        """Xids by GPU uuid that arrived since the previous read (waits 0 ms)."""
        found: dict[str, list[Xid]] = {}
        if self._events is None:
            return found
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = self._api.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_TIMEOUT:  # Timeout: nothing (more) waiting
                    self._log_once("nvml xid wait failed error=%r", str(err))
                break
            try:
                uuid = self._api.nvmlDeviceGetUUID(event.device)
            except pynvml.NVMLError as err:
                self._log_once(
                    "nvml xid of an unknown gpu xid=%d error=%r", event.eventData, str(err)
                )
                continue
            # An older pynvml's event struct has no instance ids: the whole GPU.
            xid = Xid(
                event.eventData,
                getattr(event, "gpuInstanceId", NO_INSTANCE),
                getattr(event, "computeInstanceId", NO_INSTANCE),
            )
            found.setdefault(uuid, []).append(xid)
        return found

    def _fail(self, errors: list[str], index: int, uuid: str, err: pynvml.NVMLError) -> None:
        errors.append(f"GPU {index} {uuid}: {err}")
        self._log_once("nvml read failed gpu=%d uuid=%s error=%r", index, uuid, str(err))

    def _log_once(self, message: str, *args: object) -> None:
        """Warn about a failure the first time; a lost GPU would otherwise warn every tick."""
        key = message % args
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)
