"""`gpuwatch demo`: the whole product on this machine."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpuwatch.cli.common import UserFacingError, progress
from gpuwatch.cli.options import add_duration, add_flag, add_scenario, add_speed, add_verb
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `demo` verb."""
    demo = add_verb(
        verbs,
        "demo",
        _demo,
        "the whole product on this machine: stack, topics, simulated cluster, worker, view",
        "Start what is missing of the local stack (Kafka, Redis, Prometheus), "
        "create the topics, run the worker, the sinks (`gpuwatch sink redis`, `gpuwatch sink "
        "metrics`) and a simulated cluster (`gpuwatch simulate`) and "
        "show the live view (`gpuwatch top`) until Ctrl-C. Ctrl-C stops what the demo started, "
        "the stack too unless it was already running or --keep-stack is given; so do "
        "SIGTERM, SIGHUP and an output nobody reads any more (`| tee`, the tee gone), and "
        "the worker, sinks and simulator stop by themselves if the demo is killed. The demo "
        "shortens the stall and alert rules (GPUWATCH_STALL_AFTER_S=120, "
        "GPUWATCH_QUEUED_ALERT_AFTER_S=180, GPUWATCH_IDLE_ALERT_AFTER_S=60) unless they are "
        "set. Above --speed 1 simulated time outruns the wall clock: the demo starts it in "
        "the past so that it meets the clock at the end of --duration (or after an hour), "
        "but with --kube it starts now. A worker dead-letters data more than "
        "GPUWATCH_MAX_CLOCK_SKEW_S (300 s) ahead of its clock, so where the run gets further "
        "ahead (no --duration, or --kube) the demo's worker takes the run's lead plus that, "
        "at most a day, unless GPUWATCH_MAX_CLOCK_SKEW_S is set. Logs go to the stack's log "
        "directory (demo-worker.log, demo-sink.log, demo-metrics.log, demo-simulate.log). "
        "--clusters a,b runs one simulated cluster per name into the same pipeline "
        "(demo-simulate-a.log, ...). --kube runs the stack's "
        "Kubernetes API server too and the simulated cluster on it (`gpuwatch simulate "
        "--kube`): the real watcher watches a real kube-apiserver, and the demo prints the "
        "kubeconfig to watch the pods with kubectl.",
    )
    add_scenario(
        demo, "simulated cluster: small, fleet, incident, dra or a YAML file (default: small)"
    )
    add_speed(demo, "simulated time runs FACTOR times faster than wall time (default: 1)")
    add_duration(demo, "stop after this many seconds (default: at Ctrl-C)", dest="demo_duration")
    demo.add_argument(
        "--clusters",
        type=_cluster_names,
        default=(),
        metavar="NAME,NAME",
        help="simulate several clusters into one pipeline, each the scenario with the same "
        "node and pod names (see them apart with `gpuwatch top`, one with `--cluster NAME`)",
    )
    add_flag(
        demo,
        "--kube",
        "the simulated cluster on the stack's kube-apiserver (`gpuwatch stack up --kube`; "
        "built once, minutes), for kubectl to see; one cluster only. Simulated time then "
        "starts now whatever --speed (the server stamps pods' creation with its wall clock), "
        "and a pod that was running before the start shows as created and started then",
    )
    add_flag(demo, "--no-ui", "no live view: wait, then print `gpuwatch top --once` at the end")
    add_flag(
        demo,
        "--keep-stack",
        "leave the stack running at the end, to look at Prometheus and Redis after",
    )


def _cluster_names(value: str) -> tuple[str, ...]:
    from schemas.settings import cluster_name

    names = tuple(part.strip() for part in value.split(","))
    try:
        checked = tuple(cluster_name(name) for name in names)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if len(set(checked)) != len(checked):
        raise argparse.ArgumentTypeError(f"{value!r} names a cluster twice")
    return checked


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.harness.run import demo

    if args.speed <= 0 or (args.demo_duration is not None and args.demo_duration <= 0):
        raise UserFacingError("demo: --speed and --duration must be positive")
    if args.kube and args.clusters:
        raise UserFacingError(
            "demo: --kube takes one simulated cluster: on one API server the clusters' pods "
            "would have the same names"
        )
    options = demo.DemoOptions(
        scenario=args.scenario,
        speed=args.speed,
        duration_s=args.demo_duration,
        ui=not args.no_ui,
        keep_stack=args.keep_stack,
        clusters=args.clusters,
        kube=args.kube,
    )
    try:
        return demo.run(settings, options, sys.stdout, progress)
    except demo.DemoError as exc:
        raise UserFacingError(f"demo: {exc}") from exc
    finally:
        _let_go_of_a_closed_stdout()


def _let_go_of_a_closed_stdout() -> None:
    """Where nobody reads stdout any more (`gpuwatch demo | tee`, the tee gone), point it
    at /dev/null: Python's flush at exit would print a BrokenPipeError traceback."""
    try:
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
