"""How `gpuwatch replay` shows a story: a plain-text table, JSON events, a PNG plot.

Pure formatting over `gpuwatch.replay.story.Story`; times are UTC. matplotlib, an optional
extra, is imported only when a plot is drawn (it takes about a second), by
`gpuwatch/plotting.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from gpuwatch.plotting import pyplot
from gpuwatch.replay.story import Event, GpuSamples, Story
from gpuwatch.tables import table_lines
from gpuwatch.timerange import format_duration, format_time
from schemas import Alert, Attribution, GpuWindow, K8sNode, K8sWorkload, PodLifecycle
from streams.core.workload.workloads import standing

if TYPE_CHECKING:
    from gpuwatch.replay.rerun import RerunResult

__all__ = ["STATE_COLOURS", "plot", "render_rerun", "render_text", "rerun_json", "to_json"]

GIB = 1 << 30
STATE_COLOURS = {
    "queued": "#f2c14e",
    "running": "#7fc97f",
    "stalled": "#e4572e",
    "finished": "#bdbdbd",
}
_LABELS = {
    "node": "node",
    "workload": "kueue",
    "lifecycle": "lifecycle",
    "alert": "alert",
    "attribution": "window",
    "gpu_window": "gpu window",
    "samples": "samples",
}


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _short(uid: str) -> str:
    return uid[:12] if uid.startswith(("GPU-", "MIG-")) else uid[:8]


def _window(start: int, end: int) -> str:
    return f"{format_time(start, date=False)}-{format_time(end, date=False)}"


def _who(story: Story, uid: str) -> str:
    """A pod as the line names it: nothing for the one pod of a pod story."""
    if story.subject.kind == "pod" and len(story.scope.uids) <= 1:
        return ""
    name = story.scope.uids.get(uid, "")
    return f"{name} ({_short(uid)})  " if name else f"uid {_short(uid)}  "


def _detail(story: Story, event: Event) -> str:
    r = event.record
    if isinstance(r, PodLifecycle):
        moved = f"{r.from_state or 'new'} -> {r.to_state}"
        reason = f" ({r.reason})" if r.reason else ""
        times = (
            f"queued {format_duration(r.queued_ms)}  running {format_duration(r.running_ms)}  "
            f"stalled {format_duration(r.stalled_ms)}"
        )
        where = f"  on {r.node}" if r.node and story.subject.kind != "node" else ""
        return f"{_who(story, r.uid)}{moved}{reason}  {times}{where}"
    if isinstance(r, Attribution):
        return _attribution(story, r)
    if isinstance(r, Alert):
        value = "" if r.value is None else f"  value {r.value:g}"
        return f"{r.status.upper()} {r.name} ({r.severity})  {r.summary}{value}"
    if isinstance(r, GpuWindow):
        util = "util ?" if r.util_mean_pct is None else f"util {r.util_mean_pct:.0f}%"
        pods = ", ".join(f"{p.namespace}/{p.pod}" for p in r.pods) or "no pod"
        return (
            f"{_short(r.uuid)}  {_window(r.window_start, r.window_end)}  {util}  "
            f"busy {r.busy_seconds:.0f}s  idle {r.idle_seconds:.0f}s  allocated-idle "
            f"{r.allocated_idle_seconds:.0f}s  unallocated {r.unallocated_seconds:.0f}s  {pods}"
            f"{_revised(r.revision)}"
        )
    if isinstance(r, K8sNode):
        return f"{r.type}  ready={r.ready}  unschedulable={r.unschedulable}"
    if isinstance(r, K8sWorkload):
        return _workload(r)
    return (
        f"{_short(r.uuid)}  {r.count} samples, util mean {_pct(r.util_mean_pct)} "
        f"max {_pct(r.util_max_pct)}"
    )


def _workload(r: K8sWorkload) -> str:
    """A Kueue workload's standing: queued (why, Kueue's words), admitted, finished."""
    state, reason, message = standing(r)
    gpus = ", ".join(f"{n} {resource}" for resource, n in sorted(r.gpu_request.items()))
    head = f"workload {r.namespace}/{r.name} (queue {r.queue or '?'}"
    head += f", {r.pods} pods, {gpus})" if gpus else f", {r.pods} pods)"
    if state == "admitted":
        waited = format_duration(r.ts - r.created_at)
        return f"{head} admitted to ClusterQueue {r.cluster_queue or '?'} after {waited}"
    words = f"  {message}" if message else ""
    return f"{head} {state}" + (f" ({reason})" if reason else "") + words


def _attribution(story: Story, r: Attribution) -> str:
    used, alloc, idle = r.used_gpu_seconds, r.allocated_gpu_seconds, r.idle_gpu_seconds
    vram, cost = r.vram_peak_bytes, r.cost_usd
    waste = f"waste ${r.waste_usd:.4f}"
    if story.subject.kind == "gpu":
        # The pod's part of this GPU; its totals may span others, and waste is per pod only.
        part = next(g for g in r.gpus if g.uuid == story.subject.value)
        used, alloc, idle = part.used_gpu_seconds, part.allocated_gpu_seconds, part.idle_gpu_seconds
        vram, cost = part.vram_peak_bytes, part.cost_usd
        waste = f"(this GPU's part; the pod's waste ${r.waste_usd:.4f})"
    return (
        f"{_who(story, r.uid)}{_window(r.window_start, r.window_end)}  {r.state}  "
        f"used {used:.1f} of {alloc:.1f} GPU-s  idle {idle:.1f}  VRAM peak {_gib(vram)}  "
        f"cost ${cost:.4f}  {waste}{_revised(r.revision)}"
    )


def _revised(revision: int) -> str:
    """A window revised after it closed (usage came late) says so; the first copy nothing."""
    return f"  (revision {revision})" if revision else ""


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}%"


def _header(story: Story) -> list[str]:
    span = story.range
    lines = [
        f"gpuwatch replay  {story.subject}  {format_time(span.start_ms)} -> "
        f"{format_time(span.end_ms)} UTC ({format_duration(span.end_ms - span.start_ms)})"
    ]
    scope = story.scope
    if story.subject.kind == "pod":
        uids = ", ".join(sorted(scope.uids)) or "?"
        lines.append(f"  uid {uids}")
    elif scope.uids:
        pods = sorted(set(scope.uids.values()))
        shown = ", ".join(pods[:8]) + (f" and {len(pods) - 8} more" if len(pods) > 8 else "")
        lines.append(f"  pods {shown}")
    if scope.nodes and story.subject.kind != "node":
        lines.append(f"  nodes {', '.join(sorted(scope.nodes))}")
    if scope.gpus and story.subject.kind != "gpu":
        lines.append(f"  GPUs {', '.join(sorted(scope.gpus))}")
    return lines


def _totals(story: Story) -> list[str]:
    windows = [e.record for e in story.events if isinstance(e.record, Attribution)]
    lines = []
    if windows and story.subject.kind != "gpu":
        lines.append(
            f"attribution: {len(windows)} pod windows, allocated "
            f"{sum(w.allocated_gpu_seconds for w in windows):.1f} GPU-s, used "
            f"{sum(w.used_gpu_seconds for w in windows):.1f}, idle "
            f"{sum(w.idle_gpu_seconds for w in windows):.1f}, cost "
            f"${sum(w.cost_usd for w in windows):.4f}, waste "
            f"${sum(w.waste_usd for w in windows):.4f}"
        )
    gpu_windows = [e.record for e in story.events if isinstance(e.record, GpuWindow)]
    if gpu_windows:
        lines.append(
            f"gpu windows: {len(gpu_windows)}, busy "
            f"{sum(w.busy_seconds for w in gpu_windows):.0f} s, idle "
            f"{sum(w.idle_seconds for w in gpu_windows):.0f} s (allocated "
            f"{sum(w.allocated_idle_seconds for w in gpu_windows):.0f} s, unallocated "
            f"{sum(w.unallocated_seconds for w in gpu_windows):.0f} s)"
        )
    return lines


def _samples_table(samples: list[GpuSamples], pod: bool) -> list[str]:
    title = "samples of the pod's GPUs while allocated to it" if pod else "samples"
    if not samples:
        return [f"{title}: none in the range"]
    rows = [("GPU", "NODE", "MODEL", "SAMPLES", "UTIL MEAN", "UTIL MAX", "VRAM PEAK", "SEQ GAPS")]
    for s in samples:
        gaps = f"{s.seq_gaps}" + (f" ({s.seq_resets} resets)" if s.seq_resets else "")
        unknown = s.count - s.util_known
        count = f"{s.count}" + (f" ({unknown} no util)" if unknown else "")
        peak = f"{_gib(s.vram_peak_bytes)} / {_gib(s.mem_total_bytes)}"
        rows.append(
            (
                s.uuid,
                s.node,
                s.model,
                count,
                _pct(s.util_mean_pct),
                _pct(s.util_max_pct),
                peak,
                gaps,
            )
        )
    return [f"{title}:", *_table(rows)]


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """The first row the header; every column to the left."""
    return table_lines(rows[0], rows[1:])


def render_text(story: Story) -> str:
    """The story as plain text: header, one line per event, totals, samples, notes."""
    lines = [*_header(story), ""]
    events = [e for e in story.events if e.kind != "samples"]
    if events:
        rows = [("TIME (UTC)", "EVENT", "DETAIL")]
        rows += [(format_time(e.ts), _LABELS[e.kind], _detail(story, e)) for e in events]
        lines += _table(rows)
    else:
        lines.append("no lifecycle transition, window or alert in the range")
    lines += ["", *_totals(story), *_samples_table(story.samples, story.subject.kind == "pod")]
    if story.notes:
        lines += ["", *(f"note: {note}" for note in story.notes)]
    return "\n".join(lines) + "\n"


def to_json(story: Story) -> str:
    """The story as a JSON list of typed events: kind, ts (epoch ms), time (UTC) and record."""
    items = [
        {
            "kind": e.kind,
            "ts": e.ts,
            "time": datetime.fromtimestamp(e.ts / 1000, UTC).isoformat().replace("+00:00", "Z"),
            "record": msgspec.to_builtins(e.record),
        }
        for e in story.events
    ]
    return json.dumps(items, indent=1) + "\n"


def plot(story: Story, path: Path) -> int:
    """Draw utilization and VRAM of the subject's GPUs with the pod's state bands; points drawn."""
    plt = pyplot()

    def when(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, UTC)

    fig: Any
    fig, (util_ax, vram_ax) = plt.subplots(2, 1, sharex=True, figsize=(11, 6), dpi=100)
    drawn = 0
    try:
        for uuid, points in sorted(story.series.items()):
            xs = [when(p.ts) for p in points]
            util = [float("nan") if p.util_pct is None else p.util_pct for p in points]
            util_ax.plot(xs, util, linewidth=0.9, label=_short(uuid))
            vram_ax.plot(xs, [p.mem_used_bytes / GIB for p in points], linewidth=0.9)
            drawn += len(points)
        seen: set[str] = set()
        for band in story.bands:
            for ax in (util_ax, vram_ax):
                ax.axvspan(
                    when(band.start_ms),
                    when(band.end_ms),
                    color=STATE_COLOURS.get(band.state, "#dddddd"),
                    alpha=0.25,
                    linewidth=0,
                    label=None if band.state in seen or ax is vram_ax else band.state,
                )
            seen.add(band.state)
        for event in story.events:
            if isinstance(event.record, Alert) and event.record.status == "firing":
                util_ax.axvline(when(event.ts), color="#c0392b", linewidth=0.8, linestyle="--")
        util_ax.set_ylabel("utilization %")
        util_ax.set_ylim(0, 105)
        vram_ax.set_ylabel("VRAM used (GiB)")
        vram_ax.set_xlabel("time (UTC); dashed: alerts firing")
        vram_ax.set_xlim(when(story.range.start_ms), when(story.range.end_ms))
        util_ax.set_title(
            f"{story.subject}  {format_time(story.range.start_ms)} -> "
            f"{format_time(story.range.end_ms)} UTC"
        )
        if story.series or story.bands:
            util_ax.legend(loc="upper right", fontsize="small", ncol=4)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return drawn


_TOTALS = (
    ("pod_windows", "pod windows", "{:.0f}"),
    ("allocated_gpu_seconds", "allocated GPU-s", "{:.1f}"),
    ("used_gpu_seconds", "used GPU-s", "{:.1f}"),
    ("idle_gpu_seconds", "idle GPU-s (pods)", "{:.1f}"),
    ("cost_usd", "cost USD", "{:.4f}"),
    ("waste_usd", "waste USD", "{:.4f}"),
    ("gpu_windows", "GPU windows", "{:.0f}"),
    ("gpu_idle_seconds", "GPU idle s", "{:.1f}"),
    ("gpu_allocated_idle_seconds", "GPU allocated-idle s", "{:.1f}"),
)
_RULES = ("idle_util_pct", "stall_after_s", "window_s", "allowed_lateness_s")


def render_rerun(result: RerunResult) -> str:
    """What a rerun copied and made, and its idle and waste beside live's for the same windows."""
    span = result.span
    copied = ", ".join(
        f"{topic} {n}"
        + (f" ({result.before_range[topic]} of them each one's last before the range)"
           if result.before_range.get(topic) else "")
        for topic, n in result.copied.items()
    )  # fmt: skip
    rules = "  ".join(f"{k} {result.settings[k]:g}" for k in _RULES if k in result.settings)
    lines = [
        f"gpuwatch replay --rerun  {format_time(span.start_ms)} -> {format_time(span.end_ms)} "
        f"UTC (whole windows) into prefix {result.prefix!r}"
        + ("" if result.cluster is None else f", cluster {result.cluster} only"),
        f"  settings  {rules}",
        f"  copied    {copied}",
        f"  worker    app id {result.app_id}, Redis {result.redis_url}, caught up in "
        f"{result.caught_up_s:.1f} s, log {result.worker_log}",
        "",
        *_table([("TOPIC", "RECORDS"), *((t, str(n)) for t, n in result.derived.items())]),
        "",
    ]
    rows = [("WINDOWS INSIDE THE RANGE", "RERUN", "LIVE (same windows)")]
    for key, label, fmt in _TOTALS:
        rerun, live = result.rerun_totals.get(key, 0.0), result.live_totals.get(key, 0.0)
        rows.append((label, fmt.format(rerun), fmt.format(live)))
    lines += _table(rows)
    lines += [
        "",
        f"its story: gpuwatch --topic-prefix {result.prefix} replay --pod NS/NAME "
        f"--from {span.start_ms} --to {span.end_ms}",
        f"its Redis: gpuwatch --redis-url {result.redis_url} top --once",
        *(f"note: {note}" for note in result.notes),
    ]
    return "\n".join(lines) + "\n"


def rerun_json(result: RerunResult) -> str:
    """The rerun's result as one JSON object."""
    return json.dumps(msgspec.to_builtins(result), indent=1) + "\n"
