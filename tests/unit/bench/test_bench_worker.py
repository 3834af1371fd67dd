"""`gpuwatch bench worker`'s pure parts: options, percentiles, rates, latencies, its JSON line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_results import worker_result as result

from gpuwatch import cli
from gpuwatch.harness.bench.backlog import drain_deadline_s
from gpuwatch.harness.bench.figures import drain_rate, kept_up, latencies_ms, percentile
from gpuwatch.harness.bench.load import build_fleet
from gpuwatch.harness.bench.report import Latencies, WorkerRun, format_worker, worker_json
from gpuwatch.harness.bench.report import write_plot as write_plot_png
from gpuwatch.harness.bench.worker import FULL, QUICK, config_from_args, worker_config
from schemas.topics import K8S_PODS, NVML_SAMPLES

# -- options ------------------------------------------------------------------------------


def test_the_full_run_is_the_fleet_of_the_issue_and_quick_a_smaller_one() -> None:
    full = worker_config(quick=False)
    assert (full.nodes, full.gpus, full.seconds) == (5000, 8, 10)
    assert full.paced_gpu_samples_per_s == 40_000
    assert full.pods == 40_000
    assert full.redis_db == 6
    quick = worker_config(quick=True)
    assert quick == QUICK
    assert quick.nodes * quick.seconds < full.nodes * full.seconds
    assert quick.paced_gpu_samples_per_s * quick.paced_seconds < 40_000 * 30


def test_options_override_the_defaults_and_cap_the_watched_gpus_at_the_nodes() -> None:
    config = worker_config(
        quick=False, gpus=4, nodes=10, seconds=2, rate=800, paced_seconds=3, redis_db=9
    )
    assert (config.nodes, config.gpus, config.seconds, config.redis_db) == (10, 4, 2, 9)
    assert (config.paced_gpu_samples_per_s, config.paced_seconds) == (800, 3)
    assert config.watch == 10  # FULL watches 48 GPUs, one per node: there are 10 nodes
    assert config.catch_up_s == 30  # at least 30 s, else twice the paced load
    assert FULL.catch_up_s == 60


def test_the_paced_load_starts_far_enough_back_never_to_run_ahead_of_the_wall_clock() -> None:
    assert FULL.paced_lead_s == 0  # 5,000 node samples a second of 5,000 nodes: 1 s a second
    assert QUICK.paced_lead_s == 0  # 500 a second of 1,000 nodes: 4 s in 8 s
    # BENCHMARKS.md's backlog: 500 node samples a second of 125 nodes for 10 s are 40
    # rounds of 57 s each, 2,280 s of event time in 10 s of wall time.
    backlog = worker_config(
        quick=False, gpus=8, nodes=125, seconds=86_400, interval_s=57, rate=4000, paced_seconds=10
    )
    assert backlog.paced_lead_s == 2_270


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpus": 0}, "--gpus"),
        ({"nodes": 0}, "--nodes"),
        ({"seconds": 0}, "--seconds"),
        ({"gpus": 8, "rate": 7}, "--rate"),
        ({"paced_seconds": 0}, "--paced-seconds"),
        ({"redis_db": 0}, "--redis-db"),
        ({"redis_db": 16}, "--redis-db"),
    ],
)
def test_options_out_of_range_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        worker_config(quick=True, **options)


def test_the_command_line_reaches_the_configuration() -> None:
    args = cli.build_parser().parse_args(
        ["bench", "worker", "--quick", "--json", "--nodes", "200", "--rate", "1600"]
    )
    assert args.which == "worker"
    config = config_from_args(args)
    assert (config.nodes, config.paced_gpu_samples_per_s) == (200, 1600)
    assert config.seconds == QUICK.seconds


def test_the_worker_benchmark_is_the_default() -> None:
    args = cli.build_parser().parse_args(["bench", "--quick", "--json"])
    assert args.which == "worker"
    assert cli.build_parser().parse_args(["bench", "producer"]).which == "producer"


def test_a_bad_option_is_reported_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "worker", "--quick", "--redis-db", "0"]) == 1
    assert "bench worker: --redis-db must be 1..15" in capsys.readouterr().err


# -- arithmetic ---------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([4, 1, 3, 2], 0) == 1
    assert percentile([4, 1, 3, 2], 100) == 4
    assert percentile([4, 1, 3, 2], 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0


def test_percentile_agrees_with_numpy() -> None:
    values = [float(v) for v in np.random.default_rng(3).lognormal(6, 1, 501)]
    for q in (1, 50, 90, 99, 99.9):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_refuses_no_values_and_q_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], 101)


def test_the_rate_is_taken_at_the_last_commit_before_the_end() -> None:
    # Resumed at 100 s; commits seen at 103 s (400 done) and 106 s (all 1000 done). The
    # commit reaching the end may come a commit interval late: the one at 103 s decides.
    points = [(101.0, 0), (103.0, 400), (106.0, 1000), (108.0, 1000)]
    assert drain_rate(100.0, points, 1000) == pytest.approx(400 / 3)


def test_without_a_commit_in_between_the_rate_is_taken_at_the_end() -> None:
    assert drain_rate(100.0, [(101.0, 0), (105.0, 1000)], 1000) == pytest.approx(200.0)
    assert drain_rate(100.0, [(101.0, 0)], 1000) == 0.0


def test_a_sample_is_in_redis_from_the_first_read_of_it_or_a_newer_state() -> None:
    sent_at = {
        ("GPU-a", 1000): 10.0,
        ("GPU-a", 2000): 11.0,  # overtaken: Redis showed 3000 before it was written
        ("GPU-a", 3000): 12.0,
        ("GPU-b", 1000): 10.0,  # never read: counted at the end of the wait
    }
    seen = [("GPU-a", 1000, 10.5), ("GPU-a", 3000, 12.4)]
    result = latencies_ms(seen, sent_at, censor_at=20.0)
    assert result.censored == 1
    by_send = sorted(result.samples)
    assert [ms for _, ms in by_send] == pytest.approx([500.0, 10_000.0, 1400.0, 400.0])


def test_a_newer_state_read_earlier_covers_an_older_one() -> None:
    seen = [("GPU-a", 3000, 12.4), ("GPU-a", 2000, 12.9)]
    result = latencies_ms(seen, {("GPU-a", 2000): 11.0}, censor_at=30.0)
    assert [sent for sent, _ in result.samples] == [11.0]
    assert result.samples[0][1] == pytest.approx(1400.0)
    assert result.censored == 0


def test_keeping_up_means_flat_latency_and_every_sample_there() -> None:
    flat = Latencies([(float(i), 400.0 + (i % 3) * 50) for i in range(50)], censored=0)
    growing = Latencies([(float(i), 400.0 + i * 100) for i in range(50)], censored=0)
    assert kept_up(flat)
    assert not kept_up(growing)
    assert not kept_up(Latencies(flat.samples, censored=1))
    assert not kept_up(Latencies(flat.samples[:5], censored=0))


# -- the JSON line, the summary, the plot ---------------------------------------------------


def test_the_json_line_holds_the_figures_the_issue_asks_for() -> None:
    line = worker_json(result())
    assert "\n" not in line
    data = json.loads(line)
    assert data["gpu_samples_per_s"] == 6000.0
    assert data["baseline_gpu_samples_per_s"] == 150_000.0
    assert data["ratio"] == pytest.approx(0.04)
    assert data["ratio_to_faust_floor"] == pytest.approx(0.2)
    assert data["inbox_floor_gpu_samples_per_s"] == 60_000.0
    assert data["ratio_to_inbox_floor"] == pytest.approx(0.1)
    assert (data["e2e_p50_ms"], data["e2e_p99_ms"]) == (600.0, 1500.0)
    assert data["worker_rss_mb"] == 166.0
    assert data["rss_mb_per_10k_pods"] == 100.0
    assert data["paced_achieved_gpu_samples_per_s"] == 3990.0
    assert data["producer_cpu_us_per_gpu_sample"] == 17.0
    assert data["targets"] == {"gpu_samples_per_s": 40_000, "ratio": 0.5, "e2e_p99_ms": 2000}


def test_no_latency_measured_is_null_in_json() -> None:
    data = json.loads(worker_json(result(e2e_p50_ms=None, e2e_p99_ms=None, e2e_max_ms=None)))
    assert data["e2e_p99_ms"] is None


def test_the_summary_says_what_is_met_and_marks_lower_bounds() -> None:
    text = format_worker(result(gpu_samples_per_s=45_000.0, baseline_gpu_samples_per_s=60_000.0))
    assert "target 40000: met" in text
    assert "target 0.5: met" in text
    assert "worker/Faust floor 1.500, worker/inbox floor 0.750" in text
    # p99 1.5 s, but at 3,990 GPU-samples/s: the target is about 40,000/s.
    assert "p99 target 2000 ms at 40000/s: NOT met" in text
    late = format_worker(result(e2e_censored=3, e2e_p99_ms=9000.0, paced_kept_up=False))
    assert "p99 >=9000 ms" in late
    assert "fell behind" in late


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "docs" / "worker.png"
    samples = [(float(i), 400.0 + i) for i in range(20)]
    write_plot_png(WorkerRun(result(), Latencies(samples, 0)), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the fleet ------------------------------------------------------------------------------


def test_the_fleet_is_what_agents_send_and_its_paced_samples_go_on_a_second_a_round() -> None:
    fleet = build_fleet(nodes=3, gpus=2, seconds=2, t0_ms=1_764_400_000_000, watch=2)
    assert (fleet.messages, fleet.gpu_samples, fleet.pods) == (6, 12, 6)
    first = NVML_SAMPLES.decode(fleet.backlog[0][1])
    assert first.node == "bench-node-00000"
    assert first.ts == 1_764_400_000_000  # node 0 ticks at phase 0
    assert len(first.gpus) == 2
    assert {a.pod_uid for a in first.allocations} == {
        p.pod_uid for g in first.gpus for p in g.processes
    }
    second_node = NVML_SAMPLES.decode(fleet.backlog[1][1])
    assert second_node.ts == 1_764_400_000_333  # phases spread over the second
    pods = [K8S_PODS.decode(value) for _, value in fleet.pod_events]
    assert {p.node for p in pods} == {"bench-node-00000", "bench-node-00001", "bench-node-00002"}
    assert all(p.phase == "Running" and p.type == "ADDED" for p in pods)
    assert sorted(fleet.watched) == [0, 1]  # one node in 3 // 2
    last = fleet.last[1]
    key, value, watched, end = fleet.paced(4)  # the second round's node 1
    paced = NVML_SAMPLES.decode(value)
    assert key == b"bench-node-00001"
    assert (paced.ts, paced.seq) == (last.ts + 2000, last.seq + 2)
    assert end == paced.ts + paced.interval_ms == fleet.paced_end(1, 2)
    assert watched == last.gpus[0].uuid


def test_a_fleet_of_recorded_history_samples_at_its_interval() -> None:
    fleet = build_fleet(
        nodes=2, gpus=1, seconds=570, t0_ms=1_764_400_000_000, watch=1, interval_s=57.0
    )
    assert fleet.messages == 2 * 10  # 570 s of 57 s samples, each node
    node0 = [NVML_SAMPLES.decode(v) for k, v in fleet.backlog if k == b"bench-node-00000"]
    assert [s.ts - node0[0].ts for s in node0[:3]] == [0, 57_000, 114_000]
    assert {s.interval_ms for s in node0} == {57_000}
    with pytest.raises(ValueError, match="--interval"):
        worker_config(quick=True, interval_s=0.01)


def test_a_day_of_samples_gets_time_to_drain_a_quick_backlog_the_usual_deadline() -> None:
    assert drain_deadline_s(24_000) == 1800.0
    assert drain_deadline_s(2_880_000) == 7200.0  # a day of 1,000 GPUs sampled every 30 s
