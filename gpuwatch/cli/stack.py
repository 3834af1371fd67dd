"""`gpuwatch stack`: the local Kafka, Redis and Prometheus (and with --kube a Kubernetes
API server), as plain processes."""

from __future__ import annotations

import argparse
from typing import Any

from gpuwatch.cli.common import UserFacingError, progress
from gpuwatch.cli.options import add_actions, add_verb
from schemas.settings import Settings


def add_parser(verbs: Any) -> None:
    """The `stack` verb and its actions up, down and status, all run by `_stack`."""
    stack = add_verb(
        verbs,
        "stack",
        _stack,
        "local Kafka (KRaft), Redis and Prometheus without Docker",
        "Run the local stack as plain processes: Apache Kafka 4.x in KRaft mode "
        "(jars fetched from Maven Central on first use into the cache directory), "
        "redis-server and prometheus from the OS packages. Data, logs and pid files live "
        "in the state directory (GPUWATCH_STATE_DIR, default ~/.local/state/gpuwatch).",
    )
    actions = add_actions(stack)
    up = add_verb(
        actions,
        "up",
        None,
        "start what is not running (idempotent)",
        "Start Kafka on 127.0.0.1:9092, Redis on 6379 and Prometheus on 9090 "
        "(idempotent: each unless already running), and wait until each answers (Kafka: a metadata "
        "request; Redis: PING; Prometheus: /-/ready). With --kube (or GPUWATCH_STACK_KUBE=true), "
        "also etcd on 12379 and a Kubernetes API server (kube-apiserver 1.34, built once from "
        "the Go module proxy into the cache directory) on https://127.0.0.1:16443, and write "
        "the admin's kubeconfig to <state>/kube-apiserver/kubeconfig.",
    )
    up.add_argument(
        "--kube",
        action="store_true",
        help="also run etcd and a kube-apiserver (no kubelets: objects, watches, RBAC)",
    )
    add_verb(
        actions,
        "down",
        None,
        "stop what `stack up` started",
        "Stop the services this state directory started; services found "
        "running but started by someone else are left alone. Data and logs are kept.",
    )
    add_verb(
        actions,
        "status",
        None,
        "show each service; exit 1 if one is down",
        "Show each service with its state, port, pid and log file. Exits 1 "
        "when any service is down.",
    )


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    """Run the action, then print the table of services."""
    from gpuwatch.harness.stack import manager

    if args.action == "status":
        statuses = manager.status(settings)
        print(manager.format_table(statuses))
        return 0 if all(s.state in ("up", "external") for s in statuses) else 1
    try:
        if args.action == "up":
            statuses = manager.up(settings, progress, kube=args.kube)
        else:
            statuses = manager.down(settings, progress)
    except manager.StackError as exc:
        raise UserFacingError(str(exc)) from exc
    print(manager.format_table(statuses))
    return 0
