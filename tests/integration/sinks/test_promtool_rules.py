"""promtool checks and unit-tests the alert rules; amtool checks the example Alertmanager route."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

PROMETHEUS = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"
RULES = PROMETHEUS / "gpuwatch-rules.yml"
ALERTS = {
    "GpuIdleAllocated", "PodStalled", "PodQueuedTooLong", "GpuUnallocatedAccess",
    "NodeTelemetryMissing", "GpuwatchPipelineLagging", "GpuwatchDeadLetters",
    "GpuwatchWorkerDown", "GpuwatchK8sWatcherDown", "GpuwatchSinkDown",
    "GpuwatchMetricsSeriesDropped", "GpuXidError", "GpuEccUncorrectable", "GpuRowRemapFailure",
    "GpuThrottled", "PodBlockedByFragmentation", "GpuCapacityStranded", "WorkloadQueuedTooLong",
    "GpuwatchNodeSamplesStopped", "GpuwatchAllNodeAgentsDown", "GpuwatchNodeAgentDown",
    "GpuwatchNodeAgentNotDelivering", "GpuwatchNodeAgentSamplesDropped",
    "GpuwatchNodeAgentSamplesLost", "GpuwatchNodeSamplesMissing", "GpuwatchLateEvents",
    "GpuwatchWorkUnitsDropped", "GpuwatchRedisSinkRejected", "GpuwatchSinkInvalidRecords",
    "GpuwatchK8sWatcherMessagesLost", "GpuwatchK8sWatcherMalformedObjects",
    "GpuwatchWorkerStalled", "GpuwatchSinkStalled",
}  # fmt: skip


def run(*command: str) -> subprocess.CompletedProcess[str]:
    """The command's result; fails the test when the tool is not installed."""
    if shutil.which(command[0]) is None:
        pytest.fail(f"{command[0]} is not installed (make os-deps installs it)")
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


def test_promtool_checks_the_rules() -> None:
    checked = run("promtool", "check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 33 rules found" in checked.stdout


def test_promtool_unit_tests_pass() -> None:
    tests = sorted(str(path) for path in (PROMETHEUS / "tests").glob("*.yml"))
    assert len(tests) >= 4
    tested = run("promtool", "test", "rules", *tests)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.count("SUCCESS") == len(tests)


def test_every_rule_has_a_severity_a_runbook_and_unit_tests_firing_and_quiet() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        # GpuXidError's severity is the stream's, by Xid code: the series carries it.
        if rule["alert"] == "GpuXidError":
            assert "severity" not in rule.get("labels", {})
        else:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
        assert rule["annotations"]["runbook"].startswith("1. "), rule["alert"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in (PROMETHEUS / "tests").glob("*.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    assert firing == ALERTS
    assert quiet == ALERTS


def test_the_example_alertmanager_config_routes_critical_to_the_pager() -> None:
    config = str(PROMETHEUS / "alertmanager.yml")
    if shutil.which("amtool") is None:
        pytest.fail("amtool is missing: run `make install` (it installs prometheus-alertmanager)")
    checked = run("amtool", "check-config", config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for labels, receiver in (
        (["severity=critical", "alertname=GpuUnallocatedAccess"], "pager"),
        (["severity=warning", "alertname=PodStalled", "namespace=ml"], "chat"),
    ):
        routed = run("amtool", "config", "routes", "test", f"--config.file={config}", *labels)
        assert routed.stdout.split() == [receiver], routed.stdout + routed.stderr
