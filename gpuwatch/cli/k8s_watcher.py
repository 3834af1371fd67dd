"""`gpuwatch k8s-watcher`: the Kubernetes producer, pods, nodes (with their DRA GPUs) and
Kueue workloads to Kafka."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpuwatch.cli.common import UserFacingError, daemon_logging
from gpuwatch.cli.options import add_cluster, add_duration, add_int, add_verb, with_cluster
from schemas.settings import Settings

DESCRIPTION = (
    "List and watch Pods and Nodes (one replica, cluster-wide) and publish "
    "every change that matters as gpuwatch.k8s.pod/v1 to k8s.pods (key: pod uid) and "
    "gpuwatch.k8s.node/v1 to k8s.nodes (key: node name), each naming the cluster "
    "(--cluster, GPUWATCH_CLUSTER). Pods: those that request a GPU "
    "resource in any container or init container, those that use ResourceClaims "
    "(GPUWATCH_WATCH_CLAIM_PODS), plus the pods named in GPUWATCH_WATCH_EXTRA_PODS; "
    "nodes: those with GPU capacity, counting the devices that the GPU DRA drivers "
    "(GPUWATCH_WATCH_DRA_DRIVERS, default gpu.nvidia.com) publish in the node's "
    "ResourceSlices as <driver>/gpu or <driver>/mig-<profile>; a node is published "
    "again when they change. Where the cluster serves Kueue, its Workloads go "
    "to k8s.workloads as gpuwatch.k8s.workload/v1 (key: workload uid; "
    "GPUWATCH_WATCH_WORKLOADS); without Kueue that is said once. A watch resumes from "
    "its last resourceVersion; after 410 Gone it relists and publishes the difference "
    "(RESYNC for changed pods, DELETED for vanished ones). Connects with the in-cluster "
    "service account, else --kubeconfig, $KUBECONFIG or ~/.kube/config; the RBAC it "
    "needs is in deploy/rbac/k8s-watcher.yaml. Self-metrics on "
    "GPUWATCH_WATCHER_METRICS_PORT (default 9482). SIGTERM flushes and exits."
)


def add_parser(verbs: Any) -> None:
    """The `k8s-watcher` verb; its help names the settings' default resources and labels."""
    defaults = Settings().watcher
    gpu_defaults = ", ".join(
        [*defaults.gpu_resources, *(f"{prefix}*" for prefix in defaults.gpu_resource_prefixes)]
    )
    watcher = add_verb(
        verbs,
        "k8s-watcher",
        _k8s_watcher,
        "the Kubernetes producer: pods, nodes and Kueue workloads to Kafka",
        DESCRIPTION,
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
    _add_repeated(
        watcher,
        "--namespace",
        "NS",
        "watch_namespaces",
        "watch this namespace; repeat for several (env: GPUWATCH_WATCH_NAMESPACES, "
        "comma-separated; default: all namespaces, one cluster-wide watch)",
    )
    watcher.add_argument(
        "--selector",
        metavar="SELECTOR",
        help="label selector of the pods to watch, Kubernetes syntax, e.g. "
        "'team=vision,tier!=test' or 'project in (a,b)' (env: GPUWATCH_WATCH_LABEL_SELECTOR)",
    )
    _add_repeated(
        watcher,
        "--gpu-resource",
        "NAME",
        "gpu_resource",
        "resource name that makes a pod a GPU pod; a trailing * makes it a prefix "
        f"('nvidia.com/mig-*'); repeat for several; replaces the defaults {gpu_defaults} "
        "(env: GPUWATCH_WATCH_GPU_RESOURCES, GPUWATCH_WATCH_GPU_RESOURCE_PREFIXES)",
    )
    _add_repeated(
        watcher,
        "--label",
        "KEY",
        "pod_label",
        "pod label copied into messages (the label allow-list; never all labels); "
        f"repeat for several; replaces the defaults {', '.join(defaults.pod_label_allowlist)} "
        "(env: GPUWATCH_POD_LABEL_ALLOWLIST)",
    )
    add_int(
        watcher,
        "--metrics-port",
        "PORT",
        "self-metrics port (env: GPUWATCH_WATCHER_METRICS_PORT, default 9482)",
        dest="watcher_metrics_port",
    )
    add_cluster(watcher)
    add_duration(watcher, "stop after this long (default: never)")


def _add_repeated(
    parser: argparse.ArgumentParser, flag: str, metavar: str, dest: str, text: str
) -> None:
    parser.add_argument(flag, action="append", metavar=metavar, dest=dest, help=text)


def gpu_resource_overrides(names: list[str] | None) -> dict[str, Any]:
    """The settings of --gpu-resource: names, and prefixes where a name ends in *."""
    if not names:
        return {}
    return {
        "watcher.gpu_resources": tuple(n for n in names if not n.endswith("*")),
        "watcher.gpu_resource_prefixes": tuple(n[:-1] for n in names if n.endswith("*")),
    }


def _k8s_watcher(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.run import watcher as k8s_watcher

    daemon_logging(args)
    options = k8s_watcher.WatcherOptions(duration_s=args.duration)
    try:
        return k8s_watcher.run(with_cluster(settings, args), options)
    except k8s_watcher.WatcherStartError as exc:
        raise UserFacingError(str(exc)) from exc
