"""The recorded-history part of `gpuwatch bench worker`: a worker far behind works hours off.

For each length of history asked (`--backlog-hours`: 6 and 24 by default, 1 and 4 with
`--quick`), on topics, an app id, consumer groups and a Redis database of its own (all
removed afterwards): 125 simulated 8-GPU nodes (25 with `--quick`) sampled every 57 s, as
the recorded production history is, over that many hours of event time ending now. One
`gpuwatch worker` process starts on the empty topics (no sink); once its group is stable
and it ticks, its RSS is the idle figure and it is paused (SIGSTOP) while the pod events
and the whole history are produced, then resumed (`gpuwatch.harness.bench.backlog`). It is done
when its group has committed every node sample.

The bench watches it as Kubernetes would (deploy/helm: /livez every 20 s, three failures
in a row restart it): a worker that exits or fails its liveness probe is started again on
the same group, and counted (`restarts`; past `MAX_RESTARTS` the part gives up). CPU is
the worker's own from /proc, all threads, every incarnation, from the resume to the last
commit; peak memory is its VmHWM (the most resident memory it had), against the idle RSS.
With a memory limit, the worker's address space is capped (RLIMIT_AS, `prlimit`) at its
idle VmPeak plus that many MB: there is no writable cgroup here, and an allocation past
the cap fails as one past a container's limit would (the process is not OOM-killed, it
sees MemoryError).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpuwatch.harness.bench import scratch
from gpuwatch.harness.bench.backlog import drain_deadline_s, produce_paused, wait_ready
from gpuwatch.harness.bench.figures import drain_rate
from gpuwatch.harness.bench.load import Fleet, build_fleet
from gpuwatch.harness.bench.probes import CommitWatcher, Offsets
from gpuwatch.harness.bench.procs import LIVENESS_FAILURES, LIVENESS_PERIOD_S, MB, WorkerProcess
from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES

__all__ = [
    "HISTORY_INTERVAL_S",
    "MAX_RESTARTS",
    "Histories",
    "HistoryRun",
    "HistorySetup",
    "Liveness",
    "bench_history",
    "format_histories",
    "history_fields",
]

HISTORY_INTERVAL_S = 57.0  # the recorded production history's sampling interval
HOUR_S = 3600
MAX_RESTARTS = 3  # a worker restarted this often will not finish: the part gives up
STALL_S = 600.0  # no commit for this long: the worker is stuck (it commits every 2.8 s)
POLL_S = 0.2  # the bench reads the worker's /proc and its group's commits this often

Say = Callable[[str], None]


@dataclass(frozen=True)
class HistorySetup:
    """One history to work off."""

    hours: int
    nodes: int
    gpus: int
    interval_s: float = HISTORY_INTERVAL_S
    memory_limit_mb: int | None = None
    """The worker's address space capped at its idle VmPeak plus this; None: no cap."""

    @property
    def seconds(self) -> int:
        """Seconds of event time."""
        return self.hours * HOUR_S


@dataclass(frozen=True)
class HistoryRun:
    """The figures of one history; those a failed run lacks are None."""

    hours: int
    nodes: int
    gpus_per_node: int
    interval_s: float
    messages: int
    gpu_samples: int
    finished: bool
    """Whether the worker's group committed every node sample."""
    worked_off_s: float | None
    """From the resume to the commit of the last node sample."""
    gpu_samples_per_s: float | None
    gpu_seconds_per_s: float | None
    """Event time worked off per second: GPU-samples times the interval, over the time."""
    worker_cpu_us_per_gpu_sample: float | None
    worker_cores: float | None
    idle_rss_mb: float | None
    peak_mb: float | None
    """The worker's VmHWM, the most of any incarnation."""
    peak_over_idle_mb: float | None
    end_over_idle_mb: float | None
    """VmRSS once every node sample was committed, over the idle RSS."""
    restarts: int
    """Times the worker exited or failed its liveness probe and was started again."""
    restart_causes: list[str]
    """Why, each time: its exit status and the last error its log names, or the probe."""
    address_space_limit_mb: float | None
    """The cap on the worker's address space (idle VmPeak plus the limit asked), if any."""
    error: str | None


@dataclass(frozen=True)
class Histories:
    """The histories asked for and those run (none: skipped, every field null)."""

    hours: tuple[int, ...]
    runs: dict[int, HistoryRun] = field(default_factory=dict)


class Liveness:
    """The chart's liveness probe: `LIVENESS_FAILURES` failures in a row restart the pod."""

    def __init__(self, failures: int = LIVENESS_FAILURES) -> None:
        self.failures = failures
        self.in_a_row = 0

    def restart(self, live: bool) -> bool:
        """A probe's answer; True when the worker is to be restarted now."""
        self.in_a_row = 0 if live else self.in_a_row + 1
        return self.in_a_row >= self.failures


@dataclass
class _Watch:
    """What the bench has read of the worker's incarnations so far."""

    cpu_done_s: float = 0.0
    """CPU of the incarnations that ended (each at its last reading)."""
    cpu_start_s: float = 0.0
    cpu_now_s: float = 0.0
    peak_mb: float = 0.0
    restarts: int = 0
    causes: list[str] = field(default_factory=list)

    @property
    def cpu_s(self) -> float:
        """CPU seconds of every incarnation since the resume."""
        return self.cpu_done_s + self.cpu_now_s - self.cpu_start_s

    def read(self, worker: WorkerProcess) -> bool:
        """Read its CPU and peak; False when it has exited."""
        if worker.process.poll() is not None:
            return False
        try:
            self.cpu_now_s = worker.cpu_s()
            self.peak_mb = max(self.peak_mb, worker.peak_mb())
        except (OSError, RuntimeError, ValueError, IndexError):
            return False  # exited between the poll and the reading
        return True

    def restarted(self, cause: str) -> None:
        """An incarnation ended; the next one's CPU counts from 0."""
        self.cpu_done_s += self.cpu_now_s - self.cpu_start_s
        self.cpu_start_s = self.cpu_now_s = 0.0
        self.restarts += 1
        self.causes.append(cause)


def history_run(
    setup: HistorySetup,
    gpu_samples: int,
    *,
    messages: int,
    idle_rss: float | None = None,
    watch: _Watch | None = None,
    worked_off_s: float | None = None,
    rate: float | None = None,
    end_rss: float | None = None,
    limit_bytes: int | None = None,
    error: str | None = None,
) -> HistoryRun:
    """The figures of a history from what was read; those it lacks are None."""
    finished = worked_off_s is not None and error is None
    cpu = None if watch is None or not finished else watch.cpu_s
    peak = None if watch is None or not watch.peak_mb else watch.peak_mb
    return HistoryRun(
        hours=setup.hours,
        nodes=setup.nodes,
        gpus_per_node=setup.gpus,
        interval_s=setup.interval_s,
        messages=messages,
        gpu_samples=gpu_samples,
        finished=finished,
        worked_off_s=worked_off_s if finished else None,
        gpu_samples_per_s=rate if finished else None,
        gpu_seconds_per_s=None if rate is None or not finished else rate * setup.interval_s,
        worker_cpu_us_per_gpu_sample=None if cpu is None else cpu / gpu_samples * 1e6,
        worker_cores=None if cpu is None or not worked_off_s else cpu / worked_off_s,
        idle_rss_mb=idle_rss,
        peak_mb=peak,
        peak_over_idle_mb=None if peak is None or idle_rss is None else peak - idle_rss,
        end_over_idle_mb=None if end_rss is None or idle_rss is None else end_rss - idle_rss,
        restarts=0 if watch is None else watch.restarts,
        restart_causes=[] if watch is None else list(watch.causes),
        address_space_limit_mb=None if limit_bytes is None else limit_bytes / MB,
        error=error,
    )


def bench_history(settings: Settings, redis_url: str, setup: HistorySetup, say: Say) -> HistoryRun:
    """Work one history off (see the module docstring); its figures, or its error."""
    say(
        f"history: {setup.nodes} nodes x {setup.gpus} GPUs, {setup.hours} h sampled every "
        f"{setup.interval_s:g} s"
    )
    t0 = int((time.time() - setup.seconds - 5) * 1000)
    fleet = build_fleet(
        setup.nodes, setup.gpus, setup.seconds, t0, watch=0, interval_s=setup.interval_s
    )
    gpu_samples, messages = fleet.gpu_samples, fleet.messages
    try:
        return _run_history(settings, redis_url, setup, fleet, say)
    except (RuntimeError, TimeoutError) as exc:  # the worker did not join, the broker stalled
        return history_run(setup, gpu_samples, messages=messages, error=str(exc))


def _run_history(
    settings: Settings, redis_url: str, setup: HistorySetup, fleet: Fleet, say: Say
) -> HistoryRun:
    gpu_samples, messages = fleet.gpu_samples, fleet.messages
    with scratch.space(settings, redis_url) as (scoped, tmp):
        workers: list[WorkerProcess] = []
        limit: list[int] = []

        def start() -> WorkerProcess:
            log = tmp / f"worker-{len(workers) + 1}.log"
            worker = WorkerProcess(scoped, redis_url, log, instance="bench-history")
            if limit:
                worker.limit_address_space(limit[0])
            workers.append(worker)
            return worker

        offsets = Offsets(scoped)
        try:
            worker = start()
            wait_ready(offsets, scoped, [worker], None)
            if setup.memory_limit_mb is not None:
                limit.append(int((worker.vm_peak_mb() + setup.memory_limit_mb) * MB))
                worker.limit_address_space(limit[0])
            idle_rss = produce_paused(scoped, fleet, [worker], say)
            fleet.backlog.clear()  # a day of samples is over a gigabyte in this process
            samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
            total = sum(offsets.partition_ends(samples).values())
            say(f"history: the worker works off {total} node samples")
            watch, done, failure = _work_off(
                scoped, worker, start, total=total, gpu_samples=gpu_samples
            )
            if failure is not None:
                failure += f" (the workers' logs are kept in {_keep(tmp)})"
            return history_run(
                setup,
                gpu_samples,
                messages=messages,
                idle_rss=idle_rss,
                watch=watch,
                worked_off_s=None if done is None else done[0],
                rate=None if done is None else done[1] * setup.gpus,
                end_rss=None if done is None else done[2],
                limit_bytes=limit[0] if limit else None,
                error=failure,
            )
        finally:
            offsets.close()
            for process in workers:
                process.stop()


def _keep(logs: Path) -> Path:
    """A copy of the logs of a run that did not finish (the scratch directory goes)."""
    kept = Path(tempfile.mkdtemp(prefix="gpuwatch-bench-history-"))
    for log in logs.glob("*.log"):
        shutil.copy(log, kept / log.name)
    return kept


class _Supervisor:
    """The worker as Kubernetes keeps it: started again when it exits or fails its
    liveness probe `LIVENESS_FAILURES` times in a row (probed every `LIVENESS_PERIOD_S`)."""

    def __init__(
        self, worker: WorkerProcess, start: Callable[[], WorkerProcess], now: float
    ) -> None:
        self.worker = worker
        self._start = start
        self.watch = _Watch()
        self.watch.read(worker)
        self.watch.cpu_start_s = self.watch.cpu_now_s
        self._liveness = Liveness()
        self._next_probe = now + LIVENESS_PERIOD_S

    def step(self, now: float) -> str | None:
        """Read the worker, probe it when due, restart it if need be; an error past
        `MAX_RESTARTS` restarts."""
        worker = self.worker
        running = self.watch.read(worker)
        cause = None if running else f"exited ({worker.process.poll()}){_why(worker)}"
        if running and now >= self._next_probe:
            self._next_probe = now + LIVENESS_PERIOD_S
            if self._liveness.restart(worker.live()):
                worker.kill()
                cause = f"{LIVENESS_FAILURES} liveness probes failed"
        if cause is None:
            return None
        self.watch.restarted(cause)
        if self.watch.restarts > MAX_RESTARTS:
            causes = "; ".join(self.watch.causes)
            return (
                f"the worker ended {self.watch.restarts} times ({causes}): {worker.log_tail(800)}"
            )
        self.worker, self._liveness = self._start(), Liveness()
        self._next_probe = now + LIVENESS_PERIOD_S
        return None


def _work_off(
    scoped: Settings,
    worker: WorkerProcess,
    start: Callable[[], WorkerProcess],
    *,
    total: int,
    gpu_samples: int,
) -> tuple[_Watch, tuple[float, float, float] | None, str | None]:
    """Watch the resumed worker until its group committed `total` node samples, restarting
    it as Kubernetes would; what was read, (seconds, node samples/s, RSS at the end) when
    it finished, else the error."""
    resumed = time.monotonic()
    supervisor = _Supervisor(worker, start, resumed)
    deadline = resumed + drain_deadline_s(gpu_samples)
    progress = (resumed, 0)
    samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
    with CommitWatcher(scoped, samples, POLL_S) as commits:
        while commits.latest() < total:
            now = time.monotonic()
            if (error := supervisor.step(now)) is not None:
                return supervisor.watch, None, error
            if commits.latest() > progress[1]:
                progress = (now, commits.latest())
            elif now - progress[0] > STALL_S:
                return supervisor.watch, None, f"no commit for {STALL_S:.0f} s at {progress[1]}"
            if now > deadline:
                return supervisor.watch, None, f"{progress[1]} of {total} by the deadline"
            time.sleep(POLL_S)
        supervisor.watch.read(supervisor.worker)
        end_rss = supervisor.worker.rss_mb()
    done = next(t for t, n in commits.points if n >= total)
    rate = drain_rate(resumed, commits.points, total)
    return supervisor.watch, (done - resumed, rate, end_rss), None


def history_fields(histories: Histories) -> dict[str, Any]:
    """The JSON fields of every history asked for, `backlog_{hours}h_...`; null when not run."""
    names = [f.name for f in fields(HistoryRun) if f.name != "hours"]
    data: dict[str, Any] = {}
    for hours in histories.hours:
        run = histories.runs.get(hours)
        for name in names:
            data[f"backlog_{hours}h_{name}"] = None if run is None else getattr(run, name)
    return data


def format_histories(histories: Histories) -> list[str]:
    """A line of the summary per history run."""
    lines = []
    for hours in histories.hours:
        run = histories.runs.get(hours)
        if run is None:
            continue
        head = (
            f"  backlog {hours:>3} h          {run.gpu_samples} GPU-samples "
            f"({run.nodes} nodes x {run.gpus_per_node} GPUs every {run.interval_s:g} s)"
        )
        if not run.finished:
            lines.append(
                f"{head}: NOT worked off ({run.error}); restarts {run.restarts}"
                f"{_limit(run.address_space_limit_mb)}"
            )
            continue
        lines.append(
            f"{head} worked off in {run.worked_off_s:.0f} s = {run.gpu_samples_per_s:.0f} "
            f"GPU-samples/s ({run.worker_cpu_us_per_gpu_sample:.0f} us CPU each, "
            f"{run.worker_cores:.2f} cores); memory over the idle {_mb(run.idle_rss_mb)}: "
            f"peak +{_mb(run.peak_over_idle_mb)}, at the end +{_mb(run.end_over_idle_mb)}; "
            f"restarts {run.restarts}{_limit(run.address_space_limit_mb)}"
        )
    return lines


def _mb(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f} MB"


def _why(worker: WorkerProcess) -> str:
    """The last line of the worker's log that names an error, if any."""
    errors = [line for line in worker.log_tail(4000).splitlines() if "Error" in line]
    return f": {errors[-1].strip()[-200:]}" if errors else ""


def _limit(limit_mb: float | None) -> str:
    return "" if limit_mb is None else f" (address space capped at {limit_mb:.0f} MB)"
