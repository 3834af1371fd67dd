"""Every dashboard query and alert rule, evaluated by a real Prometheus on real expositions.

promtool proves the queries parse; only an evaluation shows a vector match that fails at
run time (many-to-many, a group_left on the wrong side) or a query that finds nothing.
A private Prometheus (its own port and data directory, not the local stack's) scrapes a
worker, the two sinks, a node agent and a watcher served from this process with a little
data in each: three pods (stalled, queued, running), three GPUs (busy, allocated and idle,
free but used), the busy one with health readings and two health alerts firing. The pod
and GPU metrics are served once, under the worker's job (the metrics sink's job serves its
own counters): the queries are job-agnostic. Dashboard
variables take the example pod's values.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_exposition import (
    POD,
    agent_registry,
    metrics_sink_registry,
    redis_sink_registry,
    watcher_registry,
    worker_metrics,
)
from deploy_promql import substitute
from prometheus_client import CollectorRegistry
from support import free_port, wait_until
from test_deploy_dashboards import with_health

from gpuwatch.harness.examples import example
from sinks.prometheus.metrics import serve

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
RULES = ROOT / "deploy" / "prometheus" / "gpuwatch-rules.yml"
DEADLINE_S = 60.0  # scrapes every second; slack for a loaded 2-core machine
VARIABLES = {
    "cluster": ".*",  # the variable's All: the default cluster's series have no cluster label
    "namespace": POD["namespace"],
    "pod": POD["pod"],
    "team": POD["labels"]["team"],
    # The GPU panels' node and model: the sample's, so a filter that drops them shows.
    "node": example("gpuwatch.nvml.sample/v1")["node"],
    "model": example("gpuwatch.nvml.sample/v1")["gpus"][0]["model"],
}
# No proxies: an http_proxy in the environment must not swallow requests to loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str) -> Any:
    try:
        with _OPENER.open(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # a bad query: 400/422 with the error in the body
        return json.loads(exc.read())


def poll(what: str, probe: Callable[[], Any]) -> Any:
    """probe() until it returns something truthy (a refused connection is not yet)."""
    return wait_until(probe, timeout_s=DEADLINE_S, what=what, interval_s=0.2, not_yet=(OSError,))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (make os-deps installs it)")
    home = tmp_path_factory.mktemp("prometheus")
    servers = []
    registries = {
        "gpuwatch-worker": with_health(worker_metrics(CollectorRegistry())).registry,
        "gpuwatch-sink": redis_sink_registry(),
        "gpuwatch-sink-metrics": metrics_sink_registry(),
        "gpuwatch-node-agent": agent_registry(),
        "gpuwatch-k8s-watcher": watcher_registry(),
    }
    jobs = []
    for job, registry in registries.items():
        port = free_port()
        servers.append(serve(port, "127.0.0.1", registry)[0])
        jobs.append({"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]})
    shutil.copy(RULES, home / RULES.name)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [RULES.name],
        "scrape_configs": jobs,
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (home / "log").open("wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={home / 'prometheus.yml'}",
             f"--storage.tsdb.path={home / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        try:
            poll("a ready Prometheus", lambda: _OPENER.open(f"{base}/-/ready", timeout=2).status)
            # rate() and increase() need two samples in their range: wait for a few scrapes.
            poll(
                "three scrapes of each target",
                lambda: len(query(base, "count_over_time(up[1m]) >= 3")) == len(jobs),
            )
            # The GPU health panel reads ALERTS: wait for the evaluation that fires them.
            poll(
                "the stream's GPU health alerts in ALERTS",
                lambda: len(query(base, 'ALERTS{alertname=~"GpuXidError|GpuThrottled"}')) == 2,
            )
            yield base
        finally:
            process.terminate()
            process.wait(timeout=30)
            for server in servers:
                server.shutdown()
                server.server_close()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    answer = get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    if answer["status"] != "success":
        raise ValueError(answer.get("error", answer))
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def dashboard_queries() -> Iterator[tuple[str, str, str]]:
    for path in DASHBOARDS:
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for name, value in VARIABLES.items():
                    expr = expr.replace(f"${name}", value)
                yield path.stem, panel["title"], substitute(expr)


# Panels that may find nothing in this data, and why that is right.
MAY_BE_EMPTY = {
    # ALERTS exist once a rule has been pending; whether one has depends on timing.
    ("gpuwatch-alerts", "Firing now"),
    ("gpuwatch-alerts", "Firing alerts by name"),
}


def test_every_dashboard_query_evaluates_and_finds_data(prometheus: str) -> None:
    failed, empty, ran = [], set(), 0
    for board, title, expr in dashboard_queries():
        ran += 1
        try:
            if not query(prometheus, expr):
                empty.add((board, title))
        except ValueError as exc:
            failed.append(f"{board} / {title}: {exc}")
    assert failed == []
    assert empty - MAY_BE_EMPTY == set()
    assert ran > 60


def test_the_key_numbers_of_the_fleet_and_queue_boards(prometheus: str) -> None:
    def value(promql: str) -> float:
        (sample,) = query(prometheus, promql)
        return float(sample["value"][1])

    exprs = {f"{board}/{title}": expr for board, title, expr in dashboard_queries()}
    assert value(exprs["gpuwatch-fleet/GPUs reporting"]) == 3
    assert value(exprs["gpuwatch-fleet/Busy"]) == 1
    assert value(exprs["gpuwatch-fleet/Idle, allocated"]) == 1
    assert value(exprs["gpuwatch-fleet/Unallocated"]) == 1
    assert value(exprs["gpuwatch-fleet/Unallocated access"]) == 1
    assert value(exprs["gpuwatch-queue/Queued pods"]) == 1
    assert value(exprs["gpuwatch-pod/GPUs"]) == 1
    (state,) = query(prometheus, exprs["gpuwatch-pod/State"])
    assert state["metric"]["state"] == "stalled"
    (holder,) = query(prometheus, exprs["gpuwatch-fleet/Pods holding idle GPUs"])
    assert (holder["metric"]["pod"], holder["metric"]["gpu"]) == ("serve-0", "GPU-idle-allocated")


def test_the_capacity_row_of_the_fleet_board(prometheus: str) -> None:
    """The example picture: H100s with 2 free on each of three nodes (the node variable
    keeps the sample's), all 6 stranded, 1 reclaimable, 1 pod blocked."""

    def value(promql: str) -> float:
        (sample,) = query(prometheus, promql)
        return float(sample["value"][1])

    exprs = {title: e for board, title, e in dashboard_queries() if board == "gpuwatch-fleet"}
    assert value(exprs["Free GPUs"]) == 2
    assert value(exprs["Stranded"]) == 6
    assert value(exprs["Reclaimable"]) == 1
    assert value(exprs["Pods blocked by fragmentation"]) == 1
    (by_model,) = query(prometheus, exprs["Free GPUs by model"])
    assert (by_model["metric"]["model"], by_model["metric"]["resource"]) == (
        VARIABLES["model"], "nvidia.com/gpu"
    )  # fmt: skip
    assert float(by_model["value"][1]) == 2
    (by_node,) = query(prometheus, exprs["Free GPUs by node"])
    assert (by_node["metric"]["node"], float(by_node["value"][1])) == (VARIABLES["node"], 2)
    every_node = exprs["Free GPUs by node"].replace(f'node=~"{VARIABLES["node"]}"', 'node=~".*"')
    assert sorted(r["metric"]["node"] for r in query(prometheus, every_node)) == [
        "gpu-node-17", "gpu-node-18", "gpu-node-19"
    ]  # fmt: skip


def test_the_sinks_on_the_pipeline_board(prometheus: str) -> None:
    def value(promql: str) -> float:
        (sample,) = query(prometheus, promql)
        return float(sample["value"][1])

    exprs = {title: e for board, title, e in dashboard_queries() if board == "gpuwatch-pipeline"}
    assert value(exprs["Redis sinks up"]) == 1
    assert value(exprs["Metrics sinks up"]) == 1
    assert value(exprs["Redis sink lag"]) == 2.5
    assert value(exprs["Records Redis refused over the range"]) == 0  # a flat counter


def test_every_alert_rule_evaluates_cleanly(prometheus: str) -> None:
    def rules() -> list[dict[str, Any]]:
        groups = get(f"{prometheus}/api/v1/rules")["data"]["groups"]
        evaluated = [
            r for g in groups for r in g["rules"] if r.get("lastEvaluation", "").startswith("2")
        ]
        total = sum(len(g["rules"]) for g in groups)
        return [r for g in groups for r in g["rules"]] if len(evaluated) == total else []

    found = poll("an evaluation of every rule", rules)
    assert [
        (r["name"], r["health"], r.get("lastError")) for r in found if r["health"] != "ok"
    ] == []
    assert len(found) >= 10


def test_the_alert_the_stream_fired_is_in_alerts_as_firing(prometheus: str) -> None:
    """The worker's firing GpuIdleAllocated (the example alert) through the default rules."""
    alert = example("gpuwatch.alert/v1")
    expr = f'ALERTS{{alertname="{alert["name"]}",gpu="{alert["subject"]["uuid"]}"}}'
    (found,) = poll("the stream's alert in ALERTS", lambda: query(prometheus, expr))
    labels = found["metric"]
    assert labels["alertstate"] == "firing"  # no `for`: never pending
    assert (labels["severity"], labels["node"], labels["namespace"]) == (
        alert["severity"], alert["labels"]["node"], alert["labels"]["namespace"]
    )  # fmt: skip


def test_the_gpu_health_panel_shows_the_alerts_by_pod_and_the_slowed_gpu(
    prometheus: str,
) -> None:
    alerts, slowed = [
        query(prometheus, expr)
        for board, title, expr in dashboard_queries()
        if (board, title) == ("gpuwatch-fleet", "GPU health")
    ]
    gpu = example("gpuwatch.nvml.sample/v1")["gpus"][0]["uuid"]
    assert sorted(
        (a["metric"]["alertname"], a["metric"]["severity"], a["metric"]["gpu"],
         a["metric"]["pod"], a["metric"].get("xid", ""))
        for a in alerts
    ) == [
        ("GpuThrottled", "warning", gpu, POD["pod"], ""),
        ("GpuXidError", "critical", gpu, POD["pod"], "79"),
    ]  # fmt: skip
    assert [(s["metric"]["gpu"], s["metric"]["reason"]) for s in slowed] == [
        (gpu, "hw_thermal_slowdown")  # sw_power_cap is active too: not a fault
    ]
