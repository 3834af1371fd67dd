"""The two rule sets: the stream's alerts (default) and the metric thresholds (alternative).

Both carry the product alerts under their public names and the same capacity and pipeline
groups, so a user switches by loading one file instead of the other; the default rules read
the firing series the worker exports, with no `for`, the stream's severity and a
keep_firing_for that outlasts a partition's move between workers.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
import yaml
from deploy_exposition import gpuwatch_exposition
from support.commands import run_command

import streams.core
from gpuwatch.harness.examples import example
from schemas import K8sWorkload
from schemas.alert import AlertName
from schemas.settings import RuleSettings, WorkerSettings
from streams.core.node import gpu_health
from streams.core.workload import workload_step

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
STREAM = PROMETHEUS / "gpuwatch-rules.yml"
THRESHOLDS = PROMETHEUS / "gpuwatch-threshold-rules.yml"
CHART_VALUES = ROOT / "deploy" / "helm" / "gpuwatch" / "values.yaml"
PRODUCT = set(get_args(AlertName))
# The capacity alert's severity until the stream's core declares it (its rule is built, its
# alert not yet raised: streams/SEMANTICS-capacity.md): a warning, as PodQueuedTooLong. The
# stream's own table wins once it has one.
NOT_YET_RAISED = {"PodBlockedByFragmentation": "warning"}


def stream_severities() -> dict[str, str]:
    """Each in-stream alert's severity, from the SEVERITY table of the core module that
    raises it (gpu_alerts, gpu_health, pod_alerts...)."""
    found: dict[str, str] = {}
    for info in pkgutil.walk_packages(streams.core.__path__, "streams.core."):
        table = getattr(importlib.import_module(info.name), "SEVERITY", {})
        found.update(table)
    return found


def raised_severities() -> dict[str, str]:
    """The severities a core module writes into the alerts it raises, having no SEVERITY
    table: WorkloadQueuedTooLong's (streams/core/workload/workload_step.py), from the alert raised
    for the example workload, waiting for quota, stepped to queued_alert_after_s."""
    rules = RuleSettings()
    value = msgspec.convert(example("gpuwatch.k8s.workload/v1"), K8sWorkload)
    state, out = workload_step.apply(None, value, rules)
    _, fired = workload_step.step_to(state, value.ts + rules.queued_alert_after_s * 1000, rules)
    return {alert.name: alert.severity for alert in [*out.alerts, *fired]}


SEVERITY: dict[str, str] = NOT_YET_RAISED | raised_severities() | stream_severities()
BY_CODE = "GpuXidError"  # its severity depends on the Xid code
XID_WARNINGS = {code for code, (_, sev) in gpu_health.XID_MEANINGS.items() if sev == "warning"}


def groups(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Group name -> its rules."""
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {group["name"]: group["rules"] for group in loaded["groups"]}


def alerts(path: Path) -> dict[str, dict[str, Any]]:
    """Alert name -> its rule, over every group of the file."""
    return {rule["alert"]: rule for rules in groups(path).values() for rule in rules}


def product(path: Path) -> dict[str, dict[str, Any]]:
    return {name: rule for name, rule in alerts(path).items() if name in PRODUCT}


def seconds(duration: str) -> float:
    """A Prometheus duration (`1m30s`, `15s`) in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h)", duration)
    assert "".join(number + unit for number, unit in parts) == duration, duration
    unit_s = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(int(number) * unit_s[unit] for number, unit in parts)


def test_each_in_stream_alert_has_one_rule_in_each_set_under_its_public_name() -> None:
    assert set(product(STREAM)) == PRODUCT
    assert set(product(THRESHOLDS)) == PRODUCT
    assert set(alerts(STREAM)) == set(alerts(THRESHOLDS))
    assert list(groups(STREAM)) == [
        "gpuwatch-stream-alerts", "gpuwatch-capacity", "gpuwatch-pipeline"
    ]  # fmt: skip
    assert list(groups(THRESHOLDS)) == [
        "gpuwatch-threshold-gpus", "gpuwatch-threshold-pods", "gpuwatch-threshold-nodes",
        "gpuwatch-capacity", "gpuwatch-pipeline",
    ]  # fmt: skip


def test_every_product_alert_has_a_severity() -> None:
    assert set(SEVERITY) == PRODUCT
    assert set(stream_severities()) | set(raised_severities()) >= PRODUCT - set(NOT_YET_RAISED)
    assert set(raised_severities()) == {"WorkloadQueuedTooLong"}


@pytest.mark.parametrize("group", ["gpuwatch-capacity", "gpuwatch-pipeline"])
def test_both_sets_have_the_same_capacity_and_pipeline_groups(group: str) -> None:
    assert groups(STREAM)[group] == groups(THRESHOLDS)[group]


def test_stranded_capacity_alerts_after_ten_minutes_per_model_and_resource() -> None:
    (rule,) = groups(STREAM)["gpuwatch-capacity"]
    assert (rule["alert"], rule["for"], rule["labels"]) == (
        "GpuCapacityStranded", "10m", {"severity": "warning"}
    )  # fmt: skip
    assert uses_only(rule["expr"]) == {"gpuwatch_stranded_gpus"}
    assert "$labels.model" in rule["annotations"]["summary"]
    assert "$value" in rule["annotations"]["summary"]  # the count


def uses_only(expr: str) -> set[str]:
    """The gpuwatch metric names an expression reads."""
    return set(re.findall(r"\b(gpuwatch_\w+)", expr))


@pytest.mark.parametrize("name", sorted(PRODUCT))
def test_a_stream_rule_reads_its_own_firing_series_with_no_for_and_the_streams_severity(
    name: str,
) -> None:
    rule = product(STREAM)[name]
    assert "for" not in rule
    selectors = re.findall(r"(\w+)\{([^}]*)\}", rule["expr"])
    firing = [labels for metric, labels in selectors if metric == "gpuwatch_alert_firing"]
    assert firing
    assert all(labels == f'alertname="{name}"' for labels in firing)
    if name == BY_CODE:
        # No severity of its own: the series' (the stream's, by code) passes through.
        assert "severity" not in rule.get("labels", {})
        assert "severity" not in rule["expr"]
    else:
        assert rule["labels"] == {"severity": SEVERITY[name]}


def test_the_xid_severity_depends_on_the_code_so_one_rule_cannot_fix_it() -> None:
    severities = {gpu_health.xid_meaning(code)[1] for code in (*gpu_health.XID_MEANINGS, 1)}
    assert severities == {"warning", "critical"}
    assert gpu_health.xid_meaning(1)[1] == SEVERITY[BY_CODE] == "critical"  # a code not listed


def longest_scrape_s() -> float:
    """The longest scrape interval shipped: the local stack's, compose's, the chart's."""
    scrapes = [
        yaml.safe_load(path.read_text(encoding="utf-8"))["global"]["scrape_interval"]
        for path in (PROMETHEUS / "prometheus.yml", PROMETHEUS / "prometheus-compose.yml")
    ]
    chart = yaml.safe_load(CHART_VALUES.read_text(encoding="utf-8"))
    scrapes.append(chart["serviceMonitor"]["interval"])
    return max(map(seconds, scrapes))


def test_the_stream_rules_keep_firing_longer_than_a_dead_workers_partitions_are_away() -> None:
    """The session timeout, then a scrape of the new owner at the longest shipped interval,
    fit in keep_firing_for (the new owner's rebalance and state load take the rest)."""
    kept = {rule.get("keep_firing_for") for rule in product(STREAM).values()}
    assert len(kept) == 1
    (keep_firing_for,) = kept
    assert isinstance(keep_firing_for, str)
    away_s = WorkerSettings().session_timeout_s + longest_scrape_s()
    assert seconds(keep_firing_for) > away_s
    assert seconds(keep_firing_for) <= 60  # a resolved alert leaves ALERTS at most a minute late


def test_the_threshold_rules_keep_their_for_and_severities() -> None:
    rules = product(THRESHOLDS)
    assert {name: rule.get("for") for name, rule in rules.items()} == {
        "GpuIdleAllocated": "1m", "GpuUnallocatedAccess": "30s", "PodStalled": "1m",
        "PodQueuedTooLong": None, "NodeTelemetryMissing": "1m",
        # An Xid is an event held 5m by increase(); an ECC count and a failed remapping
        # hold until a reset or a new GPU; a slowdown must last the stream's 60 s.
        "GpuXidError": None, "GpuEccUncorrectable": None, "GpuRowRemapFailure": None,
        "GpuThrottled": "1m",
        # Blocked pods by model and resource, from the metrics sink's capacity series.
        "PodBlockedByFragmentation": "1m",
        # Pending workloads by ClusterQueue, from Kueue's metrics: queued_alert_after_s.
        "WorkloadQueuedTooLong": "10m",
    }  # fmt: skip
    fixed = {name: rule.get("labels", {}).get("severity") for name, rule in rules.items()}
    assert fixed == SEVERITY | {BY_CODE: None}
    assert not any("gpuwatch_alert_firing" in rule["expr"] for rule in rules.values())


def test_the_threshold_xid_rule_sets_the_streams_severity_by_code() -> None:
    expr = product(THRESHOLDS)[BY_CODE]["expr"]
    replaced = re.findall(r'"severity",\s*"(\w+)",\s*"(\w+)",\s*"([^"]*)"', expr)
    (warning_codes,) = [regex for to, source, regex in replaced if to == "warning"]
    assert [(to, source) for to, source, _ in replaced] == [
        ("warning", "xid"),
        ("critical", "severity"),
    ]  # the codes listed are warnings, every other one critical
    assert {int(code) for code in warning_codes.split("|")} == XID_WARNINGS


def test_the_threshold_throttle_rule_reads_the_streams_slowdowns_only() -> None:
    expr = product(THRESHOLDS)["GpuThrottled"]["expr"]
    matched = set(re.findall(r'reason=~"([^"]*)"', expr))
    assert {frozenset(regex.split("|")) for regex in matched} == {gpu_health.SLOWDOWNS}


def test_the_threshold_workload_rule_reads_kueues_pending_workloads_per_cluster_queue() -> None:
    """No gpuwatch series has a workload: the rule counts Kueue's pending workloads per
    ClusterQueue, over Kueue's replicas and both statuses, and keeps none of the labels of
    Kueue's own pod (its namespace is not the workloads')."""
    rule = product(THRESHOLDS)["WorkloadQueuedTooLong"]
    assert uses_only(rule["expr"]) == set()
    assert "kueue_pending_workloads" in rule["expr"]
    clauses = re.findall(r"\bby \(([^)]*)\)", rule["expr"])
    kept = [{label.strip() for label in clause.split(",")} for clause in clauses]
    assert kept == [{"cluster", "cluster_queue"}, {"cluster", "cluster_queue", "status"}]
    assert seconds(rule["for"]) == RuleSettings().queued_alert_after_s
    assert "$labels.cluster_queue" in rule["annotations"]["summary"]


def test_the_runbooks_agree_but_for_how_missing_telemetry_resolves() -> None:
    stream, thresholds = product(STREAM), product(THRESHOLDS)
    differ = {
        name
        for name in PRODUCT
        if stream[name]["annotations"]["runbook"] != thresholds[name]["annotations"]["runbook"]
    }
    assert differ == {"NodeTelemetryMissing"}


@pytest.mark.parametrize("path", [STREAM, THRESHOLDS], ids=["stream", "thresholds"])
def test_promtool_accepts_the_rule_set(path: Path) -> None:
    done = run_command(["promtool", "check", "rules", str(path)], timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 33 rules found" in done.stdout


def test_every_gpuwatch_process_scraped_has_a_down_alert() -> None:
    """Each gpuwatch job of prometheus.yml is named by an `up` selector of the pipeline
    group: the node agents' too, as a fleet (NodeTelemetryMissing tells of one silent node
    only while others report)."""
    jobs = {
        job["job_name"]
        for job in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text("utf-8"))[
            "scrape_configs"
        ]
    }
    watched: set[str] = set()
    for rule in groups(STREAM)["gpuwatch-pipeline"]:
        for matcher in re.findall(r'\bup\{job(=~?)"([^"]*)"\}', rule["expr"]):
            op, value = matcher
            watched |= set(value.split("|")) if op == "=~" else {value}
    assert watched == {j for j in jobs if j.startswith("gpuwatch-")}
    sink_down = alerts(STREAM)["GpuwatchSinkDown"]["expr"]
    assert 'up{job="gpuwatch-worker"} == 1' in sink_down  # absent sinks count while workers run


def test_a_silent_fleet_pages_within_minutes_and_not_while_a_worker_restarts() -> None:
    """GpuwatchNodeSamplesStopped fires its window plus its `for` after the last sample
    read: within three minutes, and later than a dead worker's partitions are away (the
    session timeout and a scrape of the new owner). Its window holds several scrapes."""
    rule = alerts(STREAM)["GpuwatchNodeSamplesStopped"]
    (window,) = re.findall(r"increase\(gpuwatch_events_total\{[^}]*\}\[(\w+)\]\)", rule["expr"])
    assert 'topic=~".*nvml[.]samples"' in rule["expr"]
    assert rule["labels"] == {"severity": "critical"}
    silent_s = seconds(window) + seconds(rule["for"])
    assert WorkerSettings().session_timeout_s + longest_scrape_s() < silent_s <= 180
    assert seconds(window) >= 3 * longest_scrape_s()


def test_a_silent_fleet_is_seen_three_ways_each_without_the_streams_help() -> None:
    """From the workers' input, from the agents' scrapes, from what Kafka acknowledged to
    each agent: none reads the stream's firing series, which a silent fleet does not set."""
    pipeline = {rule["alert"]: rule for rule in groups(STREAM)["gpuwatch-pipeline"]}
    views = {
        "GpuwatchNodeSamplesStopped": {"gpuwatch_events_total"},
        "GpuwatchAllNodeAgentsDown": set(),
        "GpuwatchNodeAgentNotDelivering": {
            "gpuwatch_agent_sent_total", "gpuwatch_agent_samples_total"
        },
    }  # fmt: skip
    for name, metrics in views.items():
        assert uses_only(pipeline[name]["expr"]) == metrics, name
    assert 'absent(up{job="gpuwatch-node-agent"})' in pipeline["GpuwatchAllNodeAgentsDown"]["expr"]
    assert {pipeline[name]["labels"]["severity"] for name in views} == {"critical", "warning"}


# A counter of data gpuwatch took in, or should have, and left out, known by its name.
LOSS_COUNTER = re.compile(
    r"_(dropped|lost|rejected|missing|invalid|malformed|deadletter|late_events)_total$"
)
# Node samples the Redis sink cannot decode: the workers dead-letter the same samples
# (GpuwatchDeadLetters), and the metrics sink counts them in its own invalid records.
NOT_ALERTED = {"gpuwatch_sink_samples_invalid_total"}


def test_every_loss_counter_gpuwatch_exports_has_an_alert() -> None:
    losses = {name for name in gpuwatch_exposition() if LOSS_COUNTER.search(name)}
    assert {
        "gpuwatch_agent_dropped_total", "gpuwatch_agent_lost_total",
        "gpuwatch_late_events_total", "gpuwatch_work_units_dropped_total",
        "gpuwatch_sink_rejected_total", "gpuwatch_sink_metrics_invalid_total",
    } <= losses  # fmt: skip
    read: set[str] = set()
    for rule in groups(STREAM)["gpuwatch-pipeline"]:
        read |= uses_only(rule["expr"])
    assert losses - read == NOT_ALERTED


def test_the_promtool_tests_cover_both_sets() -> None:
    """Each rule file is loaded by some unit test file, and every test file passes."""
    tests = sorted((PROMETHEUS / "tests").glob("*.yml"))
    loaded = {
        (path.parent / rule).resolve().name
        for path in tests
        for rule in yaml.safe_load(path.read_text(encoding="utf-8"))["rule_files"]
    }
    assert loaded == {STREAM.name, THRESHOLDS.name}
    done = run_command(["promtool", "test", "rules", *map(str, tests)], timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(tests)


@pytest.mark.parametrize("path", [STREAM, THRESHOLDS], ids=["stream", "thresholds"])
def test_the_runbooks_select_pods_by_the_labels_the_chart_gives_them(path: Path) -> None:
    components = {"worker", "sink-redis", "sink-metrics", "k8s-watcher", "node-agent"}
    selectors = re.findall(r"kubectl [^`]*?-l (\S+?)`", path.read_text(encoding="utf-8"))
    assert selectors
    for selector in selectors:
        name, _, value = selector.partition("=")
        assert name == "app.kubernetes.io/component", selector
        assert value in components, selector
