"""`gpuwatch report`: the chargeback of a period: GPU-hours, cost, waste, cost per unit."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from gpuwatch.cli.common import UserFacingError
from gpuwatch.cli.options import add_verb
from schemas.settings import Settings

DESCRIPTION = (
    "Chargeback: read the attribution and gpu.windows topics over --from..--to (event "
    "time, UTC; a window counts by its start) and print, per group and step, GPU-hours "
    "allocated and used, the idle share (idle / allocated GPU-hours), cost and waste in "
    "USD, the waste share (waste / cost) and the cost per unit of work where pods report "
    "units. Cost per unit of a unit name = the cost of the windows that report that unit / "
    "the units done in them (the table shows it per 1k or 1M units where a unit costs under "
    "a cent; CSV and JSON per single unit). Groups: team (the pod's team label), namespace, "
    "workload (the owner's kind/name; the pod without one), pod, node, gpu (uuid) and model "
    "(a pod's window split over its GPUs), cluster. The line (unallocated) is the GPU time "
    "no pod was allocated (unallocated seconds of gpu.windows), priced per GPU model, "
    "cluster and node labels as the worker prices a GPU-second (the prices setting, "
    "GPUWATCH_PRICES), so that total = the groups + (unallocated) = the fleet's priced "
    "GPU time. Steps are UTC hours, UTC days or weeks from Monday 00:00 UTC, cut at the "
    "period's ends; the table ends with the fleet's waste share per step. A record "
    "delivered twice counts once, and a window the worker revised (data that came after "
    "it closed) counts once, at its newest revision, read up to the revision horizon "
    "past --to; records that do not decode are skipped and counted on stderr. An empty "
    "period prints an empty table and exits 0."
)


def add_parser(verbs: Any) -> None:
    """The `report` verb."""
    report = add_verb(
        verbs,
        "report",
        _report,
        "chargeback: GPU-hours, cost, waste and cost per unit by team, workload, node...",
        DESCRIPTION,
    )
    # `--from -30d`: relative times are made to look like negative numbers (see replay).
    report._negative_number_matcher = re.compile(r"^-(\d+(\.\d+)?(ms|s|m|h|d|w)?)+$")
    report.add_argument(
        "--from",
        dest="time_from",
        required=True,
        type=_time,
        metavar="TIME",
        help="start: ISO 8601 with a zone (2025-11-01T00:00:00Z), epoch seconds or ms, "
        "or before now (-30d, -24h, -1h30m)",
    )
    report.add_argument(
        "--to",
        dest="time_to",
        default="now",
        type=_time,
        metavar="TIME",
        help="end, as --from (default: now)",
    )
    report.add_argument(
        "--step",
        dest="report_step",
        choices=["1h", "1d", "7d"],
        help="one row per group per step (default: the whole period as one step)",
    )
    report.add_argument(
        "--by",
        dest="report_by",
        default="team",
        choices=["team", "namespace", "workload", "pod", "node", "gpu", "model", "cluster"],
        help="what a row is (default: team; a pod without the label is (none))",
    )
    report.add_argument(
        "--format",
        dest="report_format",
        default="table",
        choices=["table", "csv", "json"],
        help="table (default), csv with a header row, or json (a list of objects)",
    )
    report.add_argument(
        "--top",
        type=_positive_int,
        metavar="N",
        help="per step, the N groups of highest cost; the rest summed as (other)",
    )
    report.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw cost and waste per group over the steps, stacked, to a PNG",
    )


def _time(text: str) -> str:
    """A time as replay takes it, checked when parsed (read again against one `now`)."""
    from gpuwatch.timerange import parse_time

    try:
        parse_time(text, 0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _report(args: argparse.Namespace, settings: Settings) -> int:
    from gpuwatch.plotting import unavailable
    from gpuwatch.replay.read import Progress
    from gpuwatch.replay.show import default_margin_s
    from gpuwatch.report.aggregate import Aggregator
    from gpuwatch.report.read import ReportError, read_period
    from gpuwatch.report.render import to_csv, to_json, to_table
    from gpuwatch.timerange import TimeRange, format_time, parse_time

    now_ms = int(time.time() * 1000)
    span = TimeRange(parse_time(args.time_from, now_ms), parse_time(args.time_to, now_ms))
    between = f"between {format_time(span.start_ms)} and {format_time(span.end_ms)} UTC"
    if (no_plot := unavailable(args.plot)) is not None:
        print(f"gpuwatch: {no_plot}", file=sys.stderr)
        return 2
    if span.start_ms >= span.end_ms:
        raise UserFacingError(
            f"report: empty range: --from {format_time(span.start_ms)} is not before --to "
            f"{format_time(span.end_ms)} (UTC)"
        )
    aggregator = Aggregator(
        span, by=args.report_by, step=args.report_step, prices=settings.cost.prices
    )
    try:
        notes = read_period(
            settings,
            aggregator,
            margin_ms=default_margin_s(settings) * 1000,
            progress=Progress(verb="report"),
        )
    except ReportError as exc:
        raise UserFacingError(f"report: {exc}") from exc
    report = aggregator.report(top=args.top)
    render = {"table": to_table, "csv": to_csv, "json": to_json}[args.report_format]
    print(render(report), end="")
    for note in [*notes, *report.notes]:
        print(f"gpuwatch: note: {note}", file=sys.stderr)
    counts = report.counts
    if report.empty:
        print(
            f"gpuwatch: report: nothing recorded {between} under the prefix "
            f"{settings.kafka.topic_prefix!r} (no attribution or gpu.windows record of a "
            "window starting in the period); times are UTC, relative ones (-2h) count back "
            "from now",
            file=sys.stderr,
        )
    if args.plot is not None:
        from gpuwatch.report.plot import plot

        try:
            steps = plot(report, args.plot)
        except OSError as exc:
            raise UserFacingError(f"report: cannot write {args.plot}: {exc.strerror}") from exc
        print(f"gpuwatch: plot written to {args.plot} ({steps} steps)", file=sys.stderr)
    print(
        f"gpuwatch: report: {counts.pod_windows} pod windows and {counts.gpu_windows} GPU "
        f"windows {between}; records that could not be decoded, skipped: "
        f"{counts.undecodable}",
        file=sys.stderr,
    )
    return 0
