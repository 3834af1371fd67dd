"""`gpuwatch top`: the live terminal view of pods and GPUs from Redis."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpuwatch.cli.common import UserFacingError
from gpuwatch.cli.options import add_flag, add_float, add_int, add_verb
from schemas.settings import Settings

DESCRIPTION = (
    "Show the cluster as the worker's Redis sink holds it, like `kubectl top` "
    "for GPUs: pods (team, state and time in it, GPUs, compute share, VRAM, cost and waste "
    "so far in USD), GPUs (node, model, utilization, VRAM used/total, owning pods, idle "
    "for) and firing alerts, under a capacity line per cluster (free GPUs per model, how "
    "many of them stranded, idle allocated GPUs reclaimable, pods blocked by "
    "fragmentation); a blocked queued pod's reason says what it wants and what the best "
    "node has. Redraws in place every --interval seconds until Ctrl-C; "
    "--once prints the tables once (plain text, no escapes) and exits. Pods are read from "
    "the state sets, at most --max-rows per refresh (stalled, queued, running, then "
    "finished), and the view says how many were left out. --namespace, --team and --state "
    "also narrow the GPUs (to those the matching pods hold) and the alerts; --cluster keeps "
    "one cluster's pods, GPUs, alerts and capacity where many clusters feed one pipeline. Redis is "
    "--redis-url or GPUWATCH_REDIS_URL; exits 2 when it cannot be read."
)


def add_parser(verbs: Any) -> None:
    """The `top` verb; its choices come from the view, its default key prefix from the sink."""
    from gpuwatch.top.view import SORTS, STATE_ORDER
    from sinks.redis.keys import DEFAULT_PREFIX

    top = add_verb(
        verbs, "top", _top, "live terminal view of pods and GPUs from Redis", DESCRIPTION
    )
    top.add_argument(
        "--sort",
        choices=SORTS,
        default="waste",
        help="pod order: waste, vram, cost, share (largest first), state (stalled, queued, "
        "running, finished; longest in it first) or name (default: waste)",
    )
    top.add_argument(
        "--cluster",
        dest="top_cluster",
        metavar="NAME",
        help="only this cluster's pods, GPUs, alerts and capacity (where many clusters feed one "
        "pipeline; default: all, with a CLUSTER column when there are several)",
    )
    top.add_argument("--namespace", dest="top_namespace", metavar="NS", help="only this namespace")
    top.add_argument("--team", metavar="TEAM", help="only pods with this team label")
    top.add_argument("--state", choices=list(STATE_ORDER), help="only pods in this state")
    add_int(top, "--limit", "N", "at most N rows per table (default: all)")
    add_flag(top, "--once", "print once to stdout and exit")
    add_flag(top, "--json", "print once as JSON (implies --once)")
    add_float(
        top,
        "--interval",
        "seconds between redraws (default: 2)",
        dest="top_interval",
        default=2.0,
    )
    top.add_argument(
        "--key-prefix",
        default=DEFAULT_PREFIX,
        metavar="PREFIX",
        help=f"Redis key prefix the sink writes under (default: {DEFAULT_PREFIX})",
    )
    add_int(top, "--max-rows", "N", "read at most N pods and N GPUs per refresh (default: 3000)")


def _top(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.top import live as top
    from gpuwatch.top.view import Query

    try:
        query = Query(
            sort=args.sort,
            cluster=args.top_cluster,
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
