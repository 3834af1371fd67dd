"""`gpuwatch bench`: the benchmarks of BENCHMARKS.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuwatch.cli.common import UserFacingError
from gpuwatch.cli.options import add_flag, add_float, add_int, add_verb
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `bench` verb: `worker` (the default), `alerts` or `producer`."""
    bench = add_verb(
        verbs,
        "bench",
        _bench,
        "the benchmarks of BENCHMARKS.md",
        "Run the benchmarks of BENCHMARKS.md against the local stack (`gpuwatch stack up`). Each "
        "reports a ratio against a baseline measured in the same run, so a figure from a loaded "
        "machine still compares. `worker` (the default): a worker process and a `gpuwatch sink "
        "redis` process on a simulated fleet's stream (throughput against a bare aiokafka consumer"
        " and the Faust and inbox floors, the sink's CPU per GPU-sample, latency to Redis under a "
        "paced load, memory, and the node agent's CPU per GPU-sample); then two workers in one "
        "consumer group on the same backlog; then the idle-alert latency (`alerts`); then a worker"
        " far behind: for each of --backlog-hours (6 and 24; with --quick 1 and 4), "
        "--backlog-nodes nodes x 8 GPUs (125; 25 with --quick) sampled every 57 s over that many "
        "hours, produced while the worker is paused, then worked off: GPU-samples, seconds to work"
        " off (its group committed every sample), GPU-samples/s, worker CPU per GPU-sample, the "
        "worker's VmHWM and its RSS at the end over its idle RSS, and its restarts (it is "
        "restarted as Kubernetes would: on exit, or after 3 failed /livez probes 20 s apart), "
        "fields backlog_{hours}h_*. Each part on topics, an app id, groups and a Redis database of"
        " its own, removed afterwards. A baseline that fails or runs past its deadline leaves its "
        "figures null with an error field (baseline_error, faust_floor_error, inbox_floor_error). "
        "`alerts`: on a few nodes with a 10 s idle threshold, from the sample completing it to the"
        " GpuIdleAllocated alert in the alerts topic, in Redis and in the ALERTS of a private "
        "Prometheus (the `prometheus` binary, 1 s scrape and evaluation, the shipped rules), "
        "beside a DCGM exporter + Prometheus setup's figure. `producer`: CPU time of the node "
        "agent per GPU-sample with simulated GPUs, alone and with publishing to the local Kafka.",
    )
    bench.add_argument(
        "which",
        nargs="?",
        default="worker",
        choices=["alerts", "producer", "worker"],
        help="benchmark to run (worker)",
    )
    add_flag(bench, "--json", "print one JSON line")
    add_flag(bench, "--quick", "a smaller run (seconds)")
    bench.add_argument("--gpus", type=int, default=8, metavar="N", help="GPUs per node (8)")
    add_flag(bench, "--no-kafka", "skip the part that publishes to Kafka")
    worker = bench.add_argument_group("worker")
    add_int(worker, "--nodes", "N", "nodes of the fleet (5000)")
    add_int(worker, "--seconds", "S", "seconds of samples in the backlog (10)")
    add_float(
        worker,
        "--interval",
        "seconds between a node's samples in the backlog (1; recorded history: 30, 57)",
        metavar="S",
    )
    add_float(worker, "--rate", "paced load in GPU-samples/s (40000)", metavar="R")
    add_float(worker, "--paced-seconds", "length of the paced load (30)", metavar="S")
    add_int(worker, "--redis-db", "DB", "scratch Redis database, flushed (6; also `alerts`)")
    add_flag(worker, "--no-two-workers", "skip the run of two workers in one group")
    add_flag(worker, "--no-alerts", "skip the idle-alert part")
    worker.add_argument(
        "--backlog-hours",
        metavar="H,H",
        help="hours of recorded history the worker works off, each a run of its own "
        "(6,24; with --quick 1,4)",
    )
    add_int(
        worker,
        "--backlog-nodes",
        "N",
        "8-GPU nodes of each history (125, 1,000 GPUs; with --quick 25; 18 for a fleet the "
        "size of the recorded production history's 143 GPUs)",
    )
    add_flag(worker, "--no-backlog", "skip the recorded-history part (its fields are null)")
    add_flag(
        worker,
        "--only-backlog",
        "the recorded-history part alone (no producer figure, no live worker, no other part); "
        "its fields only",
    )
    add_int(
        worker,
        "--backlog-memory-limit-mb",
        "MB",
        "cap the history worker's address space (RLIMIT_AS) at its idle VmPeak plus MB, and "
        "report whether it finished (off)",
    )
    worker.add_argument("--plot", type=Path, metavar="PNG", help="write the plot there")


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.harness.bench import run as bench
    from gpuwatch.harness.bench import worker as bench_worker
    from gpuwatch.plotting import unavailable

    if (no_plot := unavailable(getattr(args, "plot", None))) is not None:
        print(f"gpuwatch: {no_plot}", file=sys.stderr)
        return 2
    config = None
    if args.which in ("worker", "alerts"):
        try:
            config = bench_worker.config_from_args(args)
        except ValueError as exc:
            raise UserFacingError(f"bench {args.which}: {exc}") from exc
    if config is not None or not args.no_kafka:
        missing = bench.missing_services(settings, redis=config is not None)
        if config is not None and (args.which == "alerts" or config.alerts):
            missing += bench.missing_binaries(["prometheus"])
        if missing:
            raise UserFacingError(
                f"bench {args.which}: {'; '.join(missing)}. Start the local stack with "
                "`gpuwatch stack up`, or point GPUWATCH_KAFKA_BOOTSTRAP / GPUWATCH_REDIS_URL "
                "at running ones."
            )
    if config is not None and args.which == "alerts":
        return bench_worker.main_alerts(args, settings, config)
    if config is not None:
        return bench_worker.main(args, settings, config)
    ticks = 500 if args.quick else 5000
    result = bench.bench_producer(
        settings, ticks, args.gpus, kafka=not args.no_kafka, paced_seconds=5 if args.quick else 20
    )
    print(bench.producer_json(result) if args.json else bench.format_producer(result))
    return 0
