"""The chart's PrometheusRule, rendered from the shipped rules and the values.

By default it is the rules file, unchanged; the values toggle an alert, give it a `for`, a
severity and labels, add labels and a runbook link to every alert, and replace the
thresholds the worker's settings hold too (from the release's own settings unless a rule
value says otherwise). What comes out is checked by promtool: the rules, the repository's
promtool unit tests against the rendered default rules, and a unit test showing that a
threshold taken from the settings moves the alert.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_chart import ROOT, Object, helm_path, template
from support import run_command
from test_deploy_rules import PROMETHEUS, STREAM, THRESHOLDS, seconds

from schemas.settings import RuleSettings

RULE_FILES = {"stream": STREAM, "thresholds": THRESHOLDS}
RUNBOOKS = ROOT / "docs" / "runbooks.md"
# The thresholds the chart replaces and the worker setting each defaults from.
THRESHOLD_SETTINGS = {
    "idleUtilPct": ("GPUWATCH_IDLE_UTIL_PCT", "idle_util_pct"),
    "idleAlertAfterSeconds": ("GPUWATCH_IDLE_ALERT_AFTER_S", "idle_alert_after_s"),
    "queuedAlertAfterSeconds": ("GPUWATCH_QUEUED_ALERT_AFTER_S", "queued_alert_after_s"),
    "stallAfterSeconds": ("GPUWATCH_STALL_AFTER_S", "stall_after_s"),
    "xidAlertHoldSeconds": ("GPUWATCH_XID_ALERT_HOLD_S", "xid_alert_hold_s"),
    "throttleAlertAfterSeconds": ("GPUWATCH_THROTTLE_ALERT_AFTER_S", "throttle_alert_after_s"),
}

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def rule_spec(helm: str, *args: str) -> dict[str, Any]:
    """The spec of the PrometheusRule rendered with these values."""
    done = rule_template(helm, *args)
    assert done.returncode == 0, done.stderr
    (rule,) = [
        doc for doc in yaml.safe_load_all(done.stdout) if doc and doc["kind"] == "PrometheusRule"
    ]
    spec: dict[str, Any] = rule["spec"]
    return spec


def rule_template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return template(
        helm, "--set", "prometheusRule.enabled=true",
        "--show-only", "templates/monitoring.yaml", *args,
    )  # fmt: skip


def by_name(spec: dict[str, Any]) -> dict[str, Object]:
    """Alert name -> its rule, over every group."""
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"]}


def shipped(alerts_from: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULE_FILES[alerts_from].read_text("utf-8"))
    return loaded


def settings_args(values: Mapping[str, object]) -> list[str]:
    return [arg for name, value in values.items() for arg in ("--set-string", f"{name}={value}")]


THRESHOLDS_FROM = ("--set", "prometheusRule.alertsFrom=thresholds")


# --- the shipped files stay the defaults --------------------------------------------------


@pytest.mark.parametrize("alerts_from", ["stream", "thresholds"])
def test_the_default_values_render_the_shipped_rules_unchanged(helm: str, alerts_from: str) -> None:
    spec = rule_spec(helm, "--set", f"prometheusRule.alertsFrom={alerts_from}")
    assert spec == shipped(alerts_from)


def test_the_workers_default_settings_render_the_shipped_thresholds() -> None:
    """Setting every threshold to the worker's default changes nothing: the file's literals
    are the settings' defaults, written as the chart writes them."""
    defaults = RuleSettings()
    rules = by_name(shipped("thresholds"))
    idle, queued = rules["GpuIdleAllocated"], rules["PodQueuedTooLong"]
    assert set(re.findall(r"gpuwatch_gpu_utilization_ratio < ([0-9.]+)", idle["expr"])) == {
        str(defaults.idle_util_pct / 100)
    }
    assert seconds(idle["for"]) == defaults.idle_alert_after_s
    assert re.findall(r'state="queued"\} > (\d+)', queued["expr"]) == [
        str(defaults.queued_alert_after_s)
    ]
    xid = rules["GpuXidError"]["expr"]
    assert {seconds(d) for d in re.findall(r"xid_errors_total(?:\[| offset )(\w+)", xid)} == {
        defaults.xid_alert_hold_s
    }
    assert seconds(rules["GpuThrottled"]["for"]) == defaults.throttle_alert_after_s
    workload = rules["WorkloadQueuedTooLong"]
    assert seconds(workload["for"]) == defaults.queued_alert_after_s
    assert "for at least 10 minutes," in workload["annotations"]["description"]
    assert "the stall threshold (5 minutes)" in rules["PodStalled"]["annotations"]["description"]
    assert defaults.stall_after_s == 300


def test_settings_at_their_defaults_render_the_shipped_rules(helm: str) -> None:
    defaults = RuleSettings()
    values = {
        f"settings.{setting}": getattr(defaults, field)
        for setting, field in THRESHOLD_SETTINGS.values()
    }
    spec = rule_spec(helm, *THRESHOLDS_FROM, *settings_args(values))
    assert spec == shipped("thresholds")


# --- thresholds -----------------------------------------------------------------------------


def changed(spec: dict[str, Any], alerts_from: str) -> set[str]:
    """The alerts whose rule differs from the shipped file's."""
    rules, before = by_name(spec), by_name(shipped(alerts_from))
    assert set(rules) <= set(before)
    return {name for name, rule in rules.items() if rule != before[name]}


def test_the_idle_threshold_follows_the_workers_setting(helm: str) -> None:
    """The ci example's 3 %: the worker idles GPUs under 3 %, and so do the rules."""
    spec = rule_spec(helm, *THRESHOLDS_FROM, "--set-string", "settings.GPUWATCH_IDLE_UTIL_PCT=3")
    assert changed(spec, "thresholds") == {"GpuIdleAllocated"}
    idle = by_name(spec)["GpuIdleAllocated"]
    assert re.findall(r"gpuwatch_gpu_utilization_ratio < ([0-9.]+)", idle["expr"]) == [
        "0.03",
        "0.03",
    ]
    assert "under 3 % utilization for at least 1 minute" in idle["annotations"]["description"]


def test_a_rule_threshold_wins_over_the_setting(helm: str) -> None:
    spec = rule_spec(
        helm, *THRESHOLDS_FROM, "--set-string", "settings.GPUWATCH_IDLE_UTIL_PCT=3",
        "--set-json", "prometheusRule.thresholds.idleUtilPct=2.5",
    )  # fmt: skip
    idle = by_name(spec)["GpuIdleAllocated"]
    assert "gpuwatch_gpu_utilization_ratio < 0.025" in idle["expr"]
    assert "under 2.5 % utilization" in idle["annotations"]["description"]


def test_every_threshold_moves_its_rule_and_the_words_that_state_it(helm: str) -> None:
    spec = rule_spec(
        helm, *THRESHOLDS_FROM,
        "--set", "prometheusRule.thresholds.idleAlertAfterSeconds=120",
        "--set", "prometheusRule.thresholds.queuedAlertAfterSeconds=90",
        "--set", "prometheusRule.thresholds.stallAfterSeconds=3600",
        "--set", "prometheusRule.thresholds.xidAlertHoldSeconds=600",
        "--set-string", "settings.GPUWATCH_THROTTLE_ALERT_AFTER_S=30",
    )  # fmt: skip
    rules = by_name(spec)
    assert changed(spec, "thresholds") == {
        "GpuIdleAllocated", "PodQueuedTooLong", "PodStalled", "GpuXidError", "GpuThrottled",
        "WorkloadQueuedTooLong",
    }  # fmt: skip
    idle = rules["GpuIdleAllocated"]
    assert idle["for"] == "2m"
    assert "for at least 2 minutes: it is paid" in idle["annotations"]["description"]
    queued = rules["PodQueuedTooLong"]
    assert 'gpuwatch_pod_state_seconds{state="queued"} > 90\n' in queued["expr"]
    assert queued["annotations"]["description"].endswith("more than 90 seconds.")
    workload = rules["WorkloadQueuedTooLong"]  # the same threshold, as Kueue's count's `for`
    assert workload["for"] == "90s"
    assert "for at least 90 seconds," in workload["annotations"]["description"]
    stalled = rules["PodStalled"]["annotations"]["description"]
    assert stalled.endswith("the stall threshold (1 hour).")
    xid = rules["GpuXidError"]
    assert xid["expr"].count("increase(gpuwatch_gpu_xid_errors_total[10m])") == 2
    assert xid["expr"].count("gpuwatch_gpu_xid_errors_total offset 10m") == 2
    assert "5m" not in xid["expr"]
    assert "in the last 10 minutes" in xid["annotations"]["description"]
    throttled = rules["GpuThrottled"]
    assert throttled["for"] == "30s"
    assert "for at least 30 seconds" in throttled["annotations"]["description"]


def test_thresholds_from_a_values_file_print_as_written(helm: str, tmp_path: Path) -> None:
    """helm reads a values file's numbers as floats: a large whole one is no 1e+06."""
    values = tmp_path / "values.yaml"
    values.write_text(
        "prometheusRule:\n  thresholds:\n    queuedAlertAfterSeconds: 1000000\n"
        "    idleUtilPct: 2.5\n",
        encoding="utf-8",
    )
    rules = by_name(rule_spec(helm, *THRESHOLDS_FROM, "-f", str(values)))
    queued = rules["PodQueuedTooLong"]
    assert 'gpuwatch_pod_state_seconds{state="queued"} > 1000000\n' in queued["expr"]
    assert queued["annotations"]["description"].endswith("more than 1000000 seconds.")
    assert rules["WorkloadQueuedTooLong"]["for"] == "1000000s"
    assert "gpuwatch_gpu_utilization_ratio < 0.025" in rules["GpuIdleAllocated"]["expr"]


def test_the_stream_rules_hold_no_threshold_to_replace(helm: str) -> None:
    """The stream fires on its own settings: the settings leave its rules as they are."""
    values = {f"settings.{setting}": 7 for setting, _ in THRESHOLD_SETTINGS.values()}
    assert rule_spec(helm, *settings_args(values)) == shipped("stream")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (["--set-string", "settings.GPUWATCH_IDLE_UTIL_PCT=five"],
         'settings.GPUWATCH_IDLE_UTIL_PCT "five": a utilization percentage, 0 to 100'),
        (["--set", "prometheusRule.thresholds.idleUtilPct=101"],
         "at '/prometheusRule/thresholds/idleUtilPct': maximum: got 101, want 100"),
        (["--set-string", "prometheusRule.thresholds.queuedAlertAfterSeconds=10m"],
         "at '/prometheusRule/thresholds/queuedAlertAfterSeconds': got string"),
        (["--set", "prometheusRule.thresholds.xidAlertHoldSeconds=0"],
         "at '/prometheusRule/thresholds/xidAlertHoldSeconds': minimum: got 0, want 1"),
        (["--set", "prometheusRule.rules.GpuIdle.enabled=false"],
         "prometheusRule.rules.GpuIdle: gpuwatch-threshold-rules.yml has no such alert"),
        (["--set", "prometheusRule.rules.PodStalled.for=five minutes"],
         "at '/prometheusRule/rules/PodStalled/for': 'five minutes' does not match pattern"),
        # The schema skipped, the template's own checks stand.
        (["--skip-schema-validation",
          "--set", "prometheusRule.thresholds.idleUtilPct=101"],
         'prometheusRule.thresholds.idleUtilPct "101": a utilization percentage'),
        (["--skip-schema-validation",
          "--set-string", "prometheusRule.thresholds.queuedAlertAfterSeconds=10m"],
         'queuedAlertAfterSeconds "10m": a whole number of seconds, at least 1'),
        (["--skip-schema-validation",
          "--set", "prometheusRule.thresholds.xidAlertHoldSeconds=0"],
         'xidAlertHoldSeconds "0": a whole number of seconds, at least 1'),
    ],
    ids=["setting", "percent", "duration", "zero", "alert-name", "for",
         "template-percent", "template-duration", "template-zero"],
)  # fmt: skip
def test_wrong_rule_values_are_refused(helm: str, setting: list[str], message: str) -> None:
    done = rule_template(helm, *THRESHOLDS_FROM, *setting)
    assert done.returncode == 1
    assert message in done.stderr


# --- per-alert values, labels, runbook links -------------------------------------------------

RUNBOOK_PAGE = "https://git.example.com/org/gpuwatch/blob/main/docs/runbooks.md"
OVERRIDES = (
    "--set", "prometheusRule.rules.GpuThrottled.enabled=false",
    "--set", "prometheusRule.rules.PodQueuedTooLong.for=5m",
    "--set", "prometheusRule.rules.PodQueuedTooLong.severity=critical",
    "--set", "prometheusRule.rules.PodQueuedTooLong.labels.route=scheduling",
    "--set", "prometheusRule.additionalLabels.route=gpu-platform",
    "--set", "prometheusRule.additionalLabels.cluster_owner=platform",
    "--set", f"prometheusRule.runbookBaseUrl={RUNBOOK_PAGE}",
    "--set-string", "settings.GPUWATCH_IDLE_UTIL_PCT=3",
)  # fmt: skip


@pytest.mark.parametrize("alerts_from", ["stream", "thresholds"])
def test_per_alert_values_extra_labels_and_runbook_links(helm: str, alerts_from: str) -> None:
    spec = rule_spec(helm, "--set", f"prometheusRule.alertsFrom={alerts_from}", *OVERRIDES)
    rules, before = by_name(spec), by_name(shipped(alerts_from))
    assert set(before) - set(rules) == {"GpuThrottled"}
    for name, rule in rules.items():
        expect = copy.deepcopy(before[name])
        # Every alert: the extra labels over the file's, and its runbook's link.
        expect["labels"] = expect.get("labels", {}) | {
            "route": "gpu-platform", "cluster_owner": "platform"
        }  # fmt: skip
        expect["annotations"]["runbook_url"] = f"{RUNBOOK_PAGE}#{name.lower()}"
        if name == "PodQueuedTooLong":  # its own values win over the extra labels
            expect["for"] = "5m"
            expect["labels"] |= {"severity": "critical", "route": "scheduling"}
        if name == "GpuIdleAllocated" and alerts_from == "thresholds":  # the 3 % setting
            expect["expr"] = expect["expr"].replace("< 0.05", "< 0.03")
            text = expect["annotations"]["description"]
            expect["annotations"]["description"] = text.replace("under 5 %", "under 3 %")
        assert rule == expect, name
    # GpuXidError's severity still comes from its series: no value set one.
    assert "severity" not in rules["GpuXidError"]["labels"]


def test_a_group_whose_alerts_are_all_disabled_is_left_out(helm: str) -> None:
    spec = rule_spec(helm, "--set", "prometheusRule.rules.GpuCapacityStranded.enabled=false")
    assert [g["name"] for g in spec["groups"]] == ["gpuwatch-stream-alerts", "gpuwatch-pipeline"]


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a page: lower case, punctuation dropped,
    spaces as dashes."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def test_the_runbook_page_has_an_anchor_for_every_alert_and_is_up_to_date(helm: str) -> None:
    done = run_command(
        [sys.executable, str(ROOT / "scripts" / "runbooks.py"), "--check"], timeout_s=60
    )
    assert done.returncode == 0, done.stderr
    page = RUNBOOK_PAGE
    found = anchors(RUNBOOKS.read_text(encoding="utf-8"))
    for alerts_from in ("stream", "thresholds"):
        spec = rule_spec(
            helm, "--set", f"prometheusRule.alertsFrom={alerts_from}",
            "--set", f"prometheusRule.runbookBaseUrl={page}",
        )  # fmt: skip
        urls = [rule["annotations"]["runbook_url"] for rule in by_name(spec).values()]
        assert len(urls) == 33
        for url in urls:
            base, _, anchor = url.partition("#")
            assert base == page
            assert anchor in found, url
    for name, rule in by_name(shipped("thresholds")).items():
        # The page holds each alert's steps as its rule has them.
        assert rule["annotations"]["runbook"].rstrip("\n") in RUNBOOKS.read_text("utf-8"), name


def test_a_runbook_site_gets_a_page_per_alert(helm: str) -> None:
    spec = rule_spec(
        helm, "--set", "prometheusRule.runbookBaseUrl=https://runbooks.example.com/gpuwatch/"
    )
    rules = by_name(spec)
    assert {rule["annotations"]["runbook_url"] for rule in rules.values()} == {
        f"https://runbooks.example.com/gpuwatch/{name.lower()}" for name in rules
    }


# --- promtool on what the chart renders -----------------------------------------------------


def write_rules(spec: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("alerts_from", ["stream", "thresholds"])
@pytest.mark.parametrize("values", ["defaults", "overrides"])
def test_promtool_accepts_the_rendered_rules(
    helm: str, alerts_from: str, values: str, tmp_path: Path
) -> None:
    extra = OVERRIDES if values == "overrides" else ()
    spec = rule_spec(helm, "--set", f"prometheusRule.alertsFrom={alerts_from}", *extra)
    path = write_rules(spec, tmp_path / "rules.yml")
    done = run_command(["promtool", "check", "rules", str(path)], timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    count = 32 if values == "overrides" else 33  # GpuThrottled left out
    assert f"SUCCESS: {count} rules found" in done.stdout


def test_the_repositorys_promtool_tests_pass_on_the_rendered_default_rules(
    helm: str, tmp_path: Path
) -> None:
    """deploy/prometheus/tests, each pointed at the rendered copy of the file it tests."""
    rendered = {
        path.name: write_rules(
            rule_spec(helm, "--set", f"prometheusRule.alertsFrom={alerts_from}"),
            tmp_path / f"rendered-{path.name}",
        )
        for alerts_from, path in RULE_FILES.items()
    }
    tests = sorted((PROMETHEUS / "tests").glob("*.yml"))
    copies = []
    for test in tests:
        loaded = yaml.safe_load(test.read_text(encoding="utf-8"))
        loaded["rule_files"] = [str(rendered[Path(f).name]) for f in loaded["rule_files"]]
        copies.append(write_rules(loaded, tmp_path / test.name))
    done = run_command(["promtool", "test", "rules", *map(str, copies)], timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(tests) == 11


def threshold_test(rules: Path, idle_alerts: bool, queued_alerts: bool) -> dict[str, Any]:
    """A promtool unit test: a GPU allocated at 4 % utilization, a pod queued for 400 s."""
    gpu = 'instance="w0:9480",job="gpuwatch-worker",node="n1",gpu="GPU-1",model="H100"'
    pod = 'instance="w1:9480",job="gpuwatch-worker",namespace="ml",pod="wait-0",team="vision"'
    idle = 'ALERTS{alertname="GpuIdleAllocated",alertstate="firing",gpu="GPU-1",model="H100",node="n1",severity="warning"}'  # noqa: E501
    queued = f'ALERTS{{alertname="PodQueuedTooLong",alertstate="firing",{pod},state="queued",severity="warning"}}'  # noqa: E501
    return {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [
                {"series": f"gpuwatch_gpu_allocated{{{gpu}}}", "values": "1x12"},
                {"series": f"gpuwatch_gpu_utilization_ratio{{{gpu}}}", "values": "0.04x12"},
                {"series": f'gpuwatch_pod_state{{{pod},state="queued"}}', "values": "1x12"},
                # Queued 220 s at the first sample, 400 s at 3m.
                {"series": f'gpuwatch_pod_state_seconds{{{pod},state="queued"}}',
                 "values": "220+15x12"},
            ],
            "promql_expr_test": [
                {"expr": 'ALERTS{alertname="GpuIdleAllocated"}', "eval_time": "2m45s",
                 "exp_samples": [{"labels": idle, "value": 1}] if idle_alerts else []},
                {"expr": 'ALERTS{alertname="PodQueuedTooLong"}', "eval_time": "3m",
                 "exp_samples": [{"labels": queued, "value": 1}] if queued_alerts else []},
            ],
        }],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("values", "idle_alerts", "queued_alerts"),
    [
        ((), True, False),
        (("--set-string", "settings.GPUWATCH_IDLE_UTIL_PCT=3"), False, False),
        (("--set", "prometheusRule.thresholds.queuedAlertAfterSeconds=300"), True, True),
        (("--set-string", "settings.GPUWATCH_IDLE_UTIL_PCT=3",
          "--set-json", "prometheusRule.thresholds.idleUtilPct=4.5"), True, False),
    ],
    ids=["defaults", "idle-3-from-settings", "queued-300", "rule-value-over-setting"],
)  # fmt: skip
def test_a_changed_threshold_moves_the_alert_in_promtool(
    helm: str, values: tuple[str, ...], idle_alerts: bool, queued_alerts: bool, tmp_path: Path
) -> None:
    """A GPU at 4 % alerts under the default 5 % and not under the ci example's 3 %; a pod
    queued 400 s alerts after 300 s, not after the default 600 s."""
    rules = write_rules(rule_spec(helm, *THRESHOLDS_FROM, *values), tmp_path / "rules.yml")
    test = write_rules(threshold_test(rules, idle_alerts, queued_alerts), tmp_path / "test.yml")
    done = run_command(["promtool", "test", "rules", str(test)], timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
