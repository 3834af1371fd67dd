"""`gpuwatch replay`: the incident timeline of a pod, GPU or node, or a re-processing."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwatch.cli.common import UserFacingError, progress
from gpuwatch.cli.options import add_flag, add_float, add_verb
from schemas.settings import Settings

if TYPE_CHECKING:
    from gpuwatch.timerange import TimeRange

DESCRIPTION = (
    "Timeline: read the topics over --from..--to (event time, UTC) and print "
    "what happened to a pod (--pod NAMESPACE/NAME), a GPU (--gpu UUID) or a node "
    "(--node NAME), of one cluster with --cluster NAME: lifecycle transitions, per-window "
    "attribution (GPU-seconds used of "
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
    "are only read. Exits 1 on an unknown pod, an empty range or a range past retention."
)


def add_parser(verbs: Any) -> None:
    """The `replay` verb: a timeline, or with --rerun a re-processing."""
    replay = add_verb(
        verbs,
        "replay",
        _replay,
        "incident timeline of a pod, GPU or node; or re-processing into another prefix",
        DESCRIPTION,
    )
    # `--from -2h`: argparse takes an argument starting with "-" for an option unless it
    # looks like a negative number; relative times are made to look like one.
    replay._negative_number_matcher = re.compile(r"^-(\d+(\.\d+)?(ms|s|m|h|d|w)?)+$")
    subject = replay.add_mutually_exclusive_group()
    subject.add_argument("--pod", metavar="NS/NAME", help="the pod, as namespace/name")
    subject.add_argument("--gpu", metavar="UUID", help="the GPU (or MIG instance) uuid")
    subject.add_argument("--node", dest="replay_node", metavar="NAME", help="the node")
    replay.add_argument(
        "--cluster",
        dest="replay_cluster",
        metavar="NAME",
        help="only records of this cluster, where many clusters feed one pipeline (node "
        "names repeat across clusters; default: every cluster); with --rerun, only its "
        "inputs are re-processed",
    )
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
    add_flag(replay, "--json", "print JSON instead of a table")
    replay.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw utilization, VRAM and states"
    )
    add_float(
        replay,
        "--margin",
        "read records written up to this long after --to (default: 300, or two "
        "windows plus the allowed lateness when longer)",
    )
    add_flag(replay, "--rerun", "re-process the range into --to-prefix")
    replay.add_argument(
        "--to-prefix", metavar="NAME.", help="--rerun: topic prefix of the re-processing"
    )
    replay.add_argument(
        "--redis-url",
        dest="rerun_redis_url",
        metavar="URL",
        help="--rerun: its Redis database (default: the live one's database + 1)",
    )


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.replay.show import default_margin_s

    span = _time_range(args)
    margin_s = default_margin_s(settings) if args.margin is None else args.margin
    if margin_s < 0:
        raise UserFacingError("replay: --margin must not be negative")
    if args.rerun or args.to_prefix:
        return _replay_rerun(args, settings, span, round(margin_s * 1000))
    return _timeline(args, settings, span, round(margin_s * 1000))


def _time_range(args: argparse.Namespace) -> TimeRange:
    from gpuwatch.timerange import TimeRange, format_time, parse_time

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
    return span


def _timeline(args: argparse.Namespace, settings: Settings, span: TimeRange, margin_ms: int) -> int:
    from gpuwatch.plotting import unavailable
    from gpuwatch.replay.read import Progress
    from gpuwatch.replay.show import ReplayError, timeline
    from gpuwatch.replay.story import Subject
    from gpuwatch.replay.view import plot, render_text, to_json

    if (no_plot := unavailable(args.plot)) is not None:
        print(f"gpuwatch: {no_plot}", file=sys.stderr)
        return 2
    try:
        subject = Subject.parse(args.pod, args.gpu, args.replay_node, args.replay_cluster)
    except ValueError as exc:
        raise UserFacingError(f"replay: {exc}") from exc
    try:
        story = timeline(
            settings,
            subject,
            span,
            margin_ms=margin_ms,
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


def _replay_rerun(
    args: argparse.Namespace, settings: Settings, span: TimeRange, margin_ms: int
) -> int:
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
        cluster=args.replay_cluster,
    )
    try:
        result = rerun(settings, options, Progress(), progress)
    except RerunError as exc:
        raise UserFacingError(f"replay: {exc}") from exc
    print(rerun_json(result) if args.json else render_rerun(result), end="")
    return 0
