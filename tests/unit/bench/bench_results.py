"""A `gpuwatch bench worker` result of a quick run, for the tests of its JSON and summary."""

from __future__ import annotations

from gpuwatch.harness.bench.report import WorkerResult


def worker_result(**changes: object) -> WorkerResult:
    """A quick run's figures, with `changes`."""
    base = {
        "nodes": 1000,
        "gpus_per_node": 8,
        "backlog_seconds": 3,
        "messages": 3000,
        "gpu_samples": 24_000,
        "pods": 8000,
        "sample_bytes": 5675.0,
        "gpu_samples_per_s": 6_000.0,
        "drain_s": 4.0,
        "worker_cpu_us_per_gpu_sample": 170.0,
        "worker_cores": 1.02,
        "broker_cores": 0.4,
        "sink_cpu_us_per_gpu_sample": 30.0,
        "sink_cores": 0.5,
        "sink_drain_s": 5.0,
        "sink_rss_mb": 70.0,
        "sink_rss_peak_mb": 75.0,
        "sink_kafka_errors": 0,
        "baseline_gpu_samples_per_s": 150_000.0,
        "baseline_cpu_us_per_gpu_sample": 5.0,
        "faust_floor_gpu_samples_per_s": 30_000.0,
        "faust_floor_cpu_us_per_gpu_sample": 28.0,
        "inbox_floor_gpu_samples_per_s": 60_000.0,
        "inbox_floor_cpu_us_per_gpu_sample": 15.0,
        "paced_target_gpu_samples_per_s": 4_000.0,
        "paced_achieved_gpu_samples_per_s": 3_990.0,
        "paced_processed_gpu_samples_per_s": 3_900.0,
        "paced_seconds": 8.0,
        "paced_kept_up": True,
        "e2e_samples": 96,
        "e2e_censored": 0,
        "e2e_p50_ms": 600.0,
        "e2e_p99_ms": 1500.0,
        "e2e_max_ms": 1600.0,
        "worker_rss_idle_mb": 86.0,
        "worker_rss_mb": 166.0,
        "worker_rss_peak_mb": 200.0,
        "rss_mb_per_10k_pods": 100.0,
        "producer_cpu_us_per_gpu_sample": 17.0,
        "producer_figure": "tick",
    }
    return WorkerResult(**{**base, **changes})  # type: ignore[arg-type]
