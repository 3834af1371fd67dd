"""The `gpuwatch` command: one console script, one verb per job (DESIGN.md §6)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuwatch import __version__
from gpuwatch.config import SettingsError, load_settings
from schemas.settings import Settings

log = logging.getLogger(__name__)

Handler = Callable[[argparse.Namespace, Settings], int]

EPILOG = """\
settings come from GPUWATCH_* environment variables and an optional YAML file
(--config or GPUWATCH_CONFIG); flags override both. `gpuwatch settings` prints the
settings in force. Quick start: `make demo`; tests: `make test`.
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="gpuwatch",
        description="Real-time GPU observability and cost attribution for Kubernetes: "
        "per-pod GPU share, VRAM, lifecycle (queued, running, stalled, finished), "
        "idle/waste windows and cost, streamed through Kafka into Redis and Prometheus.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuwatch {__version__}")
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML settings file (env: GPUWATCH_CONFIG)"
    )
    parser.add_argument(
        "--kafka-bootstrap",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (env: GPUWATCH_KAFKA_BOOTSTRAP)",
    )
    parser.add_argument(
        "--topic-prefix", metavar="PREFIX", help="topic name prefix (env: GPUWATCH_TOPIC_PREFIX)"
    )
    parser.add_argument("--redis-url", metavar="URL", help="Redis URL (env: GPUWATCH_REDIS_URL)")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default: WARNING)",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    _add_stack(verbs)
    _add_topics(verbs)
    _add_node_agent(verbs)
    _add_k8s_watcher(verbs)
    _add_worker(verbs)
    _add_simulate(verbs)
    _add_bench(verbs)
    _add_demo(verbs)
    _add_top(verbs)
    _add_replay(verbs)
    _add_settings(verbs)
    return parser


def _add_stack(verbs: Any) -> None:
    stack = verbs.add_parser(
        "stack",
        help="local Kafka (KRaft), Redis and Prometheus without Docker",
        description="Run the local stack as plain processes: Apache Kafka 4.x in KRaft mode "
        "(jars fetched from Maven Central on first use into the cache directory), "
        "redis-server and prometheus from the OS packages. Data, logs and pid files live "
        "in the state directory (GPUWATCH_STATE_DIR, default ~/.local/state/gpuwatch).",
    )
    actions = stack.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser(
        "up",
        help="start what is not running (idempotent)",
        description="Start Kafka on 127.0.0.1:9092, Redis on 6379 and Prometheus on 9090 "
        "(idempotent: each unless already running), and wait until each answers (Kafka: a metadata "
        "request; Redis: PING; Prometheus: /-/ready).",
    ).set_defaults(handler=_stack_up)
    actions.add_parser(
        "down",
        help="stop what `stack up` started",
        description="Stop the services this state directory started; services found "
        "running but started by someone else are left alone. Data and logs are kept.",
    ).set_defaults(handler=_stack_down)
    actions.add_parser(
        "status",
        help="show each service; exit 1 if one is down",
        description="Show each service with its state, port, pid and log file. Exits 1 "
        "when any service is down.",
    ).set_defaults(handler=_stack_status)


def _add_topics(verbs: Any) -> None:
    topics = verbs.add_parser(
        "topics",
        help="create the Kafka topics",
        description="Manage the topics of DESIGN.md §3, named with the topic prefix.",
    )
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        help="create every topic (idempotent)",
        description="Create every gpuwatch topic with its retention and cleanup policy and "
        "one partition count for all, so the topics keyed by pod uid are co-partitioned. "
        "Existing topics are kept; an existing topic with another partition count is "
        "reported and the command exits 1 (co-partitioning would be broken).",
    )
    create.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help="partitions per topic (env: GPUWATCH_KAFKA_PARTITIONS, default 12)",
    )
    create.add_argument(
        "--replication-factor",
        type=int,
        metavar="N",
        help="replication factor (env: GPUWATCH_KAFKA_REPLICATION_FACTOR, default 1)",
    )
    create.set_defaults(handler=_topics_create)
    actions.add_parser(
        "list",
        help="show the gpuwatch topics and their partition counts",
        description="Show every gpuwatch topic with the prefix, whether it exists and its "
        "partition count. Exits 1 when one is missing.",
    ).set_defaults(handler=_topics_list)


def _add_node_agent(verbs: Any) -> None:
    agent = verbs.add_parser(
        "node-agent",
        help="the NVML producer of one GPU node",
        description="Sample every GPU and MIG instance of this node through NVML on a "
        "drift-free schedule, resolve each GPU process to its pod (/proc/PID/cgroup), read "
        "which pod holds which device (kubelet PodResources socket), and publish one "
        "gpuwatch.nvml.sample/v1 message per tick to the nvml.samples topic. Sampling "
        "never waits for Kafka: samples wait in a bounded buffer (oldest dropped first, "
        "counted) while the broker is away. Self-metrics on GPUWATCH_AGENT_METRICS_PORT "
        "(default 9481). SIGTERM flushes and exits.",
    )
    agent.add_argument(
        "--backend",
        choices=["nvml", "sim"],
        default="nvml",
        help="nvml: the real driver (a GPU node); sim: simulated GPUs (default: nvml)",
    )
    agent.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="seconds between samples, 0.1 to 60 (env: GPUWATCH_AGENT_INTERVAL_S, default 1.0)",
    )
    agent.add_argument(
        "--node", metavar="NAME", help="node name (env: GPUWATCH_NODE_NAME, default: hostname)"
    )
    agent.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="self-metrics port (default 9481)"
    )
    agent.add_argument("--sim-gpus", type=int, default=8, metavar="N", help="sim: GPUs (8)")
    agent.add_argument(
        "--sim-model", default="h100", choices=["h100", "h200", "l40s"], help="sim: GPU model"
    )
    agent.add_argument("--seed", type=int, default=0, help="sim: random seed (0)")
    agent.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: never)"
    )
    agent.set_defaults(handler=_node_agent)


def _add_simulate(verbs: Any) -> None:
    simulate = verbs.add_parser(
        "simulate",
        help="a synthetic GPU cluster driving the real producers from a scenario",
        description="Simulate a Kubernetes GPU cluster from a scenario file and run the real "
        "producers against it: every simulated node's node agent (simulated GPUs whose "
        "processes and kubelet allocations follow the pods) publishes to nvml.samples, and "
        "the Kubernetes watcher, watching an in-process API server, publishes pod and node "
        "changes to k8s.pods and k8s.nodes. Pods are created, scheduled (or left Pending, "
        "Unschedulable), pull, run, complete, get OOMKilled or crash-loop at the times the "
        "scenario gives. Event time starts at --epoch (default: now) and advances by the "
        "sample interval each tick; ticks come every interval/--speed wall seconds, so "
        "--speed 10 shows ten simulated minutes per real minute (event time then runs ahead "
        "of the wall clock: start long fast runs in the past with --epoch, as the worker "
        "refuses data more than a day ahead of its clock). Deterministic for a seed. "
        "Shipped scenarios (producers/simulate/scenarios/README.md): small, fleet, incident; "
        "--list shows them. The simulated node agents serve their metrics on "
        "GPUWATCH_AGENT_METRICS_PORT (9481, one `node` label per node) and the watcher on "
        "GPUWATCH_WATCHER_METRICS_PORT (9482), as the real ones do; --no-metrics turns "
        "that off. "
        "The topics must exist (`gpuwatch topics create`). SIGTERM or Ctrl-C stops it; a "
        "summary of what was published and where each pod ended is printed.",
    )
    simulate.add_argument(
        "--scenario",
        default="small",
        metavar="NAME|FILE",
        help="a shipped scenario by name, or a scenario YAML file (default: small)",
    )
    simulate.add_argument(
        "--list", action="store_true", dest="list_scenarios", help="list the shipped scenarios"
    )
    simulate.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="event time runs FACTOR times faster than wall time (default: 1)",
    )
    simulate.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="stop after this many wall seconds (default: never)",
    )
    simulate.add_argument(
        "--until",
        type=float,
        metavar="SECONDS",
        dest="until_s",
        help="stop when this many simulated seconds have passed (default: never)",
    )
    simulate.add_argument(
        "--nodes", type=int, metavar="N", dest="sim_nodes", help="N nodes in every node pool"
    )
    simulate.add_argument(
        "--gpus-per-node", type=int, metavar="G", help="G GPUs on every node (1 to 16)"
    )
    simulate.add_argument(
        "--seed",
        type=int,
        dest="sim_seed",
        metavar="N",
        help="random seed (default: the scenario's)",
    )
    simulate.add_argument(
        "--epoch",
        metavar="TIME",
        help="event time of the start: epoch seconds or ISO 8601 such as "
        "2025-11-29T10:00:00Z (default: now)",
    )
    simulate.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="simulated seconds between samples (env: GPUWATCH_AGENT_INTERVAL_S, default 1.0)",
    )
    simulate.add_argument(
        "--no-topic-check",
        action="store_true",
        help="do not check that the topics exist before starting",
    )
    simulate.add_argument(
        "--no-metrics",
        action="store_true",
        help="serve no /metrics (default: the agents' on GPUWATCH_AGENT_METRICS_PORT, "
        "the watcher's on GPUWATCH_WATCHER_METRICS_PORT)",
    )
    simulate.set_defaults(handler=_simulate)


def _add_bench(verbs: Any) -> None:
    bench = verbs.add_parser(
        "bench",
        help="the benchmarks of BENCHMARKS.md",
        description="Run the benchmarks of BENCHMARKS.md against the local stack "
        "(`gpuwatch stack up`). Each reports a ratio against a baseline measured in the same "
        "run, so a figure from a loaded machine still compares. `worker` (the default): one "
        "worker process on a simulated fleet's stream (throughput against a bare aiokafka "
        "consumer, latency to Redis under a paced load, memory, and the node agent's CPU per "
        "GPU-sample), on topics and a Redis database of its own, removed afterwards. "
        "`producer`: CPU time of the node agent per GPU-sample with simulated GPUs, alone "
        "and with publishing to the local Kafka.",
    )
    bench.add_argument(
        "which",
        nargs="?",
        default="worker",
        choices=["producer", "worker"],
        help="benchmark to run (worker)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON line")
    bench.add_argument("--quick", action="store_true", help="a smaller run (seconds)")
    bench.add_argument("--gpus", type=int, default=8, metavar="N", help="GPUs per node (8)")
    bench.add_argument(
        "--no-kafka", action="store_true", help="skip the part that publishes to Kafka"
    )
    worker = bench.add_argument_group("worker")
    worker.add_argument("--nodes", type=int, metavar="N", help="nodes of the fleet (5000)")
    worker.add_argument(
        "--seconds", type=int, metavar="S", help="seconds of samples in the backlog (10)"
    )
    worker.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help="seconds between a node's samples in the backlog (1; recorded history: 30, 57)",
    )
    worker.add_argument(
        "--rate", type=float, metavar="R", help="paced load in GPU-samples/s (40000)"
    )
    worker.add_argument(
        "--paced-seconds", type=float, metavar="S", help="length of the paced load (30)"
    )
    worker.add_argument(
        "--redis-db", type=int, metavar="DB", help="scratch Redis database, flushed (6)"
    )
    worker.add_argument("--plot", type=Path, metavar="PNG", help="write the plot there")
    bench.set_defaults(handler=_bench)


def _add_worker(verbs: Any) -> None:
    worker = verbs.add_parser(
        "worker",
        help="the Faust stream processors: samples and pod events to usage, windows, alerts",
        description="Run the stream worker (a Faust app; the app id GPUWATCH_APP_ID is its "
        "consumer group, so replicas share the partitions). Node side: nvml.samples and "
        "k8s.nodes (keyed by node) to pod.usage, gpu.windows and alerts. Pod side: k8s.pods "
        "and pod.usage (keyed by pod uid) to pod.lifecycle, attribution and alerts. Bad "
        "input goes to the deadletter topic with the reason. State lives in changelog-backed "
        "tables and is restored from Kafka on a restart. The topics must exist with one "
        "partition count (`gpuwatch topics create`); the worker creates its internal tick "
        "topic. SIGTERM commits and exits.",
    )
    worker.add_argument(
        "--tick-interval",
        type=float,
        metavar="SECONDS",
        help="seconds between stream-time ticks (GPUWATCH_WORKER_TICK_INTERVAL_S, 1.0)",
    )
    worker.add_argument(
        "--session-timeout",
        type=float,
        metavar="SECONDS",
        help="Kafka session timeout: a silent worker's partitions move after this long "
        "(GPUWATCH_WORKER_SESSION_TIMEOUT_S, 30)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        dest="worker_metrics_port",
        metavar="PORT",
        help="port of the worker's /metrics (GPUWATCH_METRICS_PORT, 9480)",
    )
    worker.add_argument(
        "--no-sinks",
        action="store_true",
        help="publish the derived topics only: no Redis writes, no /metrics "
        "(GPUWATCH_WORKER_SINKS=false)",
    )
    worker.add_argument(
        "--instance", metavar="NAME", help="this worker's name in logs (default: host-pid)"
    )
    worker.set_defaults(handler=_worker)


def _add_k8s_watcher(verbs: Any) -> None:
    defaults = Settings().watcher
    gpu_defaults = ", ".join(
        [*defaults.gpu_resources, *(f"{prefix}*" for prefix in defaults.gpu_resource_prefixes)]
    )
    watcher = verbs.add_parser(
        "k8s-watcher",
        help="the Kubernetes producer: pods and nodes to Kafka",
        description="List and watch Pods and Nodes (one replica, cluster-wide) and publish "
        "every change that matters as gpuwatch.k8s.pod/v1 to k8s.pods (key: pod uid) and "
        "gpuwatch.k8s.node/v1 to k8s.nodes (key: node name). Pods: those that request a GPU "
        "resource in any container or init container, plus the pods named in "
        "GPUWATCH_WATCH_EXTRA_PODS; nodes: those with GPU capacity. A watch resumes from "
        "its last resourceVersion; after 410 Gone it relists and publishes the difference "
        "(RESYNC for changed pods, DELETED for vanished ones). Connects with the in-cluster "
        "service account, else --kubeconfig, $KUBECONFIG or ~/.kube/config; the RBAC it "
        "needs is in deploy/rbac/k8s-watcher.yaml. Self-metrics on "
        "GPUWATCH_WATCHER_METRICS_PORT (default 9482). SIGTERM flushes and exits.",
    )
    watcher.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig file (env: GPUWATCH_KUBECONFIG; default: in-cluster config, "
        "else $KUBECONFIG or ~/.kube/config)",
    )
    watcher.add_argument(
        "--context", metavar="NAME", help="kubeconfig context (env: GPUWATCH_KUBE_CONTEXT)"
    )
    watcher.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        dest="watch_namespaces",
        help="watch this namespace; repeat for several (env: GPUWATCH_WATCH_NAMESPACES, "
        "comma-separated; default: all namespaces, one cluster-wide watch)",
    )
    watcher.add_argument(
        "--selector",
        metavar="SELECTOR",
        help="label selector of the pods to watch, Kubernetes syntax, e.g. "
        "'team=vision,tier!=test' or 'project in (a,b)' (env: GPUWATCH_WATCH_LABEL_SELECTOR)",
    )
    watcher.add_argument(
        "--gpu-resource",
        action="append",
        metavar="NAME",
        dest="gpu_resource",
        help="resource name that makes a pod a GPU pod; a trailing * makes it a prefix "
        f"('nvidia.com/mig-*'); repeat for several; replaces the defaults {gpu_defaults} "
        "(env: GPUWATCH_WATCH_GPU_RESOURCES, GPUWATCH_WATCH_GPU_RESOURCE_PREFIXES)",
    )
    watcher.add_argument(
        "--label",
        action="append",
        metavar="KEY",
        dest="pod_label",
        help="pod label copied into messages (the label allow-list; never all labels); "
        f"repeat for several; replaces the defaults {', '.join(defaults.pod_label_allowlist)} "
        "(env: GPUWATCH_POD_LABEL_ALLOWLIST)",
    )
    watcher.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        dest="watcher_metrics_port",
        help="self-metrics port (env: GPUWATCH_WATCHER_METRICS_PORT, default 9482)",
    )
    watcher.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: never)"
    )
    watcher.set_defaults(handler=_k8s_watcher)


def _gpu_resource_overrides(names: list[str] | None) -> dict[str, Any]:
    if not names:
        return {}
    return {
        "watcher.gpu_resources": tuple(n for n in names if not n.endswith("*")),
        "watcher.gpu_resource_prefixes": tuple(n[:-1] for n in names if n.endswith("*")),
    }


def _add_demo(verbs: Any) -> None:
    demo = verbs.add_parser(
        "demo",
        help="the whole product on this machine: stack, topics, simulated cluster, worker, view",
        description="Start what is missing of the local stack (Kafka, Redis, Prometheus), "
        "create the topics, run the worker and a simulated cluster (`gpuwatch simulate`) and "
        "show the live view (`gpuwatch top`) until Ctrl-C. Ctrl-C stops what the demo started, "
        "the stack too unless it was already running or --keep-stack is given. The demo "
        "shortens the stall and alert rules (GPUWATCH_STALL_AFTER_S=120, "
        "GPUWATCH_QUEUED_ALERT_AFTER_S=180, GPUWATCH_IDLE_ALERT_AFTER_S=60) unless they are "
        "set. Logs go to the stack's log directory (demo-worker.log, demo-simulate.log).",
    )
    demo.add_argument(
        "--scenario",
        default="small",
        metavar="NAME|FILE",
        help="simulated cluster: small, fleet, incident or a YAML file (default: small)",
    )
    demo.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="simulated time runs FACTOR times faster than wall time (default: 1)",
    )
    demo.add_argument(
        "--duration",
        type=float,
        dest="demo_duration",
        metavar="SECONDS",
        help="stop after this many seconds (default: at Ctrl-C)",
    )
    demo.add_argument(
        "--no-ui",
        action="store_true",
        help="no live view: wait, then print `gpuwatch top --once` at the end",
    )
    demo.add_argument(
        "--keep-stack",
        action="store_true",
        help="leave the stack running at the end, to look at Prometheus and Redis after",
    )
    demo.set_defaults(handler=_demo)


def _add_top(verbs: Any) -> None:
    from gpuwatch.top.view import SORTS, STATE_ORDER
    from sinks.redis.keys import DEFAULT_PREFIX

    top = verbs.add_parser(
        "top",
        help="live terminal view of pods and GPUs from Redis",
        description="Show the cluster as the worker's Redis sink holds it, like `kubectl top` "
        "for GPUs: pods (team, state and time in it, GPUs, compute share, VRAM, cost and waste "
        "so far in USD), GPUs (node, model, utilization, VRAM used/total, owning pods, idle "
        "for) and firing alerts. Redraws in place every --interval seconds until Ctrl-C; "
        "--once prints the tables once (plain text, no escapes) and exits. Pods are read from "
        "the state sets, at most --max-rows per refresh (stalled, queued, running, then "
        "finished), and the view says how many were left out. --namespace, --team and --state "
        "also narrow the GPUs (to those the matching pods hold) and the alerts. Redis is "
        "--redis-url or GPUWATCH_REDIS_URL; exits 2 when it cannot be read.",
    )
    top.add_argument(
        "--sort",
        choices=SORTS,
        default="waste",
        help="pod order: waste, vram, cost, share (largest first), state (stalled, queued, "
        "running, finished; longest in it first) or name (default: waste)",
    )
    top.add_argument("--namespace", dest="top_namespace", metavar="NS", help="only this namespace")
    top.add_argument("--team", metavar="TEAM", help="only pods with this team label")
    top.add_argument("--state", choices=list(STATE_ORDER), help="only pods in this state")
    top.add_argument(
        "--limit", type=int, metavar="N", help="at most N rows per table (default: all)"
    )
    top.add_argument("--once", action="store_true", help="print once to stdout and exit")
    top.add_argument("--json", action="store_true", help="print once as JSON (implies --once)")
    top.add_argument(
        "--interval",
        type=float,
        default=2.0,
        dest="top_interval",
        metavar="SECONDS",
        help="seconds between redraws (default: 2)",
    )
    top.add_argument(
        "--key-prefix",
        default=DEFAULT_PREFIX,
        metavar="PREFIX",
        help=f"Redis key prefix the sink writes under (default: {DEFAULT_PREFIX})",
    )
    top.add_argument(
        "--max-rows",
        type=int,
        metavar="N",
        help="read at most N pods and N GPUs per refresh (default: 3000)",
    )
    top.set_defaults(handler=_top)


def _add_replay(verbs: Any) -> None:
    replay = verbs.add_parser(
        "replay",
        help="incident timeline of a pod, GPU or node; or re-processing into another prefix",
        description="Timeline: read the topics over --from..--to (event time, UTC) and print "
        "what happened to a pod (--pod NAMESPACE/NAME), a GPU (--gpu UUID) or a node "
        "(--node NAME): lifecycle transitions, per-window attribution (GPU-seconds used of "
        "allocated, idle, VRAM peak, cost, waste), alerts firing and resolved, and a summary "
        "of the raw node samples of its GPUs (count, mean and max utilization, peak VRAM, "
        "samples lost). Offsets are found by time; records written up to --margin after "
        "--to are read too (windows close after the allowed lateness). --json prints a list "
        "of typed events; --plot draws utilization and VRAM with the pod's states to a PNG. "
        "Re-processing (--rerun --to-prefix NAME.): copy the range's inputs (nvml.samples, "
        "k8s.pods, k8s.nodes) to topics with that prefix and run `gpuwatch worker` over them "
        "with the GPUWATCH_* settings of this environment (GPUWATCH_IDLE_UTIL_PCT=20, say), "
        "into its own topics and Redis database, until it has caught up; then print the "
        "records it made and its idle GPU-seconds and waste beside the live ones. Live topics "
        "are only read. Exits 1 on an unknown pod, an empty range or a range past retention.",
    )
    # `--from -2h`: argparse takes an argument starting with "-" for an option unless it
    # looks like a negative number; relative times are made to look like one.
    replay._negative_number_matcher = re.compile(r"^-(\d+(\.\d+)?(ms|s|m|h|d|w)?)+$")
    subject = replay.add_mutually_exclusive_group()
    subject.add_argument("--pod", metavar="NS/NAME", help="the pod, as namespace/name")
    subject.add_argument("--gpu", metavar="UUID", help="the GPU (or MIG instance) uuid")
    subject.add_argument("--node", dest="replay_node", metavar="NAME", help="the node")
    replay.add_argument(
        "--from",
        dest="time_from",
        required=True,
        metavar="TIME",
        help="start: ISO 8601 with a zone (2025-11-29T02:10:00Z), epoch seconds or ms, "
        "or before now (-2h, -30m, -1h30m)",
    )
    replay.add_argument(
        "--to", dest="time_to", default="now", metavar="TIME", help="end, as --from (now)"
    )
    replay.add_argument("--json", action="store_true", help="print JSON instead of a table")
    replay.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw utilization, VRAM and states"
    )
    replay.add_argument(
        "--margin",
        type=float,
        metavar="SECONDS",
        help="read records written up to this long after --to (default: 300, or two "
        "windows plus the allowed lateness when longer)",
    )
    replay.add_argument(
        "--rerun", action="store_true", help="re-process the range into --to-prefix"
    )
    replay.add_argument(
        "--to-prefix", metavar="NAME.", help="--rerun: topic prefix of the re-processing"
    )
    replay.add_argument(
        "--redis-url",
        dest="rerun_redis_url",
        metavar="URL",
        help="--rerun: its Redis database (default: the live one's database + 1)",
    )
    replay.set_defaults(handler=_replay)


def _add_settings(verbs: Any) -> None:
    verbs.add_parser(
        "settings",
        help="print the settings in force (secrets masked)",
        description="Print the effective settings as YAML after defaults, the settings "
        "file, GPUWATCH_* variables and flags are applied. Secrets are masked.",
    ).set_defaults(handler=_settings_show)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "kafka.bootstrap": args.kafka_bootstrap,
        "kafka.topic_prefix": args.topic_prefix,
        "redis.url": args.redis_url,
        "kafka.partitions": getattr(args, "partitions", None),
        "kafka.replication_factor": getattr(args, "replication_factor", None),
        "agent.interval_s": getattr(args, "interval", None),
        "worker.tick_interval_s": getattr(args, "tick_interval", None),
        "worker.session_timeout_s": getattr(args, "session_timeout", None),
        "worker.sinks": False if getattr(args, "no_sinks", False) else None,
        "metrics.port": getattr(args, "worker_metrics_port", None),
        "agent.node_name": getattr(args, "node", None),
        "agent.metrics_port": getattr(args, "metrics_port", None),
        "watcher.kubeconfig": getattr(args, "kubeconfig", None),
        "watcher.context": getattr(args, "context", None),
        "watcher.namespaces": _joined(getattr(args, "watch_namespaces", None)),
        "watcher.label_selector": getattr(args, "selector", None),
        "watcher.pod_label_allowlist": _joined(getattr(args, "pod_label", None)),
        "watcher.metrics_port": getattr(args, "watcher_metrics_port", None),
        **_gpu_resource_overrides(getattr(args, "gpu_resource", None)),
    }
    return {key: value for key, value in pairs.items() if value is not None}


def _joined(values: list[str] | None) -> tuple[str, ...] | None:
    return tuple(values) if values else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    if args.log_level != "DEBUG":
        # kafka-python logs every connection at INFO; its warnings still show.
        logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.root.level))
    try:
        settings = load_settings(config_file=args.config, overrides=_overrides(args))
    except SettingsError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 2
    handler: Handler = args.handler
    try:
        return handler(args, settings)
    except KeyboardInterrupt:
        print("gpuwatch: interrupted", file=sys.stderr)
        return 130
    except UserFacingError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 1


class UserFacingError(Exception):
    """An error whose message is all the user needs; printed without a traceback."""


def _progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def _stack_up(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.stack import manager

    try:
        statuses = manager.up(settings, _progress)
    except manager.StackError as exc:
        raise UserFacingError(str(exc)) from exc
    print(manager.format_table(statuses))
    return 0


def _stack_down(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.stack import manager

    try:
        statuses = manager.down(settings, _progress)
    except manager.StackError as exc:
        raise UserFacingError(str(exc)) from exc
    print(manager.format_table(statuses))
    return 0


def _stack_status(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.stack import manager

    statuses = manager.status(settings)
    print(manager.format_table(statuses))
    return 0 if all(s.state in ("up", "external") for s in statuses) else 1


def _topics_create(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch import kafka as topics

    try:
        report = topics.create_topics(settings)
    except topics.TopicAdminError as exc:
        raise UserFacingError(str(exc)) from exc
    print(topics.format_report(report))
    return 0 if all(row.ok for row in report) else 1


def _topics_list(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch import kafka as topics

    try:
        report = topics.describe_topics(settings)
    except topics.TopicAdminError as exc:
        raise UserFacingError(str(exc)) from exc
    print(topics.format_report(report))
    return 0 if all(row.ok for row in report) else 1


def _node_agent(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.run import agent as node_agent

    if args.log_level == "WARNING":
        logging.getLogger().setLevel(logging.INFO)  # a daemon says what it does
    options = node_agent.AgentOptions(
        backend=args.backend,
        sim_gpus=args.sim_gpus,
        sim_model=args.sim_model,
        seed=args.seed,
        duration_s=args.duration,
    )
    try:
        return node_agent.run(settings, options)
    except node_agent.AgentStartError as exc:
        raise UserFacingError(str(exc)) from exc


def _simulate(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.run import simulate

    if args.list_scenarios:
        for name in simulate.scenario_names():
            try:
                description = simulate.load(name).description
            except simulate.ScenarioError as exc:
                description = f"(unusable: {exc})"
            print(f"{name:<10} {description}")
        return 0
    if args.log_level == "WARNING":
        logging.getLogger().setLevel(logging.INFO)  # a long-running producer says what it does
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
    )
    try:
        return simulate.run(settings, options)
    except simulate.SimulateMetricsError as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 2
    except simulate.SimulateStartError as exc:
        raise UserFacingError(str(exc)) from exc


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.bench import run as bench
    from gpuwatch.bench import worker as bench_worker

    config = None
    if args.which == "worker":
        try:
            config = bench_worker.config_from_args(args)
        except ValueError as exc:
            raise UserFacingError(f"bench worker: {exc}") from exc
    if config is not None or not args.no_kafka:
        missing = bench.missing_services(settings, redis=config is not None)
        if missing:
            raise UserFacingError(
                f"bench {args.which}: {'; '.join(missing)}. Start the local stack with "
                "`gpuwatch stack up`, or point GPUWATCH_KAFKA_BOOTSTRAP / GPUWATCH_REDIS_URL "
                "at running ones."
            )
    if config is not None:
        return bench_worker.main(args, settings, config)
    ticks = 500 if args.quick else 5000
    result = bench.bench_producer(
        settings, ticks, args.gpus, kafka=not args.no_kafka, paced_seconds=5 if args.quick else 20
    )
    print(bench.producer_json(result) if args.json else bench.format_producer(result))
    return 0


def _k8s_watcher(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.run import watcher as k8s_watcher

    if args.log_level == "WARNING":
        logging.getLogger().setLevel(logging.INFO)  # a daemon says what it does
    options = k8s_watcher.WatcherOptions(duration_s=args.duration)
    try:
        return k8s_watcher.run(settings, options)
    except k8s_watcher.WatcherStartError as exc:
        raise UserFacingError(str(exc)) from exc


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    import dataclasses

    from gpuwatch.run import worker
    from streams.faust.app import WorkerOptions

    if args.log_level == "WARNING":
        # A daemon says what it does; Faust's own INFO lines (tables, offsets) stay off.
        for name in ("gpuwatch", "streams"):
            logging.getLogger(name).setLevel(logging.INFO)
    options = WorkerOptions()
    if args.instance:
        options = dataclasses.replace(options, instance=args.instance)
    try:
        return worker.run(settings, options, loglevel=args.log_level)
    except worker.WorkerStartError as exc:
        raise UserFacingError(str(exc)) from exc


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.run import demo

    if args.speed <= 0 or (args.demo_duration is not None and args.demo_duration <= 0):
        raise UserFacingError("demo: --speed and --duration must be positive")
    options = demo.DemoOptions(
        scenario=args.scenario,
        speed=args.speed,
        duration_s=args.demo_duration,
        ui=not args.no_ui,
        keep_stack=args.keep_stack,
    )
    try:
        return demo.run(settings, options, sys.stdout, _progress)
    except demo.DemoError as exc:
        raise UserFacingError(f"demo: {exc}") from exc


def _top(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.top import live as top
    from gpuwatch.top.view import Query

    try:
        query = Query(
            sort=args.sort,
            namespace=args.top_namespace,
            team=args.team,
            state=args.state,
            limit=args.limit,
        )
        options = top.TopOptions(
            query=query,
            key_prefix=args.key_prefix,
            max_rows=top.MAX_ROWS if args.max_rows is None else args.max_rows,
            interval_s=args.top_interval,
            once=args.once,
            json=args.json,
        )
    except ValueError as exc:
        raise UserFacingError(f"top: {exc}") from exc
    try:
        return top.run(settings.redis, options, sys.stdout)
    except top.TopUnavailable as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return 2


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    import time

    from gpuwatch.replay.read import Progress
    from gpuwatch.replay.show import ReplayError, default_margin_s, timeline
    from gpuwatch.replay.story import Subject, TimeRange
    from gpuwatch.replay.timefmt import format_time, parse_time
    from gpuwatch.replay.view import plot, render_text, to_json

    now_ms = int(time.time() * 1000)
    try:
        span = TimeRange(parse_time(args.time_from, now_ms), parse_time(args.time_to, now_ms))
    except ValueError as exc:
        raise UserFacingError(f"replay: {exc}") from exc
    if span.start_ms >= span.end_ms:
        raise UserFacingError(
            f"replay: empty range: --from {format_time(span.start_ms)} is not before --to "
            f"{format_time(span.end_ms)} (UTC)"
        )
    margin_s = default_margin_s(settings) if args.margin is None else args.margin
    if margin_s < 0:
        raise UserFacingError("replay: --margin must not be negative")
    if args.rerun or args.to_prefix:
        return _replay_rerun(args, settings, span, round(margin_s * 1000))
    try:
        subject = Subject.parse(args.pod, args.gpu, args.replay_node)
    except ValueError as exc:
        raise UserFacingError(f"replay: {exc}") from exc
    try:
        story = timeline(
            settings,
            subject,
            span,
            margin_ms=round(margin_s * 1000),
            progress=Progress(),
            keep_series=args.plot is not None,
        )
    except ReplayError as exc:
        raise UserFacingError(f"replay: {exc}") from exc
    if args.json:
        print(to_json(story), end="")
        for note in story.notes:
            print(f"gpuwatch: note: {note}", file=sys.stderr)
    else:
        print(render_text(story), end="")
    if args.plot is not None:
        try:
            points = plot(story, args.plot)
        except OSError as exc:
            raise UserFacingError(f"replay: cannot write {args.plot}: {exc.strerror}") from exc
        print(f"gpuwatch: plot written to {args.plot} ({points} samples)", file=sys.stderr)
    return 0


def _replay_rerun(args: argparse.Namespace, settings: Settings, span: Any, margin_ms: int) -> int:
    from gpuwatch.replay.read import Progress
    from gpuwatch.replay.rerun import RerunError, RerunOptions, rerun
    from gpuwatch.replay.view import render_rerun, rerun_json

    if not (args.rerun and args.to_prefix):
        raise UserFacingError("replay: re-processing takes both --rerun and --to-prefix NAME.")
    if args.pod or args.gpu or args.replay_node or args.plot:
        raise UserFacingError(
            "replay: --rerun re-processes every pod of the range; read one afterwards with "
            "`gpuwatch --topic-prefix NAME. replay --pod ...`"
        )
    options = RerunOptions(
        to_prefix=args.to_prefix,
        span=span,
        margin_ms=margin_ms,
        redis_url=args.rerun_redis_url,
        config=args.config,
    )
    try:
        result = rerun(settings, options, Progress(), _progress)
    except RerunError as exc:
        raise UserFacingError(f"replay: {exc}") from exc
    print(rerun_json(result) if args.json else render_rerun(result), end="")
    return 0


def _settings_show(args: argparse.Namespace, settings: Settings) -> int:
    import yaml

    data = settings.model_dump(mode="json")
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
