"""`gpuwatch bench worker`'s baselines: a failed one leaves the run's figures and says why."""

from __future__ import annotations

import json
import os
import sys

import pytest
from bench_results import worker_result

from gpuwatch.config import load_settings
from gpuwatch.harness.bench.probes import (
    Baseline,
    BaselineError,
    DecodeRun,
    attempt,
    floor_groups,
    floor_process,
    floor_settings,
)
from gpuwatch.harness.bench.procs import worker_env
from gpuwatch.harness.bench.report import format_worker, worker_json
from gpuwatch.harness.bench.worker import with_baselines

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_floor_past_its_deadline_is_killed_and_fails_as_a_baseline() -> None:
    with pytest.raises(
        BaselineError, match=r"the inbox floor had not read the backlog within 0.5 s"
    ):
        floor_process("inbox floor", SLEEPER, dict(os.environ), 0.5)
    failed = attempt(lambda: floor_process("inbox floor", SLEEPER, dict(os.environ), 0.5))
    assert failed.run is None
    assert failed.error is not None
    assert "within 0.5 s (killed)" in failed.error


def test_a_floor_that_exits_without_figures_fails_as_a_baseline() -> None:
    argv = [sys.executable, "-c", "import sys; print('no figures'); sys.exit(3)"]
    with pytest.raises(BaselineError, match=r"the Faust floor failed \(3\)"):
        floor_process("Faust floor", argv, dict(os.environ), 30)
    figures = [
        sys.executable,
        "-c",
        'print(\'{"seconds": 2, "cpu_seconds": 1, "gpu_samples": 8}\')',
    ]
    run = floor_process("Faust floor", figures, dict(os.environ), 30)
    assert (run.gpu_samples_per_s, run.cpu_us_per_gpu_sample) == (4.0, 125_000.0)


def test_a_failed_baseline_is_null_with_its_error_and_the_line_still_comes_out() -> None:
    bare = Baseline(DecodeRun(seconds=0.2, cpu_seconds=0.1, gpu_samples=24_000))
    floor = Baseline(DecodeRun(seconds=0.8, cpu_seconds=0.6, gpu_samples=24_000))
    inbox = Baseline(None, "the inbox floor had not read the backlog within 600 s (killed)")
    result = with_baselines(worker_result(), bare, floor, inbox)
    data = json.loads(worker_json(result))
    assert data["baseline_gpu_samples_per_s"] == pytest.approx(120_000.0)
    assert data["faust_floor_gpu_samples_per_s"] == pytest.approx(30_000.0)
    assert data["ratio"] == pytest.approx(0.05)
    assert data["ratio_to_faust_floor"] == pytest.approx(0.2)
    assert data["inbox_floor_gpu_samples_per_s"] is None
    assert data["inbox_floor_cpu_us_per_gpu_sample"] is None
    assert data["ratio_to_inbox_floor"] is None
    assert data["inbox_floor_error"] == inbox.error
    assert (data["baseline_error"], data["faust_floor_error"]) == (None, None)
    assert data["gpu_samples_per_s"] == 6000.0  # the worker's own figures stand
    text = format_worker(result)
    assert "inbox floor, decode    no figure: the inbox floor had not read" in text
    assert "worker/inbox floor n/a" in text
    nothing = with_baselines(worker_result(), Baseline(None, "x"), Baseline(None, "y"), inbox)
    assert "ratio worker/baseline        n/a  target 0.5: NOT met" in format_worker(nothing)


def test_each_floor_reads_in_a_consumer_group_of_its_own() -> None:
    settings = load_settings()
    app_id = settings.kafka.app_id
    assert floor_groups(settings) == [f"{app_id}-floor", f"{app_id}-inbox-floor"]
    faust = worker_env(floor_settings(settings, inbox=False), "redis://x/6", metrics_port=1)
    inbox = worker_env(floor_settings(settings, inbox=True), "redis://x/6", metrics_port=1)
    assert faust["GPUWATCH_APP_ID"] != inbox["GPUWATCH_APP_ID"]
    assert faust["GPUWATCH_TOPIC_PREFIX"] == inbox["GPUWATCH_TOPIC_PREFIX"]
