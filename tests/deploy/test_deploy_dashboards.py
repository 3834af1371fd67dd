"""Grafana dashboards: valid JSON whose every query uses only what gpuwatch exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from deploy_exposition import Exported, gpuwatch_exposition, worker_metrics
from deploy_promql import legend_problems, problems, promtool_check, uses
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.harness.examples import example
from schemas.nvml_sample import NvmlSample
from schemas.settings import RuleSettings
from sinks.prometheus.collector import exposition
from sinks.prometheus.metrics import WorkerMetrics
from streams.core.node.gpu_alerts import NodeAlertState, on_sample

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
RULES = ROOT / "deploy" / "prometheus" / "gpuwatch-rules.yml"
THRESHOLD_RULES = ROOT / "deploy" / "prometheus" / "gpuwatch-threshold-rules.yml"
BOARDS = sorted(DASHBOARDS.glob("*.json"))
# What the rules read of other exporters: Kueue's controller manager, its pending workloads
# per ClusterQueue and status (the threshold WorkloadQueuedTooLong); `cluster` where the
# Prometheus gives Kueue's target one, as a fleet's Prometheus labels each cluster's.
FOREIGN: Exported = {"kueue_pending_workloads": frozenset({"cluster_queue", "status", "cluster"})}


def with_health(metrics: WorkerMetrics, cluster: str | None = None) -> WorkerMetrics:
    """`metrics` (a `worker_metrics`) after a minute more of the example node, whose busy
    GPU now reads its health: an Xid 79 in the first sample, a thermal slowdown all along,
    ECC, row remapping and PCIe counts. The stream's own rules turn them into a
    GpuXidError and a GpuThrottled of the GPU's pod; its other readings, and the other
    GPUs, stay as they were."""
    named = {} if cluster is None else {"cluster": cluster}
    base = example("gpuwatch.nvml.sample/v1") | named
    remapped = {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False}
    reading = base["gpus"][0] | {
        "throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"],
        "remapped_rows": remapped, "pcie_replays": 4,
    }  # fmt: skip
    state: NodeAlertState | None = None
    for t in range(61):
        gpus = [reading | {"xid_errors": [79] if t == 0 else []}]
        raw = base | {"ts": base["ts"] + t * 1000, "seq": t, "gpus": gpus}
        sample = msgspec.convert(raw, NvmlSample)
        metrics.observe_sample(sample)
        state, alerts, _ = on_sample(state, sample, RuleSettings())
        for alert in alerts:
            metrics.observe_alert(alert)
    return metrics


def health_exposition() -> Exported:
    """The names and labels of `with_health`, of the default cluster and a named one."""
    names: dict[str, set[str]] = {}
    for cluster in (None, "east"):
        metrics = with_health(worker_metrics(CollectorRegistry(), cluster), cluster)
        for family in text_string_to_metric_families(exposition(metrics.registry).decode()):
            for sample in family.samples:
                names.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in names.items()}


@pytest.fixture(scope="module")
def exported() -> Exported:
    """What gpuwatch exports (deploy_exposition), and the GPU health series and labels of
    a GPU that reads them (its example sample has none but the ECC count)."""
    merged = dict(gpuwatch_exposition())
    for name, labels in health_exposition().items():
        merged[name] = merged.get(name, frozenset()) | labels
    return merged


def test_the_health_exposition_has_every_health_family_with_its_labels() -> None:
    health = health_exposition()
    gpu = {"node", "gpu", "model", "cluster"}
    assert health["gpuwatch_gpu_throttled"] == gpu | {"reason"}
    assert health["gpuwatch_gpu_xid_errors_total"] == gpu | {"xid"}
    for name in ("gpuwatch_gpu_ecc_uncorrectable_errors", "gpuwatch_gpu_row_remap_failed",
                 "gpuwatch_gpu_row_remap_pending", "gpuwatch_gpu_pcie_replays_total"):  # fmt: skip
        assert health[name] == gpu, name
    assert {"xid", "reasons", "pod", "pod_uid"} <= health["gpuwatch_alert_firing"]
    metrics = with_health(worker_metrics(CollectorRegistry()))
    firing = {
        (s.labels["alertname"], s.labels["pod"], s.labels["xid"], s.labels["reasons"])
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "gpuwatch_alert_firing"
    }
    assert firing >= {
        ("GpuXidError", "train-0", "79", ""),
        ("GpuThrottled", "train-0", "", "hw_thermal_slowdown"),
    }


def load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return board


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def targets(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield panel["title"], target


def variable_queries(board: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(variable, PromQL selector, label) of each `label_values(selector, label)` variable."""
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)", text)
        assert match, f"{variable['name']}: {text}"
        yield variable["name"], match.group(1), match.group(2)


def test_the_dashboards_the_issue_asks_for_are_there() -> None:
    titles = {load(path)["title"] for path in BOARDS}
    assert titles == {
        "gpuwatch / Fleet overview",
        "gpuwatch / Pod",
        "gpuwatch / Queue",
        "gpuwatch / Alerts",
        "gpuwatch / Pipeline health",
    }


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_a_dashboard_is_well_formed(path: Path) -> None:
    board = load(path)
    assert board["uid"] == path.stem  # links and provisioning find it by uid
    assert len(board["uid"]) <= 40  # Grafana's limit
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables[0] == "datasource"  # any Prometheus, picked by the viewer
    for panel in panels(board):
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", target["expr"]))
            assert used <= {*variables, "__rate_interval", "__range"}, panel["title"]


def test_uids_are_unique() -> None:
    uids = [load(path)["uid"] for path in BOARDS]
    assert len(uids) == len(set(uids)) == 5


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_every_query_uses_exported_metrics_and_labels(path: Path, exported: Exported) -> None:
    board = load(path)
    found = []
    for title, target in targets(board):
        found += [f"{title}: {p}" for p in problems(target["expr"], exported)]
        found += [
            f"{title}: {p}"
            for p in legend_problems(target.get("legendFormat", ""), target["expr"], exported)
        ]
    for name, selector, label in variable_queries(board):
        found += [f"${name}: {p}" for p in problems(selector, exported)]
        metrics = uses(selector).metrics
        if not any(label in exported.get(m, frozenset()) for m in metrics):
            found.append(f"${name}: no label {label} on {sorted(metrics)}")
    assert found == []


def test_the_dashboards_cover_the_metrics_of_design_section_5(exported: Exported) -> None:
    used: set[str] = set()
    for path in BOARDS:
        for _, target in targets(load(path)):
            used |= uses(target["expr"]).metrics
    design = {
        "gpuwatch_pod_gpu_share_ratio",
        "gpuwatch_pod_gpu_memory_bytes",
        "gpuwatch_pod_state",
        "gpuwatch_pod_state_seconds",
        "gpuwatch_gpu_utilization_ratio",
        "gpuwatch_gpu_allocated",
        "gpuwatch_gpu_idle_seconds_total",
        "gpuwatch_cost_usd_total",
        "gpuwatch_waste_usd_total",
        "gpuwatch_gpu_unallocated_access",
        "gpuwatch_pipeline_lag_seconds",
        "gpuwatch_events_total",
        "gpuwatch_deadletter_total",
    }
    assert design <= set(exported)
    assert design - used == set()


CAPACITY = {
    "gpuwatch_free_gpus", "gpuwatch_stranded_gpus", "gpuwatch_reclaimable_gpus",
    "gpuwatch_blocked_pods",
}  # fmt: skip
"""docs/DESIGN.md §5's capacity metrics, and the blocked pods beside them."""


def test_the_fleet_board_has_a_capacity_row_of_the_capacity_metrics(exported: Exported) -> None:
    assert set(exported) >= CAPACITY
    assert exported["gpuwatch_free_gpus"] == {"node", "model", "resource", "cluster"}
    assert exported["gpuwatch_stranded_gpus"] == {"model", "resource", "cluster"}
    board = load(DASHBOARDS / "gpuwatch-fleet.json")
    rows = [p for p in board["panels"] if p["type"] == "row"]
    (row,) = [r for r in rows if r["title"] == "Capacity"]
    start = row["gridPos"]["y"]
    end = min((r["gridPos"]["y"] for r in rows if r["gridPos"]["y"] > start), default=10**6)
    below = [p for p in board["panels"] if p["type"] != "row" and start < p["gridPos"]["y"] < end]
    used = {
        p["title"]: set().union(*(uses(t["expr"]).metrics for t in p["targets"])) for p in below
    }
    assert used == {
        "Free GPUs": {"gpuwatch_free_gpus"},
        "Stranded": {"gpuwatch_stranded_gpus"},
        "Reclaimable": {"gpuwatch_reclaimable_gpus"},
        "Pods blocked by fragmentation": {"gpuwatch_blocked_pods"},
        "Free GPUs by model": {"gpuwatch_free_gpus", "gpuwatch_stranded_gpus"},
        "Stranded and reclaimable by model": {
            "gpuwatch_stranded_gpus", "gpuwatch_reclaimable_gpus"
        },
        "Free GPUs by node": {"gpuwatch_free_gpus"},
    }  # fmt: skip
    for panel in below:
        for target in panel["targets"]:
            for metric, labels in re.findall(r"(gpuwatch_\w+)\{([^}]*)\}", target["expr"]):
                # The model variable filters every capacity selector, the node variable the
                # per-node ones (the others have no node).
                assert 'model=~"$model"' in labels, (panel["title"], metric)
                node = 'node=~"$node"' in labels
                assert node == (metric == "gpuwatch_free_gpus"), (panel["title"], metric)
    (table,) = [p for p in below if p["type"] == "table"]
    assert table["targets"][0]["format"] == "table"


def test_only_scrape_health_is_read_by_job() -> None:
    """The pod and GPU metrics come from the metrics sink, the pipeline's from the worker,
    and each may move: a panel selects a job only to count its targets (`up`)."""
    by_job = set()
    for path in BOARDS:
        for title, target in targets(load(path)):
            for metric, labels in re.findall(r"(\w*)\{([^}]*)\}", target["expr"]):
                if re.search(r"\bjob\s*(=|!=|=~|!~)", labels):
                    by_job.add((metric, labels))
                    assert metric == "up", (path.name, title, target["expr"])
    assert {labels for _, labels in by_job} == {
        f'job="{job}"'
        for job in ("gpuwatch-worker", "gpuwatch-sink", "gpuwatch-sink-metrics",
                    "gpuwatch-node-agent", "gpuwatch-k8s-watcher")
    }  # fmt: skip


CLUSTER_FILTER = 'cluster=~"$cluster"'
PIPELINE_BOARD = DASHBOARDS / "gpuwatch-pipeline.json"  # gpuwatch's own health: no cluster


def clustered(exported: Exported) -> set[str]:
    """The metrics that carry a `cluster` label, and ALERTS (which carries the rules')."""
    return {name for name, labels in exported.items() if "cluster" in labels} | {"ALERTS"}


def unfiltered(expr: str, metrics: set[str]) -> list[str]:
    """The selectors of `metrics` in `expr` that do not filter by the cluster variable."""
    found = []
    for match in re.finditer(r"(?<![\w:])([A-Za-z_:][\w:]*)(\s*\{([^}]*)\})?", expr):
        if match.group(1) in metrics and CLUSTER_FILTER not in (match.group(3) or ""):
            found.append(match.group(0))
    return found


@pytest.mark.parametrize("path", [b for b in BOARDS if b != PIPELINE_BOARD], ids=lambda p: p.name)
def test_a_dashboard_has_a_cluster_variable_and_filters_every_query_by_it(
    path: Path, exported: Exported
) -> None:
    board = load(path)
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "cluster"]
    query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
    assert query == "label_values(gpuwatch_gpu_utilization_ratio, cluster)"
    assert (variable["multi"], variable["includeAll"]) == (True, True)
    assert variable["allValue"] == ".*"  # All keeps series without the label (pipeline alerts)
    metrics, found = clustered(exported), []
    for title, target in targets(board):
        if uses(target["expr"]).metrics & metrics:
            found += [f"{title}: {s}" for s in unfiltered(target["expr"], metrics)]
    for name, selector, _ in variable_queries(board):
        if name != "cluster":
            found += [f"${name}: {s}" for s in unfiltered(selector, metrics)]
    assert found == []


def test_the_cluster_filter_check_catches_a_selector_without_it(exported: Exported) -> None:
    metrics = clustered(exported)
    assert {"gpuwatch_pod_state", "gpuwatch_gpu_utilization_ratio", "gpuwatch_cost_usd_total",
            "gpuwatch_alert_firing"} <= metrics  # fmt: skip
    assert "gpuwatch_events_total" not in metrics  # the pipeline's own
    expr = 'sum(gpuwatch_pod_state{cluster=~"$cluster"}) / count(gpuwatch_gpu_allocated)'
    assert unfiltered(expr, metrics) == ["gpuwatch_gpu_allocated"]
    assert unfiltered('ALERTS{alertstate="firing"}', metrics) == ['ALERTS{alertstate="firing"}']


def test_the_checker_catches_unknown_names_and_labels(exported: Exported) -> None:
    """The checks above could not pass by accident: typos are reported."""
    assert problems("sum(rate(gpuwatch_events_totl[5m]))", exported) == [
        "unknown metric gpuwatch_events_totl"
    ]
    assert problems('gpuwatch_gpu_allocated{team="a"}', exported) == [
        "gpuwatch_gpu_allocated has no label team"
    ]
    assert problems("sum by (team) (gpuwatch_gpu_allocated)", exported) == [
        "no metric here has label team"
    ]
    assert problems('sum by (namespace) (gpuwatch_cost_usd_total{team=~"$team"})', exported) == []
    assert legend_problems("{{gpu}}", "gpuwatch_cost_usd_total", exported) == [
        "legend shows gpu, absent from the series"
    ]


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    exprs = [target["expr"] for path in BOARDS for _, target in targets(load(path))]
    assert len(exprs) > 60
    done = promtool_check(exprs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


def test_promtool_check_fails_on_a_broken_query(tmp_path: Path) -> None:
    done = promtool_check(["sum by (team (gpuwatch_cost_usd_total)"], tmp_path)
    assert done.returncode != 0


@pytest.mark.parametrize("path", [RULES, THRESHOLD_RULES], ids=["stream", "thresholds"])
def test_the_alert_rules_use_exported_metrics_too(exported: Exported, path: Path) -> None:
    rules = yaml.safe_load(path.read_text(encoding="utf-8"))
    found = [
        f"{rule.get('alert') or rule.get('record')}: {p}"
        for group in rules["groups"]
        for rule in group["rules"]
        for p in problems(rule["expr"], {**exported, **FOREIGN})
    ]
    assert found == []
    assert not set(FOREIGN) & set(exported)


def test_grafana_provisioning_points_at_the_dashboards_and_prometheus() -> None:
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text("utf-8"))
    (source,) = sources["datasources"]
    assert (source["type"], source["url"], source["isDefault"]) == (
        "prometheus",
        "http://prometheus:9090",
        True,
    )
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpuwatch.yml").read_text("utf-8"))
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["folder"] == "gpuwatch"
    assert provider["options"]["path"] == "/etc/grafana/dashboards/gpuwatch"
