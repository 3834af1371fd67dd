"""The backlog part of `gpuwatch bench worker`: workers (and the Redis sink) work a backlog off.

The workers start on the empty topics; once their group is stable and they tick, the first
one's RSS is the idle figure and every process is paused (SIGSTOP) while the fleet's pod
events and backlog of node samples are produced. Then the workers resume (SIGCONT):
throughput is what the workers' group had committed at its last commit before the end,
over the time since the resume; CPU is each process's from /proc over the same time, and
the broker's when its pid is known. The Redis sink, when there is one, stays paused until
then (deployed, it runs on cores of its own; here it would take the workers' share of two),
then resumes and is done once its own group has committed every sample and every record
the workers made of them: its time and CPU are its own, from its resume.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuwatch.harness.bench.figures import drain_rate
from gpuwatch.harness.bench.load import Fleet, produce
from gpuwatch.harness.bench.probes import CommitWatcher, Offsets
from gpuwatch.harness.bench.procs import BenchProcess, SinkProcess, WorkerProcess, proc_cpu_s
from schemas.settings import Settings
from schemas.topics import K8S_PODS, NVML_SAMPLES, SINK_TOPICS
from sinks.redis.writer import redis_group
from streams.faust.tick_timer import tick_topic_name

__all__ = [
    "Drain",
    "SinkDrain",
    "drain_backlog",
    "drain_deadline_s",
    "produce_paused",
    "wait_for",
    "wait_ready",
]

READY_DEADLINE_S = 120.0  # importing Faust and joining the group takes seconds; a loaded box more
DRAIN_DEADLINE_S = 1800.0  # the full backlog takes minutes here; past this something is wrong
SLOWEST_GPU_SAMPLES_PER_S = 400.0  # a day of 30 s samples runs at ~1,000/s: more time for it
SINK_DEADLINE_S = 600.0  # the sink writes the full backlog in a minute or two here
POLL_S = 0.2  # the bench looks at the processes this often

Say = Callable[[str], None]


def drain_deadline_s(gpu_samples: int) -> float:
    """How long a backlog of `gpu_samples` may take before the bench gives up on it."""
    return max(DRAIN_DEADLINE_S, gpu_samples / SLOWEST_GPU_SAMPLES_PER_S)


def wait_for(check: Callable[[], bool], watched: Sequence[BenchProcess], deadline_s: float) -> bool:
    """Poll `check` until true (True) or the deadline (False); raise if a process exits."""
    deadline = time.monotonic() + deadline_s
    while not check():
        for process in watched:
            process.check()
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


@dataclass(frozen=True)
class SinkDrain:
    """The Redis sink over the backlog."""

    seconds: float
    """From the resume until its group had committed everything."""
    cpu_s: float
    rss_mb: float
    peak_mb: float
    kafka_errors: int | None = None
    """Polls and commits Kafka refused the sink meanwhile, and consumers it made anew
    (`gpuwatch_sink_kafka_errors_total`); None when its /metrics did not answer."""


@dataclass(frozen=True)
class Drain:
    """The workers over the backlog."""

    rate: float
    """GPU-samples per second, by the workers' group's commits."""
    seconds: float
    cpu_s: tuple[float, ...]
    """Each worker's CPU seconds from the resume to the end."""
    idle_rss: float
    loaded_rss: float
    committed: int
    """Node samples the workers' group had committed at the end (the backlog's, all of it)."""
    ends: dict[int, int]
    """End offsets of the samples' partitions once the backlog was produced."""
    broker_cpu_s: float | None
    sink: SinkDrain | None


def wait_ready(
    offsets: Offsets, scoped: Settings, workers: Sequence[WorkerProcess], sink: SinkProcess | None
) -> None:
    """Wait until every worker is in the stable group and ticks, and the sink serves."""
    ticks = tick_topic_name(scoped)
    want = 2 * scoped.kafka.partitions  # a tick per owned partition a round: two rounds
    everyone: list[BenchProcess] = [*workers, *([sink] if sink else [])]
    if not wait_for(
        lambda: offsets.exists(ticks) and offsets.members() == len(workers),
        everyone,
        READY_DEADLINE_S,
    ):
        raise RuntimeError(f"the workers did not join within {READY_DEADLINE_S:.0f} s")
    since = offsets.ends(ticks)
    ready = wait_for(
        lambda: (
            offsets.ends(ticks) >= since + want
            and offsets.members() == len(workers)
            and (sink is None or sink.serving())
        ),
        everyone,
        READY_DEADLINE_S,
    )
    if not ready:
        raise RuntimeError(f"the workers did not start within {READY_DEADLINE_S:.0f} s")


def produce_paused(
    scoped: Settings,
    fleet: Fleet,
    workers: Sequence[WorkerProcess],
    say: Say,
    *,
    sink: SinkProcess | None = None,
) -> float:
    """Once they are ready (`wait_ready`): pause the processes, produce the fleet's pod
    events and backlog, and resume the workers (the sink stays paused); the first
    worker's idle RSS (MB)."""
    prefix = scoped.kafka.topic_prefix
    idle_rss = workers[0].rss_mb()
    for process in [*workers, *([sink] if sink else [])]:
        process.pause()
    try:
        say(f"producing {fleet.pods} pod events and {fleet.messages} node samples")
        asyncio.run(produce(scoped.kafka, K8S_PODS.full_name(prefix), fleet.pod_events))
        asyncio.run(produce(scoped.kafka, NVML_SAMPLES.full_name(prefix), fleet.backlog))
    finally:
        for process in workers:
            process.resume()
    return idle_rss


def drain_backlog(
    scoped: Settings,
    fleet: Fleet,
    workers: Sequence[WorkerProcess],
    say: Say,
    *,
    sink: SinkProcess | None = None,
    broker: int | None = None,
) -> Drain:
    """Wait for the processes, pause them, produce the backlog, resume them, time the drain."""
    samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
    offsets = Offsets(scoped)
    try:
        wait_ready(offsets, scoped, workers, sink)
        idle_rss = produce_paused(scoped, fleet, workers, say, sink=sink)
        resumed = time.monotonic()
        cpu = [process.cpu_s() for process in workers]
        broker_cpu = None if broker is None else proc_cpu_s(broker)
        ends = offsets.partition_ends(samples)
        total = sum(ends.values())
        say(f"{len(workers)} worker(s): working off {total} node samples")
        with CommitWatcher(scoped, samples, POLL_S) as commits:
            deadline_s = drain_deadline_s(fleet.gpu_samples)
            if not wait_for(lambda: commits.latest() >= total, workers, deadline_s):
                raise RuntimeError(f"the workers committed {commits.latest()} of {total} in time")
            workers[0].rss_mb()
        done = next(t for t, n in commits.points if n >= total)
        used = [process.cpu_s() - before for process, before in zip(workers, cpu, strict=True)]
        broker_used = (
            None if broker is None or broker_cpu is None else proc_cpu_s(broker) - broker_cpu
        )
        sink_drain = None
        if sink is not None:
            sink_drain = _sink_drain(offsets, scoped, sink, samples_total=total)
    finally:
        offsets.close()
    return Drain(
        rate=drain_rate(resumed, commits.points, total) * fleet.gpus,
        seconds=done - resumed,
        cpu_s=tuple(used[: len(workers)]),
        idle_rss=idle_rss,
        loaded_rss=workers[0].rss_mb(),
        committed=commits.latest(),
        ends=ends,
        broker_cpu_s=broker_used,
        sink=sink_drain,
    )


def _sink_drain(
    offsets: Offsets,
    scoped: Settings,
    sink: SinkProcess,
    *,
    samples_total: int,
) -> SinkDrain:
    """Resume the sink; wait until its group committed every sample and every derived record."""
    prefix = scoped.kafka.topic_prefix
    group = redis_group(scoped)
    samples = NVML_SAMPLES.full_name(prefix)
    derived = [spec.full_name(prefix) for spec in SINK_TOPICS]
    want = {topic: offsets.ends(topic) for topic in derived}
    want[samples] = samples_total
    sink.resume()
    resumed, cpu_before = time.monotonic(), sink.cpu_s()

    def written() -> bool:
        return all(offsets.committed(topic, group) >= end for topic, end in want.items())

    if not wait_for(written, [sink], SINK_DEADLINE_S):
        short = {
            topic: f"{offsets.committed(topic, group)} of {end}"
            for topic, end in want.items()
            if offsets.committed(topic, group) < end
        }
        raise RuntimeError(
            f"the Redis sink did not write the backlog in {SINK_DEADLINE_S:.0f} s: "
            f"its group committed {short}"
        )
    seconds = time.monotonic() - resumed
    return SinkDrain(
        seconds,
        sink.cpu_s() - cpu_before,
        sink.rss_mb(),
        sink.peak_mb(),
        sink.counter("gpuwatch_sink_kafka_errors_total"),
    )
