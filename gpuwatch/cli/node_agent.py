"""`gpuwatch node-agent`: the NVML producer of one GPU node."""

from __future__ import annotations

import argparse
from typing import Any

from gpuwatch.cli.common import UserFacingError, daemon_logging
from gpuwatch.cli.options import (
    add_cluster,
    add_duration,
    add_float,
    add_int,
    add_verb,
    with_cluster,
)
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `node-agent` verb."""
    agent = add_verb(
        verbs,
        "node-agent",
        _node_agent,
        "the NVML producer of one GPU node",
        "Sample every GPU and MIG instance of this node through NVML on a "
        "drift-free schedule, resolve each GPU process to its pod (/proc/PID/cgroup), read "
        "which pod holds which device (kubelet PodResources socket; a device allocated "
        "through a ResourceClaim is found by uuid in this node's ResourceSlices, read from "
        "the API server once one is listed, GPUWATCH_DRA_DRIVERS), and publish one "
        "gpuwatch.nvml.sample/v1 message per tick to the nvml.samples topic, naming the "
        "cluster (--cluster, GPUWATCH_CLUSTER). Sampling "
        "never waits for Kafka: samples stay in a bounded buffer until the broker "
        "acknowledges them, however long it is away (when full, the oldest are dropped "
        "first, counted). Self-metrics on GPUWATCH_AGENT_METRICS_PORT (default 9481). "
        "SIGTERM flushes for up to 10 s and exits.",
    )
    agent.add_argument(
        "--backend",
        choices=["nvml", "sim"],
        default="nvml",
        help="nvml: the real driver (a GPU node); sim: simulated GPUs (default: nvml)",
    )
    add_float(
        agent,
        "--interval",
        "seconds between samples, 0.1 to 60 (env: GPUWATCH_AGENT_INTERVAL_S, default 1.0)",
    )
    agent.add_argument(
        "--node", metavar="NAME", help="node name (env: GPUWATCH_NODE_NAME, default: hostname)"
    )
    add_int(agent, "--metrics-port", "PORT", "self-metrics port (default 9481)")
    add_cluster(agent)
    agent.add_argument("--sim-gpus", type=int, default=8, metavar="N", help="sim: GPUs (8)")
    agent.add_argument(
        "--sim-model", default="h100", choices=["h100", "h200", "l40s"], help="sim: GPU model"
    )
    agent.add_argument("--seed", type=int, default=0, help="sim: random seed (0)")
    add_duration(agent, "stop after this long (default: never)")


def _node_agent(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.run import agent as node_agent

    daemon_logging(args)
    options = node_agent.AgentOptions(
        backend=args.backend,
        sim_gpus=args.sim_gpus,
        sim_model=args.sim_model,
        seed=args.seed,
        duration_s=args.duration,
    )
    try:
        return node_agent.run(with_cluster(settings, args), options)
    except node_agent.AgentStartError as exc:
        raise UserFacingError(str(exc)) from exc
