"""Simulated GPUs whose readings follow a workload model: the node agent's `--backend sim`."""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from producers.base.ports import DeviceReading, ProcessReading, ReadResult
from schemas.ids import GpuUuid
from schemas.nvml_sample import THROTTLE_REASONS, RemappedRows

__all__ = ["GPU_MODELS", "SimGpu", "SimReader", "SimWorkload", "WorkloadKind"]

log = logging.getLogger(__name__)

MIB = 1 << 20
CONTEXT_OVERHEAD_BYTES = 8 * MIB  # used but in no process's figure: H100 20 MiB/3, L40S 16 MiB/2
MEM_UTIL_PER_SM = 0.3  # memory-controller busy per SM busy; gpu_burn shows 0.11, training more
TEMP_IDLE_C, TEMP_FULL_C = 40, 65  # H100 capture: 41 C idle, 59-65 C at 100 %
INFERENCE_PEAK_S = 15 * 3600.0  # daily load peaks at 15:00 UTC, trough 12 h later
INFERENCE_FLOOR = 0.15  # night load as a share of the peak
BACKOFF_START_S, BACKOFF_MAX_S = 10.0, 300.0  # kubelet CrashLoopBackOff: 10 s doubling to 5 min
DEV_BUSY_SHARE = 0.3  # a dev pod runs kernels about a third of the time: edit, run, read
DEV_PERIOD_S = (120.0, 300.0)  # one edit-run-read cycle of a developer
HOT_C = 88  # thermal slowdown: the H100 capture's T.Limit is 0 at 85-87 C, slowdown at -2
THERMAL = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})
XID_FALLEN_OFF_THE_BUS = 79
XID_DBE = 48  # a double-bit ECC error
NO_ROWS_REMAPPED = RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=False)

WorkloadKind = Literal["training", "inference", "notebook", "idle", "crashloop", "dev"]
PEAK_PCT = {
    "training": (85.0, 98.0),
    "inference": (55.0, 80.0),
    "crashloop": (5.0, 30.0),
    "dev": (20.0, 60.0),
}


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Product figures from the recorded captures (total memory as nvidia-smi reports it)."""

    name: str
    mem_total_bytes: int
    power_idle_w: float
    power_max_w: float


GPU_MODELS = {
    "h100": GpuModel("NVIDIA H100 80GB HBM3", 81559 * MIB, 70.0, 700.0),
    "h200": GpuModel("NVIDIA H200", 143771 * MIB, 78.0, 700.0),
    "l40s": GpuModel("NVIDIA L40S", 46068 * MIB, 37.0, 350.0),
}


@dataclass(frozen=True, slots=True)
class SimGpu:
    """A GPU, or a MIG instance of one when `parent_uuid` is set (its power is the parent's)."""

    uuid: str
    index: int
    model: str
    mem_total_bytes: int
    power_idle_w: float
    power_max_w: float
    parent_uuid: str | None = None
    mig_profile: str | None = None
    mps: bool = False
    """An MPS daemon serves it: its processes are MPS clients (`DeviceReading.mps`)."""

    @classmethod
    def preset(cls, model: str, uuid: str, index: int) -> SimGpu:
        """A whole GPU of a `GPU_MODELS` product."""
        m = GPU_MODELS[model]
        return cls(uuid, index, m.name, m.mem_total_bytes, m.power_idle_w, m.power_max_w)


@dataclass(frozen=True, slots=True)
class SimWorkload:
    """One process on one GPU or MIG instance.

    training: ~85-98 % with a data-loader pause to ~0 for 2-6 s every 40-90 s; inference: a
    daily curve peaking at 15:00 UTC; notebook and idle: memory held, 0 %; crashloop: runs
    15-45 s, exits, and is back after the kubelet's back-off (10 s doubling to 300 s); dev:
    bursts of 20-60 % for DEV_BUSY_SHARE of a 2-5 minute cycle, 0 % in between.
    """

    pid: int
    gpu_uuid: str
    kind: WorkloadKind
    mem_bytes: int
    start_s: float | None = None
    """Wall time the process starts; None: when it is added."""
    peak_util_pct: float | None = None
    """Training plateau, inference daily peak, crashloop level while up; None: drawn."""
    up_s: float | None = None
    """crashloop: seconds up before each crash; None: drawn (15-45 s)."""

    def __post_init__(self) -> None:
        if self.kind not in get_args(WorkloadKind) or self.mem_bytes < 0:
            raise ValueError(f"unknown workload kind {self.kind!r} or negative memory")


@dataclass(frozen=True, slots=True)
class _Health:
    """A device's health readings (None: not reported) and whether it reads HOT_C."""

    throttle: tuple[str, ...] | None = ()
    dbe: int | None = 0
    rows: RemappedRows | None = NO_ROWS_REMAPPED
    replays: int | None = 0
    hot: bool = False


HEALTHY = _Health()
HEALTHY_MIG = _Health(rows=None)  # a GPU in MIG mode: Remapped Rows N/A, as captured
NO_HEALTH = _Health(throttle=None, dbe=None, rows=None, replays=None)  # a MIG instance


@dataclass(slots=True)
class _Run:
    """A workload with the parameters drawn for it when it was added."""

    w: SimWorkload
    start: float
    peak: float
    period: float  # training: pause cycle; crashloop: time up before each crash
    pause: float
    phase: float


class SimReader:
    """A `GpuReader` over simulated GPUs: deterministic for a seed and the times `now` returns.

    Utilization is the sum of the processes' SM% (scaled to 100 when they ask more, as time-
    slicing shares); power and temperature follow it. Used memory: the processes' plus
    CONTEXT_OVERHEAD_BYTES each. MIG instances report utilization and per-process memory and
    SM% as None, as drivers do; the parent has their memory, and power by their activity.

    Health, as the recorded H100, H200 and L40S report it: no throttle reason, no row
    remapped, no retired-pages reading (these GPUs remap rows instead), no PCIe replay; a GPU
    in MIG mode reports no remapped rows (N/A under MIG), its instances none of the four.
    Faults change that: `set_throttle`, `inject_ecc`, `fail_remap`, `inject_xid` (an Xid 79
    also loses the GPU after the read that reports it), `set_lost`.
    """

    def __init__(
        self,
        gpus: Iterable[SimGpu],
        workloads: Iterable[SimWorkload] = (),
        *,
        seed: int = 0,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._now = now
        self._rng = random.Random(seed)
        self._gpus = {gpu.uuid: gpu for gpu in gpus}
        self._children: dict[str, list[SimGpu]] = {}
        for gpu in self._gpus.values():
            if gpu.parent_uuid is not None:
                self._children.setdefault(gpu.parent_uuid, []).append(gpu)
        if unknown := set(self._children) - set(self._gpus):
            raise ValueError(f"MIG instances of unknown GPUs {sorted(unknown)}")
        self._roots = [gpu for gpu in self._gpus.values() if gpu.parent_uuid is None]
        self._runs: dict[str, list[_Run]] = {uuid: [] for uuid in self._gpus}
        self._idle: dict[str, DeviceReading] = {}
        self._pids: dict[int, _Run] = {}
        self._xids: dict[str, list[int]] = {}
        self._lost: set[str] = set()
        self._falling: set[str] = set()  # lost after the read that reports their Xid 79
        self._health = {uuid: self._healthy(gpu) for uuid, gpu in self._gpus.items()}
        for workload in workloads:
            self.add_workload(workload)

    def add_workload(self, w: SimWorkload) -> None:
        """Start a process; ValueError if the pid is taken, the GPU unknown or out of memory."""
        gpu = self._gpus.get(w.gpu_uuid)
        if w.pid in self._pids or gpu is None or gpu.uuid in self._children:
            raise ValueError(f"pid {w.pid} runs already, or {w.gpu_uuid} cannot run processes")
        runs = self._runs[gpu.uuid]
        held = sum(r.w.mem_bytes for r in runs) + (len(runs) + 1) * CONTEXT_OVERHEAD_BYTES
        if held + w.mem_bytes > gpu.mem_total_bytes:
            raise ValueError(f"pid {w.pid} does not fit in the memory of {gpu.uuid}")
        rng = self._rng
        low, high = PEAK_PCT.get(w.kind, (0.0, 0.0))
        if w.kind == "crashloop":
            period = rng.uniform(15.0, 45.0)
            period = period if w.up_s is None else w.up_s
        elif w.kind == "dev":
            period = rng.uniform(*DEV_PERIOD_S)
        else:
            period = rng.uniform(40.0, 90.0)
        cyclic = w.kind in ("training", "dev")
        run = _Run(
            w=w,
            start=self._now() if w.start_s is None else w.start_s,
            peak=rng.uniform(low, high) if w.peak_util_pct is None else w.peak_util_pct,
            period=period,
            pause=rng.uniform(2.0, 6.0),
            phase=rng.uniform(0.0, period) if cyclic else rng.uniform(-1, 1) * 3600,
        )
        runs.append(run)
        self._pids[w.pid] = run
        log.debug("sim workload started pid=%d gpu=%s kind=%s", w.pid, w.gpu_uuid, w.kind)

    def remove_workload(self, pid: int) -> bool:
        """Stop a process; False if no such pid runs."""
        run = self._pids.pop(pid, None)
        if run is not None:
            self._runs[run.w.gpu_uuid].remove(run)
        return run is not None

    def inject_xid(self, uuid: str, code: int) -> None:
        """An Xid on a physical GPU, reported by the next read. Xid 79 (fallen off the bus):
        the GPU is lost from the read after that, until `set_lost(uuid, False)`."""
        self._xids.setdefault(uuid, []).append(code)
        if code == XID_FALLEN_OFF_THE_BUS:
            self._falling.add(uuid)

    def set_lost(self, uuid: str, lost: bool = True) -> None:
        """A lost GPU is left out of reads with an error line, as NvmlReader does."""
        if lost:
            self._lost.add(uuid)
        else:
            self._lost.discard(uuid)
            self._falling.discard(uuid)

    def set_throttle(self, uuid: str, reason: str, active: bool = True) -> None:
        """A clock event reason (THROTTLE_REASONS) of a physical GPU starts or ends; in a
        thermal slowdown the GPU reads HOT_C. Its utilization stays what the work makes it:
        slower clocks make kernels run longer, not the GPU less busy."""
        if reason not in THROTTLE_REASONS:
            raise ValueError(f"unknown throttle reason {reason!r} (known: {THROTTLE_REASONS})")
        health = self._health_of(uuid)
        now = set(health.throttle or ())
        now = now | {reason} if active else now - {reason}
        throttle = tuple(r for r in THROTTLE_REASONS if r in now)
        self._set_health(
            uuid, dataclasses.replace(health, throttle=throttle, hot=bool(now & THERMAL))
        )

    def inject_ecc(self, uuid: str) -> None:
        """A double-bit ECC error on a physical GPU: Xid 48 on the next read; the volatile
        DBE count one higher and (not in MIG mode) a row remapped for it, pending a reset,
        from then on."""
        health = self._health_of(uuid)
        rows = health.rows
        if rows is not None:  # None: in MIG mode, no remapped rows to show it
            rows = RemappedRows(
                correctable=rows.correctable,
                uncorrectable=rows.uncorrectable + 1,
                pending=True,
                failed=rows.failed,
            )
        dbe = (health.dbe or 0) + 1
        self._set_health(uuid, dataclasses.replace(health, dbe=dbe, rows=rows))
        self.inject_xid(uuid, XID_DBE)

    def fail_remap(self, uuid: str) -> None:
        """A row remapping of a physical GPU failed: `remapped_rows.failed` from then on (a
        GPU in MIG mode reports no remapped rows, so nothing shows)."""
        health = self._health_of(uuid)
        rows = health.rows
        if rows is not None:  # None: in MIG mode, no remapped rows to show it
            rows = RemappedRows(
                correctable=rows.correctable,
                uncorrectable=rows.uncorrectable,
                pending=rows.pending,
                failed=True,
            )
            self._set_health(uuid, dataclasses.replace(health, rows=rows))

    def _healthy(self, gpu: SimGpu) -> _Health:
        """What a device reports before any fault."""
        if gpu.parent_uuid is not None:
            return NO_HEALTH
        return HEALTHY_MIG if gpu.uuid in self._children else HEALTHY

    def _health_of(self, uuid: str) -> _Health:
        gpu = self._gpus.get(uuid)
        if gpu is None or gpu.parent_uuid is not None:
            raise ValueError(f"{uuid} is not a physical GPU of this node")
        return self._health[uuid]

    def _set_health(self, uuid: str, health: _Health) -> None:
        self._health[uuid] = health
        self._idle.pop(uuid, None)  # an idle GPU's cached reading is stale now

    def close(self) -> None:
        """Nothing to release."""

    def read(self) -> ReadResult:
        """Every GPU and MIG instance at `now()`."""
        t = self._now()
        devices: list[DeviceReading] = []
        errors: list[str] = []
        for gpu in self._roots:
            if gpu.uuid in self._lost:
                errors.append(f"GPU {gpu.index} {gpu.uuid}: GPU is lost")
                continue
            instances = self._children.get(gpu.uuid)
            if instances is None:
                devices.append(self._whole(gpu, t))
                continue
            readings = [self._instance(instance, t) for instance in instances]
            busy = sum(u * i.mem_total_bytes for (_, u), i in zip(readings, instances, strict=True))
            used = sum(r.mem_used_bytes for r, _ in readings)
            devices.append(self._reading(gpu, busy / gpu.mem_total_bytes, (), used))
            devices.extend(r for r, _ in readings)
        if self._falling:  # their Xid 79 is read: lost from the next read on
            self._lost |= self._falling
            self._falling.clear()
        return ReadResult(devices=tuple(devices), errors=tuple(errors))

    def _running(self, gpu: SimGpu, t: float) -> tuple[list[tuple[int, int, float]], float, int]:
        """(pid, memory, SM%) of the processes running at `t`, their SM% sum and used memory."""
        running: list[tuple[int, int, float]] = []
        total, used = 0.0, 0
        for run in self._runs[gpu.uuid]:
            sm = self._sm(run, t)
            if sm is not None:
                running.append((run.w.pid, run.w.mem_bytes, sm))
                total += sm
                used += run.w.mem_bytes + CONTEXT_OVERHEAD_BYTES
        return running, total, used

    def _whole(self, gpu: SimGpu, t: float) -> DeviceReading:
        if not self._runs[gpu.uuid] and gpu.uuid not in self._xids:
            if gpu.uuid not in self._idle:  # an idle GPU reads the same every tick
                self._idle[gpu.uuid] = self._reading(gpu, 0.0, (), 0)
            return self._idle[gpu.uuid]
        running, total, used = self._running(gpu, t)
        scale = 100.0 / total if total > 100.0 else 1.0  # time-slicing shares one device
        processes = tuple([ProcessReading(pid, mem, sm * scale) for pid, mem, sm in running])
        return self._reading(gpu, min(total, 100.0), processes, used)

    def _instance(self, gpu: SimGpu, t: float) -> tuple[DeviceReading, float]:
        """A MIG instance's reading, and its true utilization (%) for the parent's power."""
        running, total, used = self._running(gpu, t)
        processes = tuple([ProcessReading(pid, None, None) for pid, _, _ in running])
        util = min(100.0, total)
        return self._reading(gpu, util, processes, used), util

    def _reading(
        self, gpu: SimGpu, util: float, processes: tuple[ProcessReading, ...], used: int
    ) -> DeviceReading:
        """A GPU or MIG instance at `util` %. Under MIG utilization is N/A, as drivers report
        it; an instance's power, temperature, Xids and ECC are its parent's."""
        instance = gpu.parent_uuid is not None
        mig = instance or gpu.uuid in self._children
        power_w = gpu.power_idle_w + (gpu.power_max_w - gpu.power_idle_w) * util / 100.0
        health = self._health[gpu.uuid]
        temp_c = (
            HOT_C
            if health.hot
            else int(TEMP_IDLE_C + (TEMP_FULL_C - TEMP_IDLE_C) * util / 100.0 + 0.5)
        )
        return DeviceReading(
            uuid=GpuUuid(gpu.uuid),
            index=gpu.index,
            model=gpu.model,
            parent_uuid=GpuUuid(gpu.parent_uuid) if gpu.parent_uuid else None,
            mig_profile=gpu.mig_profile if instance else None,
            mig_enabled=mig,
            util_pct=None if mig else util,
            mem_util_pct=None if mig else util * MEM_UTIL_PER_SM,
            mem_used_bytes=used,
            mem_total_bytes=gpu.mem_total_bytes,
            power_w=None if instance else power_w,
            temp_c=None if instance else temp_c,
            xid_errors=() if instance else tuple(self._xids.pop(gpu.uuid, ())),
            ecc_dbe=health.dbe,
            processes=processes,
            mps=gpu.mps and bool(processes),
            throttle_reasons=health.throttle,
            remapped_rows=health.rows,
            pcie_replays=health.replays,  # retired_pages_pending: None, rows are remapped
        )

    def _sm(self, run: _Run, t: float) -> float | None:
        """SM% of a process at `t`; None while it is not running."""
        elapsed = t - run.start
        if elapsed < 0:
            return None
        kind, noise = run.w.kind, self._rng.random()
        if kind == "training":
            if (elapsed + run.phase) % run.period < run.pause:
                return noise * 2.0  # data-loader pause
            return min(100.0, run.peak + noise * 4.0 - 2.0)
        if kind == "inference":
            wave = (1.0 + math.cos(2 * math.pi * (t - INFERENCE_PEAK_S + run.phase) / 86_400.0)) / 2
            load = INFERENCE_FLOOR + (1.0 - INFERENCE_FLOOR) * wave
            return max(0.0, min(100.0, run.peak * load + noise * 6.0 - 3.0))
        if kind == "crashloop":
            return run.peak * noise if _crashloop_up(elapsed, run.period) else None
        if kind == "dev":
            if (elapsed + run.phase) % run.period < run.period * DEV_BUSY_SHARE:
                return run.peak * (0.5 + noise / 2)
            return 0.0
        return 0.0  # notebook, idle: memory held, no kernels


def _crashloop_up(elapsed: float, up_s: float) -> bool:
    """Whether a process that crashes after `up_s` each time runs `elapsed` s after its start."""
    backoff = BACKOFF_START_S
    while backoff < BACKOFF_MAX_S:
        if elapsed < up_s:
            return True
        elapsed -= up_s + backoff
        if elapsed < 0:
            return False
        backoff *= 2
    return elapsed % (up_s + BACKOFF_MAX_S) < up_s
