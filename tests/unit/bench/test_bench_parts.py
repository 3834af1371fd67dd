"""`gpuwatch bench`'s new parts, pure: the sink, two workers, the idle alert, DCGM's figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from bench_results import worker_result

from gpuwatch import cli
from gpuwatch.harness.bench.alert_figures import (
    DcgmSetup,
    Fired,
    alert_fields,
    alert_result,
    dcgm_figures,
    format_alerts,
    stage_latency,
)
from gpuwatch.harness.bench.alerts import prometheus_config
from gpuwatch.harness.bench.backlog import Drain
from gpuwatch.harness.bench.report import WorkerResult, format_worker, worker_json
from gpuwatch.harness.bench.run import missing_binaries
from gpuwatch.harness.bench.scale import TwoWorkers, two_worker_figures
from gpuwatch.harness.bench.worker import config_from_args

# -- DCGM + Prometheus, computed --------------------------------------------------------------


def test_dcgm_defaults_fire_up_to_a_minute_after_the_threshold_and_two_after_going_idle() -> None:
    d = dcgm_figures()
    assert (d.dcgm_collect_interval_s, d.dcgm_scrape_interval_s) == (30.0, 15.0)
    assert (d.dcgm_evaluation_interval_s, d.dcgm_rule_for_s) == (15.0, 60.0)
    # collect 30 + scrape 15 + evaluate 15 at worst, half of each on average
    assert d.dcgm_idle_alert_latency_worst_s == 60.0
    assert d.dcgm_idle_alert_latency_typical_s == 30.0
    # the `for` on top, from the GPU going idle
    assert d.dcgm_idle_alert_after_idle_worst_s == 120.0
    assert d.dcgm_idle_alert_after_idle_typical_s == 90.0


def test_a_for_between_evaluations_waits_for_the_next_one() -> None:
    d = dcgm_figures(DcgmSetup(rule_for_s=50.0))
    # pending at an evaluation, firing at the first one 50 s or more later: 60 s
    assert d.dcgm_idle_alert_after_idle_worst_s == 60.0 + 60.0
    assert d.dcgm_idle_alert_latency_worst_s == 60.0 + 10.0
    none = dcgm_figures(DcgmSetup(collect_interval_s=1, scrape_interval_s=1, rule_for_s=0))
    assert none.dcgm_idle_alert_after_idle_worst_s == 1 + 1 + 15
    assert none.dcgm_idle_alert_latency_typical_s == pytest.approx(8.5)


def test_a_setup_with_no_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        dcgm_figures(DcgmSetup(scrape_interval_s=0))
    with pytest.raises(ValueError, match="positive"):
        dcgm_figures(DcgmSetup(rule_for_s=-1))


# -- the idle alert's latency -----------------------------------------------------------------

SENT = {
    "node-a": [(1000, 10.0), (2000, 11.0), (3000, 12.0)],
    "node-b": [(1500, 10.5), (2500, 11.5)],
}


def test_an_alert_is_timed_from_the_sample_ending_at_or_after_its_threshold() -> None:
    fired = [
        Fired("fp-1", "GPU-1", "node-a", at_ms=2000),  # the sample ending at 2000 completes it
        Fired("fp-2", "GPU-2", "node-a", at_ms=2400),  # the one ending at 3000 does
        Fired("fp-3", "GPU-3", "node-b", at_ms=1500),
    ]
    seen = {"fp-1": 11.25, "fp-2": 12.5, "fp-3": 10.75}
    latency = stage_latency(fired, SENT, seen)
    assert latency.values == pytest.approx([250.0, 500.0, 250.0])
    assert latency.missing == 0
    assert latency.p50 == pytest.approx(250.0)
    assert latency.max == pytest.approx(500.0)


def test_an_alert_a_stage_never_showed_is_counted_missing() -> None:
    fired = [Fired("fp-1", "GPU-1", "node-a", 1000), Fired("fp-2", "GPU-2", "node-b", 2500)]
    latency = stage_latency(fired, SENT, {"fp-2": 12.0})
    assert latency.values == pytest.approx([500.0])
    assert latency.missing == 1
    empty = stage_latency(fired, SENT, {})
    assert (empty.p50, empty.max, empty.missing) == (None, None, 2)


def test_an_alert_after_every_sample_sent_is_an_error() -> None:
    with pytest.raises(ValueError, match="node-b"):
        stage_latency([Fired("fp", "GPU-1", "node-b", 9000)], SENT, {"fp": 20.0})


def test_the_result_maps_prometheus_by_fingerprint_and_flattens_into_json_fields() -> None:
    fired = [Fired("fp-1", "GPU-1", "node-a", 2000), Fired("fp-3", "GPU-3", "node-b", 1500)]
    seen = {
        "topic": {"fp-1": 11.1, "fp-3": 10.6},
        "redis": {"fp-1": 11.3, "fp-3": 10.8},
        "prometheus": {"fp-1": 12.6},
    }
    r = alert_result(
        idle_after_s=10, nodes=2, fired=fired, sent=SENT, seen=seen, prometheus_s=(1.0, 1.0)
    )
    assert r.idle_alert_fired == 2
    assert r.idle_alert_topic_max_ms == pytest.approx(100.0)
    assert r.idle_alert_redis_p50_ms == pytest.approx(300.0)
    assert r.idle_alert_prometheus_max_ms == pytest.approx(1600.0)
    assert r.idle_alert_prometheus_missing == 1
    assert r.idle_alert_prometheus_behind_topic_max_ms == pytest.approx(1500.0)
    data = alert_fields(r)
    assert "dcgm" not in data
    assert data["dcgm_idle_alert_latency_worst_s"] == 60.0
    assert data["idle_alert_after_s"] == 10
    assert data["prometheus_scrape_interval_s"] == 1.0
    assert set(alert_fields(None)) == set(data)
    assert all(value is None for value in alert_fields(None).values())
    lines = format_alerts(r)
    assert "alerts topic p50 100 ms" in lines[0]
    assert "1 missing" in lines[1]
    assert "30 s typical, 60 s worst" in lines[2]


def test_the_private_prometheus_scrapes_the_worker_and_loads_the_rules() -> None:
    config = yaml.safe_load(prometheus_config(9999, Path("/x/gpuwatch-rules.yml"), 1.0))
    assert config["global"]["scrape_interval"] == "1s"
    assert config["global"]["evaluation_interval"] == "1s"
    assert config["rule_files"] == ["/x/gpuwatch-rules.yml"]
    [job] = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9999"]}]


# -- two workers, the sink, the JSON line -----------------------------------------------------


def drain(cpu_s: tuple[float, ...], broker: float | None) -> Drain:
    return Drain(
        rate=9_000.0,
        seconds=4.0,
        cpu_s=cpu_s,
        idle_rss=80.0,
        loaded_rss=150.0,
        committed=3000,
        ends={0: 1500, 1: 1500},
        broker_cpu_s=broker,
        sink=None,
    )


def test_two_workers_are_compared_with_the_lone_one() -> None:
    two = two_worker_figures(
        drain((2.4, 1.6), 1.2), gpu_samples=24_000, lone_rate=6_000.0, lone_cpu_us=150.0
    )
    assert two.two_worker_speedup == pytest.approx(1.5)
    assert two.two_worker_cpu_us_per_gpu_sample == pytest.approx(4.0 / 24_000 * 1e6)
    assert two.two_worker_cpu_ratio == pytest.approx(4.0 / 24_000 * 1e6 / 150.0)
    assert two.two_worker_cores == pytest.approx([0.6, 0.4])
    assert two.two_worker_broker_cores == pytest.approx(0.3)
    assert two.two_worker_committed == 3000
    unknown = two_worker_figures(
        drain((1.0, 1.0), None), gpu_samples=24_000, lone_rate=6_000.0, lone_cpu_us=150.0
    )
    assert unknown.two_worker_broker_cores is None


def _two() -> TwoWorkers:
    return two_worker_figures(
        drain((2.0, 2.0), None), gpu_samples=24_000, lone_rate=6_000.0, lone_cpu_us=150.0
    )


def test_the_json_line_has_every_part_and_nulls_for_a_part_not_run() -> None:
    result: WorkerResult = worker_result()
    bare = json.loads(worker_json(result))
    assert bare["sink_cpu_us_per_gpu_sample"] == 30.0
    assert bare["sink_rss_mb"] == 70.0
    assert bare["broker_cores"] == 0.4
    assert bare["two_worker_speedup"] is None
    assert bare["two_worker_cpu_us_per_gpu_sample"] is None
    assert bare["idle_alert_redis_p50_ms"] is None
    assert bare["dcgm_idle_alert_latency_typical_s"] is None
    assert bare["gpu_samples_per_s"] == 6000.0  # the existing fields stay
    fired = [Fired("fp-1", "GPU-1", "node-a", 2000)]
    seen = {"topic": {"fp-1": 11.1}, "redis": {"fp-1": 11.2}, "prometheus": {"fp-1": 12.0}}
    alerts = alert_result(
        idle_after_s=10, nodes=1, fired=fired, sent=SENT, seen=seen, prometheus_s=(1.0, 1.0)
    )
    full = json.loads(worker_json(result, _two(), alerts))
    assert set(full) == set(bare)
    assert full["two_worker_speedup"] == pytest.approx(1.5)
    assert full["two_worker_cores"] == pytest.approx([0.5, 0.5])
    assert full["idle_alert_prometheus_max_ms"] == pytest.approx(1000.0)
    assert full["dcgm_idle_alert_latency_typical_s"] == 30.0


def test_the_summary_names_the_sink_the_two_workers_and_an_unknown_broker() -> None:
    text = format_worker(worker_result(broker_cores=None), _two())
    assert "Redis sink process     30.0 us CPU per GPU-sample (0.50 cores" in text
    assert "broker unknown cores (its pid is not readable)" in text
    assert "speed-up 1.50" in text
    assert "cores 0.50, 0.50" in text


# -- options ------------------------------------------------------------------------------------


def test_the_parts_can_be_skipped_and_the_alert_part_run_alone() -> None:
    args = cli.build_parser().parse_args(["bench", "--quick", "--no-two-workers", "--no-alerts"])
    config = config_from_args(args)
    assert (config.two_workers, config.alerts) == (False, False)
    default = config_from_args(cli.build_parser().parse_args(["bench", "--quick"]))
    assert (default.two_workers, default.alerts) == (True, True)
    assert cli.build_parser().parse_args(["bench", "alerts", "--json"]).which == "alerts"


def test_a_missing_prometheus_binary_is_named_with_the_way_around_it() -> None:
    [message] = missing_binaries(["gpuwatch-no-such-binary"])
    assert message.startswith("gpuwatch-no-such-binary is not on PATH")
    assert "--no-alerts" in message
