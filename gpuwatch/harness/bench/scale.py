"""The two-worker part of `gpuwatch bench worker`: two workers in one group, the same backlog.

On fresh topics and a fresh app id, two `gpuwatch worker` processes join one consumer
group and work off the same backlog the lone worker did, paused and resumed the same way
(`gpuwatch.harness.bench.backlog`). The figures: their wall-clock rate against the lone worker's,
their CPU summed over the GPU-samples, and the cores each process used (the broker's too
when its pid can be read). The records of two workers equal one worker's: the integration
tests judge that; here the group's committed total must equal the backlog.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.harness.bench import scratch
from gpuwatch.harness.bench.backlog import Drain, Say, drain_backlog
from gpuwatch.harness.bench.load import Fleet
from gpuwatch.harness.bench.procs import WorkerProcess, supervised
from schemas.settings import Settings

__all__ = ["WORKERS", "TwoWorkers", "bench_two_workers", "two_worker_figures"]

WORKERS = 2


@dataclass(frozen=True)
class TwoWorkers:
    """The two-worker figures, beside the lone worker's."""

    two_worker_gpu_samples_per_s: float
    two_worker_speedup: float
    """Their GPU-samples per second over the lone worker's (wall clock)."""
    two_worker_cpu_us_per_gpu_sample: float
    """The two workers' CPU, summed, per GPU-sample of the backlog."""
    two_worker_cpu_ratio: float
    """That over the lone worker's CPU per GPU-sample (issue: within 1.1)."""
    two_worker_cores: list[float]
    """Each worker's CPU seconds per second of the drain."""
    two_worker_broker_cores: float | None
    """The broker's, when its pid can be read (the local stack's Kafka), else null."""
    two_worker_drain_s: float
    two_worker_committed: int
    """Node samples the group committed: the backlog's, every one."""


def two_worker_figures(
    two: Drain, *, gpu_samples: int, lone_rate: float, lone_cpu_us: float
) -> TwoWorkers:
    """The figures of a two-worker drain against the lone worker's rate and CPU."""
    cpu_us = sum(two.cpu_s) / gpu_samples * 1e6
    seconds = max(two.seconds, 1e-9)
    return TwoWorkers(
        two_worker_gpu_samples_per_s=two.rate,
        two_worker_speedup=two.rate / lone_rate if lone_rate > 0 else 0.0,
        two_worker_cpu_us_per_gpu_sample=cpu_us,
        two_worker_cpu_ratio=cpu_us / lone_cpu_us if lone_cpu_us > 0 else 0.0,
        two_worker_cores=[cpu / seconds for cpu in two.cpu_s],
        two_worker_broker_cores=None if two.broker_cpu_s is None else two.broker_cpu_s / seconds,
        two_worker_drain_s=two.seconds,
        two_worker_committed=two.committed,
    )


def bench_two_workers(
    settings: Settings, fleet: Fleet, redis_url: str, say: Say, *, broker: int | None
) -> Drain:
    """Two workers on a fresh scope work the fleet's backlog off; their drain."""
    with scratch.space(settings, redis_url) as (scoped, tmp):
        workers = [
            WorkerProcess(scoped, redis_url, tmp / f"worker-{i}.log", instance=f"bench-{i}")
            for i in range(1, WORKERS + 1)
        ]
        with supervised(list(workers)):
            say(f"{WORKERS} workers in one group: starting")
            drain = drain_backlog(scoped, fleet, workers, say, broker=broker)
    total = sum(drain.ends.values())
    if drain.committed != total:
        raise RuntimeError(f"{WORKERS} workers committed {drain.committed} of {total} samples")
    return drain
