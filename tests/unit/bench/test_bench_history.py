"""`gpuwatch bench worker`'s recorded-history part, pure: options, figures, fields, restarts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from bench_results import worker_result

from gpuwatch import cli
from gpuwatch.harness.bench import history
from gpuwatch.harness.bench.history import (
    Histories,
    HistorySetup,
    Liveness,
    format_histories,
    history_fields,
    history_run,
)
from gpuwatch.harness.bench.procs import LIVENESS_PERIOD_S, MB, WorkerProcess
from gpuwatch.harness.bench.report import format_worker, worker_json
from gpuwatch.harness.bench.worker import config_from_args, parse_hours, worker_config


def _config(*argv: str) -> Any:
    return config_from_args(cli.build_parser().parse_args(["bench", *argv]))


# -- options ------------------------------------------------------------------------------


def test_the_full_run_works_off_6_and_24_hours_of_1000_gpus_and_quick_1_and_4_of_200() -> None:
    full = worker_config(quick=False)
    assert (full.backlog_hours, full.backlog_nodes * full.gpus, full.backlog) == (
        (6, 24),
        1000,
        True,
    )
    quick = worker_config(quick=True)
    assert (quick.backlog_hours, quick.backlog_nodes * quick.gpus) == ((1, 4), 200)
    assert full.backlog_memory_limit_mb is None


def test_the_backlog_options_reach_the_configuration() -> None:
    config = _config(
        "--backlog-hours", "2,12", "--backlog-memory-limit-mb", "500", "--backlog-nodes", "18"
    )
    assert (config.backlog_hours, config.backlog_memory_limit_mb) == ((2, 12), 500)
    assert config.backlog_nodes == 18
    assert _config("--quick", "--backlog-nodes", "18").backlog_nodes == 18
    assert _config("--no-backlog").backlog is False
    only = _config("--quick", "--only-backlog")
    assert only.only_backlog
    assert (only.two_workers, only.alerts) == (False, False)  # nor does it need prometheus


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backlog-hours", "6,x"], "whole hours"),
        (["--backlog-hours", "0"], "--backlog-hours must be 1..168"),
        (["--backlog-hours", "6,6"], "twice"),
        (["--only-backlog", "--no-backlog"], "nothing to run"),
        (["--backlog-memory-limit-mb", "0"], "at least 1"),
        (["--backlog-nodes", "0"], "--backlog-nodes must be 1..1000"),
    ],
)
def test_backlog_options_out_of_range_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config("--quick", *argv)


def test_hours_are_comma_separated() -> None:
    assert parse_hours("6,24") == (6, 24)
    assert parse_hours("1") == (1,)


# -- figures --------------------------------------------------------------------------------

SIX_HOURS = HistorySetup(hours=6, nodes=125, gpus=8)


def _watched(cpu_s: float, peak_mb: float, restarts: int = 0) -> Any:
    watch = history._Watch(cpu_done_s=cpu_s, peak_mb=peak_mb, restarts=restarts)
    return watch


def test_a_history_worked_off_gives_its_rate_cpu_and_memory_over_idle() -> None:
    run = history_run(
        SIX_HOURS,
        379_000,
        messages=47_375,
        idle_rss=80.0,
        watch=_watched(cpu_s=218.3, peak_mb=538.0),
        worked_off_s=209.0,
        rate=1835.0,
        end_rss=380.0,
        limit_bytes=900 * MB,
    )
    assert run.finished
    assert SIX_HOURS.seconds == 21_600
    assert run.gpu_samples_per_s == 1835.0
    assert run.gpu_seconds_per_s == pytest.approx(1835.0 * 57)
    assert run.worker_cpu_us_per_gpu_sample == pytest.approx(218.3 / 379_000 * 1e6)
    assert run.worker_cores == pytest.approx(218.3 / 209.0)
    assert (run.peak_mb, run.peak_over_idle_mb, run.end_over_idle_mb) == (538.0, 458.0, 300.0)
    assert (run.restarts, run.address_space_limit_mb, run.error) == (0, 900.0, None)


def test_a_history_not_worked_off_keeps_its_memory_and_restarts_but_no_rate() -> None:
    run = history_run(
        SIX_HOURS,
        379_000,
        messages=47_375,
        idle_rss=80.0,
        watch=_watched(cpu_s=50.0, peak_mb=900.0, restarts=4),
        error="the worker ended 4 times",
    )
    assert not run.finished
    assert (run.worked_off_s, run.gpu_samples_per_s, run.worker_cpu_us_per_gpu_sample) == (
        None,
        None,
        None,
    )
    assert (run.peak_over_idle_mb, run.restarts) == (820.0, 4)
    assert (
        "NOT worked off (the worker ended 4 times); restarts 4"
        in format_histories(Histories((6,), {6: run}))[0]
    )


def test_each_history_has_its_fields_in_the_json_line_null_when_not_run() -> None:
    run = history_run(
        HistorySetup(hours=1, nodes=25, gpus=8),
        12_600,
        messages=1_575,
        idle_rss=80.0,
        watch=_watched(cpu_s=1.4, peak_mb=150.0),
        worked_off_s=3.8,
        rate=3339.0,
        end_rss=150.0,
    )
    histories = Histories((1, 4), {1: run})
    data = json.loads(worker_json(worker_result(), backlog=histories))
    assert data["backlog_1h_gpu_samples"] == 12_600
    assert data["backlog_1h_gpu_samples_per_s"] == 3339.0
    assert data["backlog_1h_worked_off_s"] == 3.8
    assert data["backlog_1h_peak_over_idle_mb"] == 70.0
    assert data["backlog_1h_end_over_idle_mb"] == 70.0
    assert data["backlog_1h_restarts"] == 0
    assert data["backlog_1h_finished"] is True
    assert data["backlog_4h_gpu_samples_per_s"] is None  # asked for, not run
    ours = {k for k in data if k.startswith(("backlog_1h_", "backlog_4h_"))}
    assert set(history_fields(Histories((1, 4)))) == ours
    assert all(v is None for v in history_fields(Histories((1, 4))).values())
    assert "backlog_6h_restarts" not in data
    text = format_worker(worker_result(), backlog=histories)
    assert "backlog   1 h          12600 GPU-samples (25 nodes x 8 GPUs every 57 s)" in text
    assert "peak +70 MB, at the end +70 MB; restarts 0" in text


# -- restarts -------------------------------------------------------------------------------


def test_three_failed_liveness_probes_in_a_row_restart_the_worker() -> None:
    probe = Liveness()
    assert [probe.restart(live) for live in (False, False, True, False, False)] == [False] * 5
    assert probe.restart(False)


class _FakeProcess:
    def __init__(self, code: int | None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


class _FakeWorker:
    """A worker that has exited (`code`) or runs, live or not."""

    def __init__(self, code: int | None = None, live: bool = True) -> None:
        self.process = _FakeProcess(code)
        self._live = live
        self.killed = False

    def cpu_s(self) -> float:
        return 2.0

    def peak_mb(self) -> float:
        return 300.0

    def live(self) -> bool:
        return self._live

    def kill(self) -> None:
        self.killed = True
        self.process.code = -9

    def log_tail(self, chars: int = 3000) -> str:
        return "starting\nMemoryError\n"


def test_a_worker_that_exits_is_started_again_counted_and_given_up_past_the_limit() -> None:
    started: list[_FakeWorker] = []

    def start() -> WorkerProcess:
        started.append(_FakeWorker(code=1))
        return cast(WorkerProcess, started[-1])

    supervisor = history._Supervisor(cast(WorkerProcess, _FakeWorker()), start, 0.0)
    supervisor.worker = start()
    errors = [supervisor.step(0.0) for _ in range(history.MAX_RESTARTS + 1)]
    assert errors[:-1] == [None] * history.MAX_RESTARTS
    assert errors[-1] is not None
    assert errors[-1].startswith("the worker ended 4 times (exited (1): MemoryError; exited (1)")
    assert "MemoryError" in errors[-1]
    assert supervisor.watch.restarts == history.MAX_RESTARTS + 1


def test_a_worker_failing_its_liveness_probe_is_killed_and_started_again() -> None:
    fresh: list[_FakeWorker] = []

    def start() -> WorkerProcess:
        fresh.append(_FakeWorker())
        return cast(WorkerProcess, fresh[-1])

    stuck = _FakeWorker(live=False)
    supervisor = history._Supervisor(cast(WorkerProcess, stuck), start, 0.0)
    period = LIVENESS_PERIOD_S
    for i in range(1, 4):
        assert supervisor.step(i * period) is None
    assert stuck.killed
    assert len(fresh) == 1
    assert supervisor.watch.causes == ["3 liveness probes failed"]
    assert supervisor.watch.cpu_s == pytest.approx(0.0 + 2.0 - 2.0)  # the stuck one's CPU


def test_the_logs_of_a_history_not_worked_off_are_kept(tmp_path: Path) -> None:
    (tmp_path / "worker-1.log").write_text("MemoryError\n")
    (tmp_path / "worker-2.log").write_text("starting\n")
    kept = history._keep(tmp_path)
    try:
        assert sorted(p.name for p in kept.iterdir()) == ["worker-1.log", "worker-2.log"]
        assert (kept / "worker-1.log").read_text() == "MemoryError\n"
    finally:
        shutil.rmtree(kept)
