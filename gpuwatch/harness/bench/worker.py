"""`gpuwatch bench worker`: the worker and its Redis sink on a fleet's stream, against baselines.

The run, on topics, an app id and a Redis database of its own (all removed afterwards):

1. the producer figure (`gpuwatch bench producer`), while nothing else runs;
2. a worker process (`python -m gpuwatch.cli worker`, /metrics on) and a Redis sink
   (`python -m gpuwatch.cli sink redis`, its own group and /metrics) start on the empty
   topics; once the worker holds its partitions its RSS is the idle figure, and both are
   paused (SIGSTOP) while the fleet's pod events and backlog of node samples are produced;
3. throughput: the worker resumes (SIGCONT) and works the backlog off
   (`gpuwatch.harness.bench.backlog`). GPU-samples per second = samples the worker's group had
   committed at its last commit before the end, over the time since the resume; then the
   sink resumes (deployed, it has cores of its own) and its CPU is its own over the same
   backlog, until its group has committed every sample and every derived record;
4. latency: the fleet's next samples are sent at a steady pace while a probe reads the
   Redis hash of some GPUs (written by the sink) every 20 ms. A sample's latency is from
   its hand-over to the Kafka client to the first read of its `updated_at` (or a later
   one) in Redis. Samples still not there when the wait ends count at that time, as lower
   bounds (`e2e_censored`);
5. the worker and the sink stop; the baselines read the same backlog: a bare aiokafka
   consumer that only decodes each sample, and two Faust floors, a Faust agent that only
   decodes, its records through Faust's stream, then through an inbox as the worker's,
   each floor in a consumer group of its own. A baseline that fails or runs past its
   deadline leaves its figures null and says why (`baseline_error`, `faust_floor_error`,
   `inbox_floor_error`); the run's other figures stand;
6. two workers in one group on fresh topics work the same backlog off
   (`gpuwatch.harness.bench.scale`);
7. the idle-alert latency on a few nodes, with a private Prometheus
   (`gpuwatch.harness.bench.alerts`);
8. a worker far behind: each of `backlog_hours` of recorded history (1,000 GPUs sampled
   every 57 s), produced while a worker of its own is paused, worked off
   (`gpuwatch.harness.bench.history`). `only_backlog` runs this part alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuwatch.harness.bench import scratch
from gpuwatch.harness.bench.alert_figures import alert_fields, format_alerts
from gpuwatch.harness.bench.alerts import bench_alerts
from gpuwatch.harness.bench.backlog import Drain, drain_backlog, drain_deadline_s, wait_for
from gpuwatch.harness.bench.figures import drain_rate, kept_up, latencies_ms, percentile
from gpuwatch.harness.bench.history import (
    Histories,
    HistorySetup,
    bench_history,
    format_histories,
    history_fields,
)
from gpuwatch.harness.bench.load import Fleet, PacedResult, build_fleet, pace
from gpuwatch.harness.bench.probes import (
    Baseline,
    CommitWatcher,
    LatencyProbe,
    attempt,
    bare_consumer,
    faust_floor,
)
from gpuwatch.harness.bench.procs import SinkProcess, WorkerProcess, broker_pid, supervised
from gpuwatch.harness.bench.report import (
    Latencies,
    WorkerResult,
    WorkerRun,
    format_worker,
    worker_json,
    write_plot,
)
from gpuwatch.harness.bench.run import bench_producer
from gpuwatch.harness.bench.scale import bench_two_workers, two_worker_figures
from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES

__all__ = [
    "FULL",
    "QUICK",
    "WorkerBenchConfig",
    "bench_worker",
    "config_from_args",
    "main",
    "main_alerts",
    "worker_config",
]

POLL_S = 0.2  # the bench looks at the worker this often


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
    two_workers: bool = True
    """Then two workers in one group on the same backlog (`gpuwatch.harness.bench.scale`)."""
    alerts: bool = True
    """Then the idle-alert latency on a few nodes (`gpuwatch.harness.bench.alerts`)."""
    backlog_hours: tuple[int, ...] = (6, 24)
    """Then a worker works off each of these hours of recorded history
    (`gpuwatch.harness.bench.history`)."""
    backlog_nodes: int = 125
    """Nodes of the histories (1,000 GPUs at 8 a node), each sampled every 57 s."""
    backlog: bool = True
    """Whether the histories run (else their fields are null)."""
    only_backlog: bool = False
    """The histories alone: no producer figure, no live worker, no other part."""
    backlog_memory_limit_mb: int | None = None
    """The history worker's address space capped at its idle VmPeak plus this many MB."""

    @property
    def pods(self) -> int:
        """Pods of the fleet: one per GPU."""
        return self.nodes * self.gpus

    @property
    def paced_lead_s(self) -> float:
        """How far the paced load's event time gets ahead of the wall time it takes: each
        round of every node's next sample is `interval_s` of event time (`Fleet.paced`)."""
        messages = max(1, int(self.paced_gpu_samples_per_s / self.gpus * self.paced_seconds))
        return max(0.0, math.ceil(messages / self.nodes) * self.interval_s - self.paced_seconds)

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
    backlog_hours=(1, 4),
    backlog_nodes=25,
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
    two_workers: bool = True,
    alerts: bool = True,
    backlog_hours: tuple[int, ...] | None = None,
    backlog_nodes: int | None = None,
    backlog: bool = True,
    only_backlog: bool = False,
    backlog_memory_limit_mb: int | None = None,
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
        two_workers=two_workers and not only_backlog,
        alerts=alerts and not only_backlog,
        backlog_hours=base.backlog_hours if backlog_hours is None else backlog_hours,
        backlog_nodes=base.backlog_nodes if backlog_nodes is None else backlog_nodes,
        backlog=backlog,
        only_backlog=only_backlog,
        backlog_memory_limit_mb=backlog_memory_limit_mb,
    )
    _check_backlog(config)
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


MAX_BACKLOG_HOURS = 7 * 24  # a week of history is 10 M GPU-samples: hours to work off here
MAX_BACKLOG_NODES = 1_000  # 8,000 GPUs: a day is 12 M GPU-samples


def _check_backlog(config: WorkerBenchConfig) -> None:
    hours = config.backlog_hours
    if not hours or any(not 1 <= h <= MAX_BACKLOG_HOURS for h in hours):
        raise ValueError(f"--backlog-hours must be 1..{MAX_BACKLOG_HOURS} each, got {hours}")
    if len(set(hours)) != len(hours):
        raise ValueError(f"--backlog-hours names an hour twice: {hours}")
    if not 1 <= config.backlog_nodes <= MAX_BACKLOG_NODES:
        raise ValueError(
            f"--backlog-nodes must be 1..{MAX_BACKLOG_NODES}, got {config.backlog_nodes}"
        )
    if config.only_backlog and not config.backlog:
        raise ValueError("--only-backlog and --no-backlog leave nothing to run")
    limit = config.backlog_memory_limit_mb
    if limit is not None and limit < 1:
        raise ValueError(f"--backlog-memory-limit-mb must be at least 1, got {limit}")


def parse_hours(text: str) -> tuple[int, ...]:
    """`6,24` -> (6, 24); ValueError when not whole hours."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--backlog-hours takes whole hours, comma-separated: {text!r}") from None


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
        two_workers=not args.no_two_workers,
        alerts=not args.no_alerts,
        backlog_hours=None if args.backlog_hours is None else parse_hours(args.backlog_hours),
        backlog_nodes=args.backlog_nodes,
        backlog=not args.no_backlog,
        only_backlog=args.only_backlog,
        backlog_memory_limit_mb=args.backlog_memory_limit_mb,
    )


def main(args: argparse.Namespace, settings: Settings, config: WorkerBenchConfig) -> int:
    """Run; print the summary or one JSON line; write the plot when asked."""

    def say(message: str) -> None:
        if not args.json:
            print(f"... {message}", file=sys.stderr, flush=True)

    if config.only_backlog:
        histories = bench_histories(settings, config, say)
        fields = history_fields(histories)
        print(
            json.dumps(fields, sort_keys=True)
            if args.json
            else "\n".join(["worker far behind, recorded history:", *format_histories(histories)])
        )
        return 0
    run = bench_worker(settings, config, say)
    if args.plot is not None:
        write_plot(run, args.plot)
    print(
        worker_json(run.result, run.two, run.alerts, run.backlog)
        if args.json
        else format_worker(run.result, run.two, run.alerts, run.backlog)
    )
    return 0


def main_alerts(args: argparse.Namespace, settings: Settings, config: WorkerBenchConfig) -> int:
    """`gpuwatch bench alerts`: the idle-alert part alone; its summary or one JSON line."""

    def say(message: str) -> None:
        if not args.json:
            print(f"... {message}", file=sys.stderr, flush=True)

    result = bench_alerts(settings, scratch.redis_url(settings, config.redis_db), say)
    print(
        json.dumps(alert_fields(result), sort_keys=True)
        if args.json
        else "\n".join(format_alerts(result))
    )
    return 0


# -- the run ------------------------------------------------------------------------------

Say = Callable[[str], None]


def bench_worker(settings: Settings, config: WorkerBenchConfig, say: Say) -> WorkerRun:
    """Run the worker benchmark on the local stack (see the module docstring)."""
    say("producer figure")
    ticks = 2000 if config.producer_kafka else 500
    producer = bench_producer(settings, ticks, config.gpus, config.producer_kafka, 5.0)
    say(f"simulating {config.nodes} nodes x {config.gpus} GPUs for {config.seconds} s")
    # The paced load goes on from the backlog's end: that far back, its data is never ahead
    # of the wall clock (a worker dead-letters data past GPUWATCH_MAX_CLOCK_SKEW_S ahead).
    t0 = int((time.time() - config.seconds - 5 - config.paced_lead_s) * 1000)
    fleet = build_fleet(
        config.nodes, config.gpus, config.seconds, t0, config.watch, interval_s=config.interval_s
    )
    broker = broker_pid(settings)
    redis_url = scratch.redis_url(settings, config.redis_db)
    run = _one_worker(settings, config, fleet, redis_url=redis_url, broker=broker, say=say)
    result = replace(
        run.result,
        producer_cpu_us_per_gpu_sample=producer.paced_cpu_us_per_gpu_sample
        or producer.tick_cpu_us_per_gpu_sample,
        producer_figure="agent loop at 10 Hz with Kafka"
        if producer.paced_cpu_us_per_gpu_sample
        else "tick: read, resolve, assemble, encode; no Kafka",
    )
    two = alerts = None
    if config.two_workers:
        drain = bench_two_workers(settings, fleet, redis_url, say, broker=broker)
        two = two_worker_figures(
            drain,
            gpu_samples=fleet.gpu_samples,
            lone_rate=result.gpu_samples_per_s,
            lone_cpu_us=result.worker_cpu_us_per_gpu_sample,
        )
    if config.alerts:
        alerts = bench_alerts(settings, redis_url, say)
    backlog = bench_histories(settings, config, say)
    return WorkerRun(result, run.latencies, two=two, alerts=alerts, backlog=backlog)


def bench_histories(settings: Settings, config: WorkerBenchConfig, say: Say) -> Histories:
    """Each history asked for, worked off by a worker of its own (none with --no-backlog)."""
    histories = Histories(config.backlog_hours)
    if not config.backlog:
        return histories
    redis_url = scratch.redis_url(settings, config.redis_db)
    for hours in config.backlog_hours:
        setup = HistorySetup(
            hours,
            config.backlog_nodes,
            config.gpus,
            memory_limit_mb=config.backlog_memory_limit_mb,
        )
        histories.runs[hours] = bench_history(settings, redis_url, setup, say)
    return histories


def _one_worker(
    settings: Settings,
    config: WorkerBenchConfig,
    fleet: Fleet,
    *,
    redis_url: str,
    broker: int | None,
    say: Say,
) -> WorkerRun:
    """The worker and its Redis sink on the fleet, then the baselines on its backlog."""
    with scratch.space(settings, redis_url) as (scoped, tmp):
        worker = WorkerProcess(scoped, redis_url, tmp / "worker.log")
        sink = SinkProcess(scoped, redis_url, tmp / "sink.log")
        with supervised([worker, sink]):
            say("worker and Redis sink: starting")
            drain = drain_backlog(scoped, fleet, [worker], say, sink=sink, broker=broker)
            run = _paced(
                scoped,
                config,
                fleet,
                running=(worker, sink),
                drain=drain,
                redis_url=redis_url,
                say=say,
            )
        say("baselines: bare aiokafka consumer, Faust floor, inbox floor")
        samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
        bare = attempt(lambda: asyncio.run(bare_consumer(scoped, samples, drain.ends)))
        floor = attempt(lambda: faust_floor(scoped, redis_url, samples, drain.ends))
        inbox = attempt(lambda: faust_floor(scoped, redis_url, samples, drain.ends, inbox=True))
    return WorkerRun(with_baselines(run.result, bare, floor, inbox), run.latencies)


def with_baselines(
    result: WorkerResult, bare: Baseline, floor: Baseline, inbox: Baseline
) -> WorkerResult:
    """The result with the baselines' figures; a failed one's null, with its error."""

    def rate(b: Baseline) -> float | None:
        return None if b.run is None else b.run.gpu_samples_per_s

    def cpu(b: Baseline) -> float | None:
        return None if b.run is None else b.run.cpu_us_per_gpu_sample

    return replace(
        result,
        baseline_gpu_samples_per_s=rate(bare),
        baseline_cpu_us_per_gpu_sample=cpu(bare),
        baseline_error=bare.error,
        faust_floor_gpu_samples_per_s=rate(floor),
        faust_floor_cpu_us_per_gpu_sample=cpu(floor),
        faust_floor_error=floor.error,
        inbox_floor_gpu_samples_per_s=rate(inbox),
        inbox_floor_cpu_us_per_gpu_sample=cpu(inbox),
        inbox_floor_error=inbox.error,
    )


def _paced(
    scoped: Settings,
    config: WorkerBenchConfig,
    fleet: Fleet,
    *,
    running: tuple[WorkerProcess, SinkProcess],
    drain: Drain,
    redis_url: str,
    say: Say,
) -> WorkerRun:
    """The paced load after the backlog: latency to Redis, and the worker's pace."""
    worker, _ = running
    samples = NVML_SAMPLES.full_name(scoped.kafka.topic_prefix)
    messages_per_s = config.paced_gpu_samples_per_s / fleet.gpus
    with (
        LatencyProbe(redis_url, fleet.watched.values()) as probe,
        CommitWatcher(scoped, samples, POLL_S) as commits,
    ):
        # The sink lags the stream: the paced load starts once the watched GPUs show their
        # last backlog sample in Redis, so that it measures the pipeline, not the backlog.
        backlog_end = {fleet.last[i].gpus[0].uuid: fleet.paced_end(i, 0) for i in fleet.watched}
        if not wait_for(
            lambda: all((probe.latest(u) or 0) >= end for u, end in backlog_end.items()),
            running,
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
        say("paced load sent; waiting for the worker and the sink to catch up")
        caught_up = wait_for(
            lambda: (
                commits.latest() - before >= paced.messages
                and all((probe.latest(u) or 0) >= end for u, end in last_end.items())
            ),
            running,
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
    return WorkerRun(result, latencies)


def _result(
    config: WorkerBenchConfig,
    fleet: Fleet,
    worker: WorkerProcess,
    *,
    drain: Drain,
    paced: PacedResult,
    processed: float,
    latencies: Latencies,
) -> WorkerResult:
    """The figures of one run: the drain of the backlog, then the paced load's latencies."""
    values = [ms for _, ms in latencies.samples]
    pods = fleet.pods
    sink = drain.sink
    if sink is None:
        raise ValueError("the one-worker run has a Redis sink")
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
        worker_cpu_us_per_gpu_sample=drain.cpu_s[0] / fleet.gpu_samples * 1e6,
        worker_cores=drain.cpu_s[0] / drain.seconds,
        broker_cores=None if drain.broker_cpu_s is None else drain.broker_cpu_s / drain.seconds,
        sink_cpu_us_per_gpu_sample=sink.cpu_s / fleet.gpu_samples * 1e6,
        sink_cores=sink.cpu_s / sink.seconds,
        sink_drain_s=sink.seconds,
        sink_rss_mb=sink.rss_mb,
        sink_rss_peak_mb=sink.peak_mb,
        sink_kafka_errors=sink.kafka_errors,
        baseline_gpu_samples_per_s=None,
        baseline_cpu_us_per_gpu_sample=None,
        faust_floor_gpu_samples_per_s=None,
        faust_floor_cpu_us_per_gpu_sample=None,
        inbox_floor_gpu_samples_per_s=None,
        inbox_floor_cpu_us_per_gpu_sample=None,
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
