"""`gpuwatch bench worker`: one worker process on a fleet's stream, against two baselines.

The run, on topics, an app id and a Redis database of its own (all removed afterwards):

1. the producer figure (`gpuwatch bench producer`), while nothing else runs;
2. a worker process (`python -m gpuwatch.cli worker`, sinks on) starts on the empty
   topics; once it holds its partitions its RSS is the idle figure, and it is paused
   (SIGSTOP) while the fleet's pod events and backlog of node samples are produced;
3. throughput: the worker resumes (SIGCONT) and works the backlog off. GPU-samples per
   second = samples its consumer group had committed at its last commit before the end,
   over the time since it resumed (the admin API reads the commits: free for the worker);
4. latency: the fleet's next samples are sent at a steady pace while a probe reads the
   Redis hash of some GPUs every 20 ms. A sample's latency is from its hand-over to the
   Kafka client to the first read of its `updated_at` (or a later one) in Redis. Samples
   still not there when the wait ends count at that time, as lower bounds (`e2e_censored`);
5. the worker stops; the baselines read the same backlog: a bare aiokafka consumer that
   only decodes each sample, and the Faust floor, a Faust agent that only decodes.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import math
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gpuwatch.bench.fleet import Fleet, PacedResult, build_fleet, pace, produce
from gpuwatch.bench.probes import (
    CommitWatcher,
    DecodeRun,
    LatencyProbe,
    Offsets,
    WorkerProcess,
    bare_consumer,
    faust_floor,
)
from gpuwatch.bench.report import (
    Latencies,
    WorkerResult,
    WorkerRun,
    format_worker,
    worker_json,
    write_plot,
)
from gpuwatch.bench.run import bench_producer
from gpuwatch.kafka import admin, create_topics
from schemas.settings import Settings
from schemas.topics import K8S_PODS, NVML_SAMPLES
from sinks.redis import client as redis_client
from streams.faust.tick_timer import tick_topic_name

__all__ = [
    "FULL",
    "QUICK",
    "WorkerBenchConfig",
    "bench_worker",
    "config_from_args",
    "drain_rate",
    "kept_up",
    "latencies_ms",
    "main",
    "percentile",
    "worker_config",
]

READY_DEADLINE_S = 120.0  # importing Faust and joining the group takes seconds; a loaded box more
DRAIN_DEADLINE_S = 1800.0  # the full backlog takes minutes here; past this something is wrong
SLOWEST_GPU_SAMPLES_PER_S = 400.0  # a day of 30 s samples runs at ~1,000/s: more time for it

POLL_S = 0.2  # the bench looks at the worker this often


def drain_deadline_s(gpu_samples: int) -> float:
    """How long a backlog of `gpu_samples` may take before the bench gives up on it."""
    return max(DRAIN_DEADLINE_S, gpu_samples / SLOWEST_GPU_SAMPLES_PER_S)


@dataclass(frozen=True)
class WorkerBenchConfig:
    """What one run measures."""

    nodes: int = 5000
    gpus: int = 8
    seconds: int = 10
    """Seconds of fleet samples in the backlog."""
    interval_s: float = 1.0
    """How often each node samples (a backlog of recorded history: every 30 or 57 s)."""
    paced_gpu_samples_per_s: float = 40_000.0
    paced_seconds: float = 30.0
    watch: int = 48
    """GPUs whose Redis state the latency probe reads (the first of as many nodes)."""
    redis_db: int = 6
    """The scratch Redis database, flushed before and after."""
    producer_kafka: bool = True
    """The producer figure with Kafka (the agent loop at 10 Hz), else the tick alone."""

    @property
    def pods(self) -> int:
        """Pods of the fleet: one per GPU."""
        return self.nodes * self.gpus

    @property
    def catch_up_s(self) -> float:
        """How long after the paced load the bench waits for the worker to catch up."""
        return max(30.0, 2 * self.paced_seconds)


FULL = WorkerBenchConfig()
QUICK = WorkerBenchConfig(
    nodes=1000,
    seconds=3,
    paced_gpu_samples_per_s=4_000.0,
    paced_seconds=8.0,
    watch=24,
    producer_kafka=False,
)


def worker_config(
    *,
    quick: bool,
    gpus: int = 8,
    nodes: int | None = None,
    seconds: int | None = None,
    rate: float | None = None,
    paced_seconds: float | None = None,
    redis_db: int | None = None,
    interval_s: float | None = None,
) -> WorkerBenchConfig:
    """`QUICK` or `FULL` with the options given; ValueError when one is out of range."""
    base = QUICK if quick else FULL
    config = replace(
        base,
        gpus=gpus,
        nodes=base.nodes if nodes is None else nodes,
        seconds=base.seconds if seconds is None else seconds,
        paced_gpu_samples_per_s=base.paced_gpu_samples_per_s if rate is None else rate,
        paced_seconds=base.paced_seconds if paced_seconds is None else paced_seconds,
        redis_db=base.redis_db if redis_db is None else redis_db,
        interval_s=base.interval_s if interval_s is None else interval_s,
    )
    if not 0.1 <= config.interval_s <= 60:
        raise ValueError(f"--interval must be 0.1..60 s, got {config.interval_s:g}")
    if not 1 <= config.gpus <= 64:
        raise ValueError(f"--gpus must be 1..64, got {config.gpus}")
    if config.nodes < 1 or config.seconds < 1:
        raise ValueError("--nodes and --seconds must be at least 1")
    if config.paced_gpu_samples_per_s < config.gpus:
        raise ValueError(f"--rate must be at least one node sample a second ({config.gpus})")
    if config.paced_seconds <= 0:
        raise ValueError("--paced-seconds must be positive")
    if not 1 <= config.redis_db <= 15:
        # Database 0 is the one everything else uses, and the bench flushes its database.
        raise ValueError(f"--redis-db must be 1..15 (it is flushed), got {config.redis_db}")
    return replace(config, watch=min(config.watch, config.nodes))


def config_from_args(args: argparse.Namespace) -> WorkerBenchConfig:
    """The configuration `gpuwatch bench worker` asks for; ValueError when out of range."""
    return worker_config(
        quick=args.quick,
        gpus=args.gpus,
        nodes=args.nodes,
        seconds=args.seconds,
        rate=args.rate,
        paced_seconds=args.paced_seconds,
        redis_db=args.redis_db,
        interval_s=args.interval,
    )


def main(args: argparse.Namespace, settings: Settings, config: WorkerBenchConfig) -> int:
    """Run; print the summary or one JSON line; write the plot when asked."""

    def say(message: str) -> None:
        if not args.json:
            print(f"... {message}", file=sys.stderr, flush=True)

    run = bench_worker(settings, config, say)
    if args.plot is not None:
        write_plot(run, args.plot)
    print(worker_json(run.result) if args.json else format_worker(run.result))
    return 0


# -- the arithmetic -----------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, linear between the closest ranks (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be 0..100, got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def drain_rate(started: float, points: Sequence[tuple[float, int]], total: int) -> float:
    """Messages per second from `started`, by the worker's commits read at `points`.

    `points` are (time read, messages committed since `started`). A commit made while work
    went on marks exactly what was done by then; the one reaching `total` comes up to a
    commit interval after the last message, so it counts only when no other was read.
    """
    partial = [(t, n) for t, n in points if 0 < n < total and t > started]
    if partial:
        t, n = max(partial, key=lambda point: point[1])
        return n / (t - started)
    done = [t for t, n in points if n >= total and t > started]
    if not done:
        return 0.0
    return total / (min(done) - started)


def latencies_ms(
    seen: Sequence[tuple[str, int, float]],
    sent_at: Mapping[tuple[str, int], float],
    censor_at: float,
) -> Latencies:
    """The latency of each sent sample: until its end time, or a later one, was read.

    Redis holds a GPU's newest state only, so a sample overtaken by the next before a write
    is in Redis from the moment the newer one is. `seen` is (uuid, updated_at, read time)
    per new value read; `sent_at` maps (uuid, end time) to the send time.
    """
    reads: dict[str, list[tuple[int, float]]] = {}
    for uuid_, updated, read_at in seen:
        reads.setdefault(uuid_, []).append((updated, read_at))
    # The first read at or after each value: a later read of a newer state covers it too.
    firsts: dict[str, tuple[list[int], list[float]]] = {}
    for uuid_, values in reads.items():
        values.sort()
        ends, times = [], []
        earliest = math.inf
        for updated, read_at in reversed(values):
            earliest = min(earliest, read_at)
            ends.append(updated)
            times.append(earliest)
        firsts[uuid_] = (ends[::-1], times[::-1])
    out: list[tuple[float, float]] = []
    censored = 0
    for (uuid_, end), sent in sent_at.items():
        ends, times = firsts.get(uuid_, ([], []))
        i = bisect.bisect_left(ends, end)
        if i < len(ends):
            out.append((sent, (times[i] - sent) * 1000))
        else:
            censored += 1
            out.append((sent, (censor_at - sent) * 1000))
    return Latencies(sorted(out), censored)


def kept_up(latencies: Latencies, slack_ms: float = 1000.0) -> bool:
    """Whether the worker kept pace: every sample arrived and latency did not grow.

    A worker slower than the pace builds a backlog, so its latency grows for as long as
    the load lasts: the last fifth's median is then well above the first fifth's.
    """
    samples = latencies.samples
    if latencies.censored or len(samples) < 10:
        return False
    fifth = len(samples) // 5
    first = [ms for _, ms in samples[:fifth]]
    last = [ms for _, ms in samples[-fifth:]]
    return percentile(last, 50) <= percentile(first, 50) + slack_ms


# -- the run ------------------------------------------------------------------------------

Say = Callable[[str], None]


def _redis_url(settings: Settings, db: int) -> str:
    parts = urlsplit(settings.redis.url.get_secret_value())
    return urlunsplit(parts._replace(path=f"/{db}"))


def _flush(url: str) -> None:
    client = redis_client.connect(url, timeout_s=10)
    try:
        client.flushdb()
    finally:
        client.close()


def _scope(settings: Settings) -> Settings:
    tag = uuid.uuid4().hex[:8]
    kafka = settings.kafka.model_copy(
        update={"topic_prefix": f"gpuwatch-bench-{tag}.", "app_id": f"gpuwatch-bench-{tag}"}
    )
    return settings.model_copy(update={"kafka": kafka})


def _cleanup(settings: Settings) -> None:
    """Delete every topic under the bench's prefix and its consumer groups."""
    kafka = settings.kafka
    client = admin(kafka, client_id="gpuwatch-bench")
    try:
        names = [n for n in client.list_topics() if n.startswith(kafka.topic_prefix)]
        if names:
            client.delete_topics(names)
        known = {g["group_id"] for g in client.list_groups()}
        mine = (kafka.app_id, f"{kafka.app_id}.redis", f"{kafka.app_id}-floor")
        if groups := [g for g in mine if g in known]:
            client.delete_groups(groups)
    finally:
        client.close()


def _wait(what: str, check: Callable[[], bool], worker: WorkerProcess, deadline_s: float) -> bool:
    """Poll `check` until true (True) or the deadline (False); raise if the worker exits."""
    deadline = time.monotonic() + deadline_s
    while not check():
        worker.check()
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def bench_worker(settings: Settings, config: WorkerBenchConfig, say: Say) -> WorkerRun:
    """Run the worker benchmark on the local stack (see the module docstring)."""
    say("producer figure")
    ticks = 2000 if config.producer_kafka else 500
    producer = bench_producer(settings, ticks, config.gpus, config.producer_kafka, 5.0)
    say(f"simulating {config.nodes} nodes x {config.gpus} GPUs for {config.seconds} s")
    t0 = int(time.time() * 1000) - (config.seconds + 5) * 1000
    fleet = build_fleet(
        config.nodes, config.gpus, config.seconds, t0, config.watch, interval_s=config.interval_s
    )
    scoped = _scope(settings)
    redis_url = _redis_url(settings, config.redis_db)
    _flush(redis_url)
    try:
        rows = create_topics(scoped)
        if not all(row.ok for row in rows):
            raise RuntimeError(f"topics not created: {rows}")
        with tempfile.TemporaryDirectory(prefix="gpuwatch-bench-") as tmp:
            worker = WorkerProcess(scoped, redis_url, Path(tmp) / "worker.log")
            try:
                run, ends = _run(
                    scoped, config=config, fleet=fleet, worker=worker, redis_url=redis_url, say=say
                )
            except BaseException:
                sys.stderr.write(worker.log_tail())
                raise
            finally:
                worker.stop()
        say("baselines: bare aiokafka consumer, Faust floor")
        samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
        bare = asyncio.run(bare_consumer(scoped, samples, ends))
        floor = faust_floor(scoped, redis_url, samples, ends)
    finally:
        _cleanup(scoped)
        _flush(redis_url)
    result = _with_baselines(run.result, bare, floor)
    return WorkerRun(
        replace(
            result,
            producer_cpu_us_per_gpu_sample=producer.paced_cpu_us_per_gpu_sample
            or producer.tick_cpu_us_per_gpu_sample,
            producer_figure="agent loop at 10 Hz with Kafka"
            if producer.paced_cpu_us_per_gpu_sample
            else "tick: read, resolve, assemble, encode; no Kafka",
        ),
        run.latencies,
    )


def _with_baselines(result: WorkerResult, bare: DecodeRun, floor: DecodeRun) -> WorkerResult:
    return replace(
        result,
        baseline_gpu_samples_per_s=bare.gpu_samples_per_s,
        baseline_cpu_us_per_gpu_sample=bare.cpu_us_per_gpu_sample,
        faust_floor_gpu_samples_per_s=floor.gpu_samples_per_s,
        faust_floor_cpu_us_per_gpu_sample=floor.cpu_us_per_gpu_sample,
    )


@dataclass(frozen=True)
class _Drain:
    rate: float
    seconds: float
    cpu_s: float
    idle_rss: float
    loaded_rss: float
    ends: dict[int, int]
    """End offsets of the samples' partitions once the backlog was produced."""


def _run(
    scoped: Settings,
    *,
    config: WorkerBenchConfig,
    fleet: Fleet,
    worker: WorkerProcess,
    redis_url: str,
    say: Say,
) -> tuple[WorkerRun, dict[int, int]]:
    say("worker: starting")
    drain = _backlog(scoped, fleet, worker, say)
    samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
    messages_per_s = config.paced_gpu_samples_per_s / fleet.gpus
    with (
        LatencyProbe(redis_url, fleet.watched.values()) as probe,
        CommitWatcher(scoped, samples, POLL_S) as commits,
    ):
        # The sinks lag the stream: the paced load starts once the watched GPUs show their
        # last backlog sample in Redis, so that it measures the pipeline, not the backlog.
        backlog_end = {fleet.last[i].gpus[0].uuid: fleet.paced_end(i, 0) for i in fleet.watched}
        if not _wait(
            "the backlog in Redis",
            lambda: all((probe.latest(u) or 0) >= end for u, end in backlog_end.items()),
            worker,
            drain_deadline_s(fleet.gpu_samples),
        ):
            raise RuntimeError("the backlog did not reach Redis in time")
        say(f"paced load: {config.paced_gpu_samples_per_s:.0f} GPU-samples/s, latency probe")
        before = commits.latest()
        started = time.monotonic()
        paced = asyncio.run(
            pace(scoped.kafka, samples, fleet, messages_per_s, config.paced_seconds)
        )
        last_end: dict[str, int] = {}
        for uuid_, end in paced.sent_at:
            last_end[uuid_] = max(last_end.get(uuid_, 0), end)
        say("paced load sent; waiting for the worker to catch up")
        caught_up = _wait(
            "the paced samples",
            lambda: (
                commits.latest() - before >= paced.messages
                and all((probe.latest(u) or 0) >= end for u, end in last_end.items())
            ),
            worker,
            config.catch_up_s,
        )
        censor_at = time.time()
    if not caught_up:
        say(f"the worker had not caught up {config.catch_up_s:.0f} s after the paced load")
    progress = [(t, n - before) for t, n in commits.points]
    processed = drain_rate(started, progress, paced.messages) * fleet.gpus
    latencies = latencies_ms(probe.seen, paced.sent_at, censor_at)
    result = _result(
        config, fleet, worker, drain=drain, paced=paced, processed=processed, latencies=latencies
    )
    return WorkerRun(result, latencies), drain.ends


def _result(
    config: WorkerBenchConfig,
    fleet: Fleet,
    worker: WorkerProcess,
    *,
    drain: _Drain,
    paced: PacedResult,
    processed: float,
    latencies: Latencies,
) -> WorkerResult:
    """The figures of one run: the drain of the backlog, then the paced load's latencies."""
    values = [ms for _, ms in latencies.samples]
    pods = fleet.pods
    return WorkerResult(
        nodes=len(fleet.nodes),
        gpus_per_node=fleet.gpus,
        backlog_seconds=fleet.seconds,
        messages=fleet.messages,
        gpu_samples=fleet.gpu_samples,
        pods=pods,
        sample_bytes=fleet.mean_bytes,
        gpu_samples_per_s=drain.rate,
        drain_s=drain.seconds,
        worker_cpu_us_per_gpu_sample=drain.cpu_s / fleet.gpu_samples * 1e6,
        worker_cores=drain.cpu_s / drain.seconds,
        baseline_gpu_samples_per_s=0.0,
        baseline_cpu_us_per_gpu_sample=0.0,
        faust_floor_gpu_samples_per_s=0.0,
        faust_floor_cpu_us_per_gpu_sample=0.0,
        paced_target_gpu_samples_per_s=config.paced_gpu_samples_per_s,
        paced_achieved_gpu_samples_per_s=paced.achieved_messages_per_s * fleet.gpus,
        paced_processed_gpu_samples_per_s=processed,
        paced_seconds=paced.seconds,
        paced_kept_up=kept_up(latencies),
        e2e_samples=len(values),
        e2e_censored=latencies.censored,
        e2e_p50_ms=percentile(values, 50) if values else None,
        e2e_p99_ms=percentile(values, 99) if values else None,
        e2e_max_ms=max(values) if values else None,
        worker_rss_idle_mb=drain.idle_rss,
        worker_rss_mb=drain.loaded_rss,
        worker_rss_peak_mb=worker.peak_mb(),
        rss_mb_per_10k_pods=(drain.loaded_rss - drain.idle_rss) / pods * 10_000,
        producer_cpu_us_per_gpu_sample=0.0,
        producer_figure="",
    )


def _backlog(scoped: Settings, fleet: Fleet, worker: WorkerProcess, say: Say) -> _Drain:
    """Start the worker, pause it, produce the backlog, resume it and time the drain."""
    prefix = scoped.kafka.topic_prefix
    samples = NVML_SAMPLES.full_name(prefix)
    ticks = tick_topic_name(scoped)
    want = 2 * scoped.kafka.partitions  # a tick per owned partition a round: two rounds
    offsets = Offsets(scoped)
    try:
        ready = _wait(
            "the worker to start",
            lambda: offsets.exists(ticks) and offsets.ends(ticks) >= want,
            worker,
            READY_DEADLINE_S,
        )
        if not ready:
            raise RuntimeError(f"the worker did not start within {READY_DEADLINE_S:.0f} s")
        idle_rss = worker.rss_mb()
        worker.pause()
        try:
            say(f"producing {fleet.pods} pod events and {fleet.messages} node samples")
            asyncio.run(produce(scoped.kafka, K8S_PODS.full_name(prefix), fleet.pod_events))
            asyncio.run(produce(scoped.kafka, samples, fleet.backlog))
        finally:
            worker.resume()
        resumed, cpu = time.monotonic(), worker.cpu_s()
        ends = offsets.partition_ends(samples)
        total = sum(ends.values())
    finally:
        offsets.close()
    say(f"worker: working off {total} node samples")
    with CommitWatcher(scoped, samples, POLL_S) as commits:
        deadline_s = drain_deadline_s(fleet.gpu_samples)
        if not _wait("the backlog", lambda: commits.latest() >= total, worker, deadline_s):
            raise RuntimeError(f"the worker committed {commits.latest()} of {total} in time")
        worker.rss_mb()
    done = next(t for t, n in commits.points if n >= total)
    return _Drain(
        rate=drain_rate(resumed, commits.points, total) * fleet.gpus,
        seconds=done - resumed,
        cpu_s=worker.cpu_s() - cpu,
        idle_rss=idle_rss,
        loaded_rss=worker.rss_mb(),
        ends=ends,
    )
