"""`gpuwatch simulate`: a synthetic GPU cluster driving the real producers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpuwatch.cli.common import UserFacingError, daemon_logging, progress
from gpuwatch.cli.options import (
    add_cluster,
    add_duration,
    add_flag,
    add_float,
    add_int,
    add_scenario,
    add_speed,
    add_verb,
    with_cluster,
)
from schemas.settings import Settings

DESCRIPTION = (
    "Simulate a Kubernetes GPU cluster from a scenario file and run the real "
    "producers against it: every simulated node's node agent (simulated GPUs whose "
    "processes and kubelet allocations follow the pods) publishes to nvml.samples, and "
    "the Kubernetes watcher, watching an in-process API server (with --kube: the local "
    "stack's kube-apiserver), publishes pod and node "
    "changes to k8s.pods and k8s.nodes. Pods are created, scheduled (or left Pending, "
    "Unschedulable), pull, run, complete, get OOMKilled or crash-loop at the times the "
    "scenario gives. Event time starts at --epoch (default: now) and advances by the "
    "sample interval each tick; ticks come every interval/--speed wall seconds, so "
    "--speed 10 shows ten simulated minutes per real minute (event time then runs ahead "
    "of the wall clock: start fast runs in the past with --epoch, as the worker "
    "dead-letters data more than GPUWATCH_MAX_CLOCK_SKEW_S, 300 s, ahead of its clock). "
    "Deterministic for a seed. "
    "Shipped scenarios (gpuwatch/harness/simulate/scenarios/README.md): small, fleet, "
    "incident, dra; --list shows them. The simulated node agents serve their metrics on "
    "GPUWATCH_AGENT_METRICS_PORT (9481, one `node` label per node) and the watcher on "
    "GPUWATCH_WATCHER_METRICS_PORT (9482), as the real ones do; --no-metrics turns "
    "that off. Every message names the simulated cluster (--cluster, GPUWATCH_CLUSTER): two "
    "simulations of one scenario with different --cluster publish the same node names "
    "under two clusters. "
    "The topics must exist (`gpuwatch topics create`). SIGTERM or Ctrl-C stops it; a "
    "summary of what was published and where each pod ended is printed."
)
KUBE_HELP = (
    "write the simulated cluster to the local stack's kube-apiserver (starting the stack "
    "with it, `gpuwatch stack up --kube`, unless it runs) and watch it there, playing the "
    "scheduler and the kubelet; the command prints the kubeconfig for `kubectl get pods -A "
    "-w`. Its objects are labelled app.kubernetes.io/managed-by=gpuwatch-simulate and stay "
    "after the run; the next run deletes them, and nothing else, first. The server picks "
    "uids and stamps creation times with its wall clock: a pod the scenario created before "
    "the start shows as created when the simulation wrote it, and its status times from "
    "before then (a start, a transition) as that time; later times are the simulation's "
    "own (so leave --epoch at now). One simulation at a time per API server."
)


def add_parser(verbs: Any) -> None:
    """The `simulate` verb."""
    simulate = add_verb(
        verbs,
        "simulate",
        _simulate,
        "a synthetic GPU cluster driving the real producers from a scenario",
        DESCRIPTION,
    )
    add_scenario(simulate, "a shipped scenario by name, or a scenario YAML file (default: small)")
    add_flag(simulate, "--list", "list the shipped scenarios", dest="list_scenarios")
    add_speed(simulate, "event time runs FACTOR times faster than wall time (default: 1)")
    add_duration(simulate, "stop after this many wall seconds (default: never)")
    add_float(
        simulate,
        "--until",
        "stop when this many simulated seconds have passed (default: never)",
        dest="until_s",
    )
    add_int(simulate, "--nodes", "N", "N nodes in every node pool", dest="sim_nodes")
    add_int(simulate, "--gpus-per-node", "G", "G GPUs on every node (1 to 16)")
    add_int(simulate, "--seed", "N", "random seed (default: the scenario's)", dest="sim_seed")
    simulate.add_argument(
        "--epoch",
        metavar="TIME",
        help="event time of the start: epoch seconds or ISO 8601 such as "
        "2025-11-29T10:00:00Z (default: now)",
    )
    add_float(
        simulate,
        "--interval",
        "simulated seconds between samples (env: GPUWATCH_AGENT_INTERVAL_S, default 1.0)",
    )
    add_cluster(simulate)
    add_flag(simulate, "--kube", KUBE_HELP)
    add_flag(simulate, "--no-topic-check", "do not check that the topics exist before starting")
    add_flag(
        simulate,
        "--no-metrics",
        "serve no /metrics (default: the agents' on GPUWATCH_AGENT_METRICS_PORT, "
        "the watcher's on GPUWATCH_WATCHER_METRICS_PORT)",
    )


def _simulate(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.harness.run import simulate

    if args.list_scenarios:
        return _list_scenarios()
    daemon_logging(args)  # a long-running producer says what it does
    try:
        epoch = None if args.epoch is None else simulate.parse_epoch(args.epoch)
    except ValueError as exc:
        raise UserFacingError(f"--epoch: {exc}") from exc
    if args.speed <= 0:
        raise UserFacingError(f"--speed must be above 0, not {args.speed:g}")
    options = simulate.SimulateOptions(
        scenario=args.scenario,
        speed=args.speed,
        duration_s=args.duration,
        until_s=args.until_s,
        nodes=args.sim_nodes,
        gpus_per_node=args.gpus_per_node,
        seed=args.sim_seed,
        epoch_s=epoch,
        check_topics=not args.no_topic_check,
        metrics=not args.no_metrics,
        kube=args.kube,
    )
    try:
        return simulate.run(with_cluster(settings, args), options, progress)
    except simulate.SimulateMetricsError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 2
    except simulate.SimulateStartError as exc:
        raise UserFacingError(str(exc)) from exc


def _list_scenarios() -> int:
    from gpuwatch.harness.run import simulate

    for name in simulate.scenario_names():
        try:
            description = simulate.load(name).description
        except simulate.ScenarioError as exc:
            description = f"(unusable: {exc})"
        print(f"{name:<10} {description}")
    return 0
