"""The figures of `gpuwatch bench worker`: its result, one JSON line, a summary and a plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gpuwatch.harness.bench.alert_figures import AlertResult, alert_fields, format_alerts
from gpuwatch.harness.bench.figures import Latencies
from gpuwatch.harness.bench.history import Histories, format_histories, history_fields
from gpuwatch.harness.bench.scale import TwoWorkers
from gpuwatch.plotting import pyplot

__all__ = [
    "TARGET_GPU_SAMPLES_PER_S",
    "TARGET_P99_MS",
    "TARGET_RATIO",
    "Latencies",
    "WorkerResult",
    "WorkerRun",
    "format_worker",
    "worker_json",
    "write_plot",
]

TARGET_GPU_SAMPLES_PER_S = 40_000  # 5,000 nodes x 8 GPUs at 1 Hz: the largest clusters
TARGET_RATIO = 0.5  # the worker at least half as fast as a loop that only decodes
TARGET_P99_MS = 2_000  # seconds of latency, against minutes of scrape-based alerting


@dataclass(frozen=True)
class WorkerResult:
    """The figures of one run: rates in GPU-samples per second, times in ms, memory in MB."""

    nodes: int
    gpus_per_node: int
    backlog_seconds: int
    messages: int
    gpu_samples: int
    pods: int
    sample_bytes: float
    gpu_samples_per_s: float
    """The worker working off the backlog."""
    drain_s: float
    worker_cpu_us_per_gpu_sample: float
    """CPU of the worker process, all threads, while it worked off the backlog."""
    worker_cores: float
    """The worker's CPU seconds per second meanwhile."""
    broker_cores: float | None
    """The broker's CPU seconds per second meanwhile, when its pid can be read."""
    sink_cpu_us_per_gpu_sample: float
    """CPU of the Redis sink process over the same backlog: every sample and the records
    the worker made of them written, per GPU-sample."""
    sink_cores: float
    """The sink's CPU seconds per second from the resume until it had written the backlog."""
    sink_drain_s: float
    sink_rss_mb: float
    """The sink's VmRSS once it had written the backlog."""
    sink_rss_peak_mb: float
    sink_kafka_errors: int | None
    """Polls and commits Kafka refused the sink over the backlog, and consumers it made
    anew (its `gpuwatch_sink_kafka_errors_total`); None: its /metrics did not answer."""
    baseline_gpu_samples_per_s: float | None
    """A bare aiokafka consumer reading and decoding the same backlog (None: it failed,
    `baseline_error` says why; likewise each floor)."""
    baseline_cpu_us_per_gpu_sample: float | None
    faust_floor_gpu_samples_per_s: float | None
    """A Faust agent that only decodes, on the same backlog: the framework's ceiling."""
    faust_floor_cpu_us_per_gpu_sample: float | None
    inbox_floor_gpu_samples_per_s: float | None
    """The same agent with the records delivered as the worker's agents get them (the
    agents' inboxes, `streams.faust.inbox`): the ceiling of the worker's own path."""
    inbox_floor_cpu_us_per_gpu_sample: float | None
    paced_target_gpu_samples_per_s: float
    paced_achieved_gpu_samples_per_s: float
    """What the one paced producer sent."""
    paced_processed_gpu_samples_per_s: float
    """What the worker committed of the paced samples, per second since the first was sent."""
    paced_seconds: float
    paced_kept_up: bool
    e2e_samples: int
    e2e_censored: int
    """Samples not in Redis when the wait ended, counted as lower bounds."""
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    e2e_max_ms: float | None
    worker_rss_idle_mb: float
    worker_rss_mb: float
    """After the backlog: every pod of the fleet tracked."""
    worker_rss_peak_mb: float
    rss_mb_per_10k_pods: float
    producer_cpu_us_per_gpu_sample: float
    producer_figure: str
    baseline_error: str | None = None
    """Why the bare consumer has no figures (it failed or ran past its deadline)."""
    faust_floor_error: str | None = None
    inbox_floor_error: str | None = None

    @property
    def ratio(self) -> float | None:
        """Worker over the bare consumer (None without its figure)."""
        return _over(self.gpu_samples_per_s, self.baseline_gpu_samples_per_s)

    @property
    def ratio_to_faust_floor(self) -> float | None:
        """Worker over the Faust floor."""
        return _over(self.gpu_samples_per_s, self.faust_floor_gpu_samples_per_s)

    @property
    def ratio_to_inbox_floor(self) -> float | None:
        """Worker over the floor of its own delivery path."""
        return _over(self.gpu_samples_per_s, self.inbox_floor_gpu_samples_per_s)


def _over(rate: float, baseline: float | None) -> float | None:
    return None if not baseline else rate / baseline


@dataclass(frozen=True)
class WorkerRun:
    """A result and the latencies behind its percentiles."""

    result: WorkerResult
    latencies: Latencies
    two: TwoWorkers | None = None
    """Two workers in one group on the same backlog, when that part ran."""
    alerts: AlertResult | None = None
    """The idle-alert part, when it ran."""
    backlog: Histories | None = None
    """The histories asked for, and those worked off."""


def worker_json(
    result: WorkerResult,
    two: TwoWorkers | None = None,
    alerts: AlertResult | None = None,
    backlog: Histories | None = None,
) -> str:
    """One JSON line: every figure, the ratios and the targets; a part not run is null
    (the histories' fields, `backlog_{hours}h_...`, for the hours in `backlog`)."""
    data: dict[str, Any] = asdict(result)
    if two is None:
        data.update(dict.fromkeys(f.name for f in fields(TwoWorkers)))
    else:
        data.update(asdict(two))
    data.update(alert_fields(alerts))
    if backlog is not None:
        data.update(history_fields(backlog))
    data["ratio"] = result.ratio
    data["ratio_to_faust_floor"] = result.ratio_to_faust_floor
    data["ratio_to_inbox_floor"] = result.ratio_to_inbox_floor
    data["targets"] = {
        "gpu_samples_per_s": TARGET_GPU_SAMPLES_PER_S,
        "ratio": TARGET_RATIO,
        "e2e_p99_ms": TARGET_P99_MS,
    }
    return json.dumps(data, sort_keys=True)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def format_worker(
    result: WorkerResult,
    two: TwoWorkers | None = None,
    alerts: AlertResult | None = None,
    backlog: Histories | None = None,
) -> str:
    """A human summary, each figure against its target."""
    r = result
    at_target = r.paced_achieved_gpu_samples_per_s >= 0.95 * TARGET_GPU_SAMPLES_PER_S
    p99_ok = at_target and r.e2e_p99_ms is not None and r.e2e_p99_ms <= TARGET_P99_MS
    bound = ">=" if r.e2e_censored else ""
    latency = (
        "no sample watched"
        if r.e2e_p50_ms is None or r.e2e_p99_ms is None or r.e2e_max_ms is None
        else f"p50 {bound}{r.e2e_p50_ms:.0f} ms, p99 {bound}{r.e2e_p99_ms:.0f} ms, "
        f"max {bound}{r.e2e_max_ms:.0f} ms"
    )
    kept = "kept up" if r.paced_kept_up else "fell behind: latency grew"
    return "\n".join(
        [
            f"worker: {r.nodes} nodes x {r.gpus_per_node} GPUs, {r.backlog_seconds} s backlog = "
            f"{r.messages} samples of {r.sample_bytes:.0f} bytes, {r.pods} pods",
            f"  worker, backlog        {r.gpu_samples_per_s:9.0f} GPU-samples/s "
            f"({r.worker_cpu_us_per_gpu_sample:.0f} us CPU each, {r.worker_cores:.2f} cores, "
            f"{r.drain_s:.0f} s)  target {TARGET_GPU_SAMPLES_PER_S}: "
            f"{_met(r.gpu_samples_per_s >= TARGET_GPU_SAMPLES_PER_S)}",
            _baseline(
                "baseline, bare decode ",
                r.baseline_gpu_samples_per_s,
                r.baseline_cpu_us_per_gpu_sample,
                "",
                r.baseline_error,
            ),
            _baseline(
                "Faust floor, decode   ",
                r.faust_floor_gpu_samples_per_s,
                r.faust_floor_cpu_us_per_gpu_sample,
                "; through Faust's stream",
                r.faust_floor_error,
            ),
            _baseline(
                "inbox floor, decode   ",
                r.inbox_floor_gpu_samples_per_s,
                r.inbox_floor_cpu_us_per_gpu_sample,
                "; the worker's path",
                r.inbox_floor_error,
            ),
            f"  ratio worker/baseline  {_ratio(r.ratio, 9)}  target {TARGET_RATIO}: "
            f"{_met(r.ratio is not None and r.ratio >= TARGET_RATIO)}  "
            f"(worker/Faust floor {_ratio(r.ratio_to_faust_floor)}, "
            f"worker/inbox floor {_ratio(r.ratio_to_inbox_floor)})",
            f"  paced {r.paced_seconds:.0f} s at {r.paced_target_gpu_samples_per_s:.0f}/s: "
            f"sent {r.paced_achieved_gpu_samples_per_s:.0f}/s, worker "
            f"{r.paced_processed_gpu_samples_per_s:.0f}/s, {kept}",
            f"  end-to-end to Redis    {latency} ({r.e2e_samples} samples, "
            f"{r.e2e_censored} not there in time)  p99 target {TARGET_P99_MS} ms at "
            f"{TARGET_GPU_SAMPLES_PER_S}/s: {_met(p99_ok)}",
            f"  worker RSS             {r.worker_rss_mb:.0f} MB with {r.pods} pods "
            f"({r.worker_rss_idle_mb:.0f} MB idle, peak {r.worker_rss_peak_mb:.0f} MB): "
            f"{r.rss_mb_per_10k_pods:.1f} MB per 10,000 pods",
            f"  Redis sink process     {r.sink_cpu_us_per_gpu_sample:.1f} us CPU per GPU-sample "
            f"({r.sink_cores:.2f} cores, {r.sink_drain_s:.0f} s, RSS {r.sink_rss_mb:.0f} MB, "
            f"Kafka errors {r.sink_kafka_errors}); "
            f"broker {_cores(r.broker_cores)}",
            f"  producer               {r.producer_cpu_us_per_gpu_sample:.1f} us CPU per "
            f"GPU-sample ({r.producer_figure})",
            *([] if two is None else [_format_two(two)]),
            *([] if alerts is None else format_alerts(alerts)),
            *([] if backlog is None else format_histories(backlog)),
        ]
    )


def _baseline(
    label: str, rate: float | None, cpu_us: float | None, note: str, error: str | None
) -> str:
    if rate is None or cpu_us is None:
        return f"  {label} no figure: {error or 'not run'}"
    return f"  {label} {rate:9.0f} GPU-samples/s ({cpu_us:.1f} us CPU each{note})"


def _ratio(ratio: float | None, width: int = 0) -> str:
    return f"{'n/a':>{width}}" if ratio is None else f"{ratio:{width}.3f}"


def _cores(cores: float | None) -> str:
    return "unknown cores (its pid is not readable)" if cores is None else f"{cores:.2f} cores"


def _format_two(t: TwoWorkers) -> str:
    each = ", ".join(f"{c:.2f}" for c in t.two_worker_cores)
    return (
        f"  two workers, one group {t.two_worker_gpu_samples_per_s:9.0f} GPU-samples/s "
        f"(speed-up {t.two_worker_speedup:.2f}, {t.two_worker_cpu_us_per_gpu_sample:.0f} us CPU "
        f"each = {t.two_worker_cpu_ratio:.2f}x one worker's; cores {each}, broker "
        f"{_cores(t.two_worker_broker_cores)})"
    )


def write_plot(run: WorkerRun, path: Path) -> None:
    """Throughput against the baselines and the target, and the latency CDF, as a PNG."""
    plt = pyplot()

    r = run.result
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [
        "worker",
        "Faust floor\n(decode only)",
        "inbox floor\n(decode only)",
        "bare aiokafka\n(decode only)",
    ]
    values = [
        r.gpu_samples_per_s,
        r.faust_floor_gpu_samples_per_s or 0.0,  # a failed baseline: no bar
        r.inbox_floor_gpu_samples_per_s or 0.0,
        r.baseline_gpu_samples_per_s or 0.0,
    ]
    bars = left.bar(names, values, color=["#4c72b0", "#dd8452", "#55a868", "#999999"])
    left.axhline(TARGET_GPU_SAMPLES_PER_S, color="#c44e52", linestyle="--", label="target")
    for bar, value in zip(bars, values, strict=True):
        if value > 0:
            left.annotate(f"{value:,.0f}", (bar.get_x() + bar.get_width() / 2, value), ha="center")
    left.set_yscale("log")
    left.set_ylabel("GPU-samples / s (log)")
    left.set_title(f"throughput, one process (worker/baseline {_ratio(r.ratio)})")
    left.legend(loc="upper left")
    latencies = sorted(ms / 1000 for _, ms in run.latencies.samples)
    if latencies:
        share = [(i + 1) / len(latencies) for i in range(len(latencies))]
        right.plot(latencies, share, color="#4c72b0", label="worker")
    right.axvline(TARGET_P99_MS / 1000, color="#c44e52", linestyle="--", label="p99 target")
    right.axhline(0.99, color="#999999", linestyle=":", linewidth=1)
    censored = run.latencies.censored
    note = f"; {censored} not there in time, at the wait's end" if censored else ""
    right.set_xlabel(f"sample sent -> its state in Redis (s){note}")
    right.set_ylabel("share of samples")
    right.set_title(
        f"latency, {r.paced_achieved_gpu_samples_per_s:,.0f} GPU-samples/s sent for "
        f"{r.paced_seconds:.0f} s"
    )
    right.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
