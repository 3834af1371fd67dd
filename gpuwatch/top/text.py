"""`gpuwatch top`'s tables: the frame (title, capacity, Kueue, pods, GPUs, alerts, notes).

Pure: the view's rows in, a `rich` renderable out (`frame`), with `now` passed in. The same
frame prints plain for `--once` and pipes (`render_text`: tables as `gpuwatch/tables.py`
draws them, no escape) and styled in the live view, cut to the terminal (`fit_screen`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.segment import Segment, Segments
from rich.text import Text

from gpuwatch.tables import WIDE, Grid, grid, plain
from gpuwatch.top.capacity import blocked_text, capacity_line
from gpuwatch.top.cells import (
    NONE,
    fmt_age,
    fmt_bytes,
    fmt_pct,
    fmt_per_unit,
    fmt_usd,
    gpus_cell,
    owner_name,
    short_uuid,
    since,
    subject,
    vram_cell,
)
from gpuwatch.top.view import (
    STATE_ORDER,
    AlertRow,
    Header,
    PodRow,
    Query,
    Snapshot,
    View,
    blocks,
    capacity_rows,
    clusters,
    filters,
    gpu_faults,
    kueue_rows,
    notes,
    queued_block,
    select,
)

__all__ = ["Frame", "fit_screen", "frame", "render_text"]


def _line(text: str) -> Text:
    """A line of the frame: on a narrow terminal it is cut, never wrapped."""
    return Text(text, no_wrap=True)


def _table(
    headers: list[str], rows: list[list[str]], right: set[int], by_cluster: bool, of: Sequence[Any]
) -> Grid:
    """The table, with a CLUSTER column first when the snapshot holds more than one."""
    if by_cluster:
        headers = ["CLUSTER", *headers]
        rows = [[row.cluster, *cells] for row, cells in zip(of, rows, strict=True)]
        right = {i + 1 for i in right}
    return grid(headers, rows, right)


def _reason_cell(
    pod: PodRow, faults: Mapping[str, list[str]], blocked: Mapping[str, AlertRow] = {}
) -> str:
    """The state's reason, a queued pod's fragmentation block (`blocked: wants 4, best node
    2, 6 free`) and the faults of the pod's GPUs (`GPU: Xid 79, throttled`)."""
    gpu, block = faults.get(pod.uid), queued_block(pod, blocked)
    parts = [pod.reason] if pod.reason else []
    parts += [blocked_text(block.labels)] if block else []
    parts += [f"GPU: {', '.join(gpu)}"] if gpu else []
    return "; ".join(parts) or NONE


def _pods_table(
    view: View,
    now_ms: int,
    by_cluster: bool = False,
    faults: Mapping[str, list[str]] = {},
    blocked: Mapping[str, AlertRow] = {},
) -> Grid:
    headers = ["POD", "TEAM", "STATE", "REASON", "FOR", "SHARE", "VRAM", "COST $", "WASTE $"]
    rows = [
        [
            p.name,
            p.team or NONE,
            p.state,
            _reason_cell(p, faults, blocked),
            since(now_ms, p.state_since),
            fmt_pct(None if p.share is None else p.share * 100),
            fmt_bytes(p.vram_bytes),
            fmt_usd(p.cost_usd),
            fmt_usd(p.waste_usd),
            gpus_cell(p.gpus),
        ]
        for p in view.pods
    ]
    headers.append("GPUS")
    if any(p.cost_per_unit for p in view.pods):  # only where some pod reports units of work
        headers.append("$/UNIT")
        for row, p in zip(rows, view.pods, strict=True):
            row.append(fmt_per_unit(p.cost_per_unit))
    return _table(headers, rows, {4, 5, 6, 7, 8}, by_cluster, view.pods)


def _gpus_table(view: View, names: Mapping[str, str], now_ms: int, by_cluster: bool) -> Grid:
    headers = ["GPU", "NODE", "MODEL", "UTIL", "VRAM USED/TOTAL", "IDLE FOR", "SEEN", "OWNERS"]
    rows = [
        [
            short_uuid(g.uuid),
            g.node or NONE,
            g.model or NONE,
            fmt_pct(g.util_pct),
            vram_cell(g.mem_used_bytes, g.mem_total_bytes),
            since(now_ms, g.idle_since),
            NONE if g.updated_at is None else f"{fmt_age(now_ms - g.updated_at)} ago",
            ",".join(owner_name(uid, names) for uid in g.owners) or NONE,
        ]
        for g in view.gpus
    ]
    return _table(headers, rows, {3, 4, 5, 6}, by_cluster, view.gpus)


def _alerts_table(view: View, names: Mapping[str, str], now_ms: int, by_cluster: bool) -> Grid:
    headers = ["ALERT", "SEVERITY", "SUBJECT", "FOR", "SUMMARY"]
    rows = [
        [a.name, a.severity, subject(a, names), fmt_age(now_ms - a.since), a.summary]
        for a in view.alerts
    ]
    return _table(headers, rows, {3}, by_cluster, view.alerts)


def _kueue_section(
    snapshot: Snapshot, query: Query, now_ms: int, by_cluster: bool, rows_at_most: int | None
) -> tuple[list[RenderableType], int]:
    """The QUEUED IN KUEUE section: a job Kueue holds has no pod to show it; none where
    nothing waits (and no Kueue). With the number of its rows left out (`rows_at_most`)."""
    waiting = kueue_rows(snapshot, query)
    if not waiting:
        return [], 0
    rows = waiting[:rows_at_most]
    headers = ["WORKLOAD", "QUEUE", "TEAM", "PODS", "GPUS", "REASON", "FOR", "OWNER"]
    cells = [
        [
            f"{r.namespace}/{r.name}",
            r.queue or NONE,
            r.team or NONE,
            str(r.pods),
            str(r.gpus),
            r.reason or NONE,
            fmt_age(now_ms - r.since),
            r.owner or NONE,
        ]
        for r in rows
    ]
    section: list[RenderableType] = [
        _line(f"QUEUED IN KUEUE ({len(waiting)})"),
        _table(headers, cells, {3, 4, 6}, by_cluster, rows),
        _line(""),
    ]
    return section, len(waiting) - len(rows)


def _section(title: str, rows: Grid, shown: int, matched: int) -> list[RenderableType]:
    none = [_line("(none)")] if not shown else []
    more = [_line(f"({matched - shown} more; raise --limit)")] if matched > shown else []
    return [_line(f"{title} ({matched})"), rows, *none, *more]


def _capacity_lines(snapshot: Snapshot, query: Query, by_cluster: bool) -> list[str]:
    """A capacity line per cluster with capacity records, named when there are several."""
    rows = capacity_rows(snapshot, query)
    names = sorted({r.cluster for r in rows})
    return [
        capacity_line((r for r in rows if r.cluster == name), name if by_cluster else None)
        for name in names
    ]


def _title_lines(snapshot: Snapshot, query: Query, header: Header, now_ms: int) -> list[str]:
    """Where the rows come from, the counts, the filters, the clusters and the capacity."""
    seen = clusters(snapshot)
    by_cluster = len(seen) > 1
    at = datetime.fromtimestamp(now_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    counts = "  ".join(f"{s} {snapshot.state_counts.get(s, 0)}" for s in STATE_ORDER)
    given = [f"--{k} {v}" for k, v in filters(query).items() if v is not None]
    return [
        f"gpuwatch top  {header.target}  prefix {header.prefix}  {at}",
        f"pods: {counts}  |  gpus {snapshot.gpus_total}  |  alerts firing "
        f"{len(snapshot.alerts)}  |  sort {query.sort}" + "".join(f"  {f}" for f in given),
        *([f"clusters: {' '.join(seen)}"] if by_cluster else []),
        *_capacity_lines(snapshot, query, by_cluster),
    ]


@dataclass(frozen=True, slots=True)
class Frame:
    """The view as `rich` draws it; `hidden` table rows were left out of it (a terminal
    shows at most a screen of rows: drawing more would only slow each redraw down)."""

    view: Group
    hidden: int = 0

    def __rich__(self) -> Group:
        return self.view


def frame(
    snapshot: Snapshot,
    query: Query,
    header: Header,
    now_ms: int,
    rows_at_most: int | None = None,
) -> Frame:
    """The view: title, Kueue's queue, pods, GPUs, firing alerts and notes; each table cut
    to its first `rows_at_most` rows when given (the section titles count them all)."""
    view = select(snapshot, query)
    cut = view
    if rows_at_most is not None:
        n = rows_at_most
        cut = replace(view, pods=view.pods[:n], gpus=view.gpus[:n], alerts=view.alerts[:n])
    by_cluster = len(clusters(snapshot)) > 1
    names = snapshot.pod_names
    pods = _pods_table(cut, now_ms, by_cluster, gpu_faults(snapshot), blocks(snapshot))
    kueue, kueue_hidden = _kueue_section(snapshot, query, now_ms, by_cluster, rows_at_most)
    parts: list[RenderableType] = [
        *(_line(t) for t in _title_lines(snapshot, query, header, now_ms)),
        _line(""),
        *kueue,
        *_section("PODS", pods, len(view.pods), view.pods_matched),
        _line(""),
        *_section(
            "GPUS",
            _gpus_table(cut, names, now_ms, by_cluster),
            len(view.gpus),
            view.gpus_matched,
        ),
        _line(""),
        *_section(
            "ALERTS FIRING",
            _alerts_table(cut, names, now_ms, by_cluster),
            len(view.alerts),
            view.alerts_matched,
        ),
    ]
    extra = notes(snapshot, header)
    if extra:
        parts += [_line(""), *(_line(f"note: {n}") for n in extra)]
    hidden = sum(len(a) - len(b) for a, b in zip(_tables(view), _tables(cut), strict=True))
    return Frame(Group(*parts), hidden + kueue_hidden)


def _tables(view: View) -> tuple[Sequence[Any], ...]:
    return view.pods, view.gpus, view.alerts


def render_text(snapshot: Snapshot, query: Query, header: Header, now_ms: int) -> str:
    """The frame as plain text (`--once`, pipes): every row, no escape, columns two spaces
    apart."""
    return plain(frame(snapshot, query, header, now_ms))


def fit_screen(
    console: Console, view: RenderableType, columns: int, rows: int, hidden: int = 0
) -> Segments:
    """`view` cut to a terminal: lines to `columns` (the lines of `render_text` cut at the
    right edge, never wrapped), and to `rows` with a last line that says how many were cut
    (so a redraw never scrolls), `hidden` lines left out of `view` counted among them."""
    options = console.options.update(width=WIDE, height=None, no_wrap=True)
    lines = console.render_lines(view, options, pad=False, new_lines=False)
    if len(lines) + hidden >= rows:
        cut = len(lines) + hidden - (rows - 2)
        note = Segment(f"... {cut} more lines: use --limit"[:columns])
        lines = [*lines[: max(0, rows - 2)], [note]]
    segments: list[Segment] = []
    for line in lines:
        segments += [*Segment.adjust_line_length(line, columns, pad=False), Segment.line()]
    return Segments(segments)
