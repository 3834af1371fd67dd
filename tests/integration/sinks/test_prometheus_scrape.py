"""The local stack's Prometheus scrapes a running WorkerMetrics and loads the alert rules."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry
from support import wait_until

from gpuwatch.harness.examples import example
from schemas.attribution import Attribution
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from schemas.settings import Settings
from sinks.prometheus.metrics import MetricsServeError, WorkerMetrics, serve

pytestmark = pytest.mark.integration

EXPORTER_PORT = 9484  # the port prometheus.yml scrapes as job gpuwatch-sink-metrics
DEADLINE_S = 60.0  # a 5 s scrape interval, a few scrapes of slack on a loaded machine
# No proxies: an http_proxy in the environment must not swallow requests to loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Clock:
    """The worker's clock, moved by the test (expiry of finished pods)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _get(url: str, data: bytes | None = None) -> Any:
    with _OPENER.open(urllib.request.Request(url, data=data), timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = _get(
        f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    )["data"]["result"]
    return result


def _poll(what: str, probe: Callable[[], Any]) -> Any:
    """probe() until it returns something truthy, or fail after DEADLINE_S saying what."""
    return wait_until(probe, timeout_s=DEADLINE_S, what=what, interval_s=0.5)


@pytest.fixture
def served(stack: Settings) -> Iterator[tuple[WorkerMetrics, Clock]]:
    """A WorkerMetrics on a fresh registry, served where the local Prometheus scrapes the
    metrics sink (`gpuwatch sink metrics`)."""
    clock = Clock()
    metrics = WorkerMetrics(CollectorRegistry(), clock=clock)
    try:
        server, thread = serve(EXPORTER_PORT, "127.0.0.1", metrics.registry)
    except MetricsServeError as exc:
        pytest.fail(
            f"{exc}: something (a running `gpuwatch sink metrics`?) holds "
            f"127.0.0.1:{EXPORTER_PORT}, the port the local Prometheus scrapes as "
            "gpuwatch-sink-metrics; stop it and rerun"
        )
    try:
        yield metrics, clock
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_prometheus_scrapes_the_metrics_sink_and_loses_a_finished_pods_series(
    stack: Settings, served: tuple[WorkerMetrics, Clock]
) -> None:
    metrics, clock = served
    base = f"http://127.0.0.1:{stack.stack.prometheus_port}"
    run = uuid.uuid4().hex[:8]
    ns, node, uid = f"gwtest-{run}", f"gwtest-node-{run}", f"gwtest-uid-{run}"
    job = f'job="gpuwatch-sink-metrics",instance="127.0.0.1:{EXPORTER_PORT}"'

    raw = example("gpuwatch.pod.lifecycle/v1") | {"uid": uid, "namespace": ns, "node": node}
    metrics.observe_lifecycle(msgspec.convert(raw | {"to_state": "running"}, PodLifecycle))
    raw_attr = example("gpuwatch.attribution/v1") | {"uid": uid, "namespace": ns, "node": node}
    metrics.observe_attribution(msgspec.convert(raw_attr, Attribution))
    metrics.observe_attribution(msgspec.convert(raw_attr, Attribution))  # a replay
    gpu_window = msgspec.convert(example("gpuwatch.gpu.window/v1") | {"node": node}, GpuWindow)
    metrics.observe_gpu_window(gpu_window)
    idle = gpu_window.uuid
    metrics.observe_sample(
        msgspec.convert(example("gpuwatch.nvml.sample/v1") | {"node": node}, NvmlSample)
    )

    state = _poll(
        "gpuwatch_pod_state of the test pod",
        lambda: _query(base, f'gpuwatch_pod_state{{{job},namespace="{ns}"}}'),
    )
    assert [(s["metric"]["pod"], s["metric"]["team"], s["metric"]["state"]) for s in state] == [
        ("train-0", "vision", "running")
    ]
    assert state[0]["value"][1] == "1"
    at_node = f'{job},node="{node}"'
    checks = {
        f'gpuwatch_cost_usd_total{{{job},namespace="{ns}"}}': "0.0658",
        f'gpuwatch_waste_usd_total{{{job},namespace="{ns}"}}': "0.0033",
        f"gpuwatch_gpu_utilization_ratio{{{at_node}}}": "0.87",
        f"gpuwatch_gpu_allocated{{{at_node}}}": "1",
        f'gpuwatch_gpu_idle_seconds_total{{{at_node},gpu="{idle}",allocated="true"}}': "36",
        f'sum(gpuwatch_pod_gpu_share_ratio{{{job},namespace="{ns}"}})': "0.86",
    }
    for promql, expected in checks.items():
        (answer,) = _query(base, promql)
        assert answer["value"][1] == expected, promql

    metrics.observe_lifecycle(
        msgspec.convert(raw | {"to_state": "finished", "ts": raw["ts"] + 1000}, PodLifecycle)
    )
    _poll(
        "the finished state",
        lambda: _query(base, f'gpuwatch_pod_state{{{job},namespace="{ns}",state="finished"}}'),
    )
    clock.now = 301.0  # past the 300 s grace: the next scrape no longer has the pod
    _poll(
        "the finished pod's series gone",
        lambda: not _query(base, f'{{{job},namespace="{ns}",pod="train-0"}}'),
    )
    # The namespace's cost counter stays: it is not a pod series.
    assert _query(base, f'gpuwatch_cost_usd_total{{{job},namespace="{ns}"}}')


def test_the_local_prometheus_loads_and_evaluates_the_gpuwatch_rules(stack: Settings) -> None:
    base = f"http://127.0.0.1:{stack.stack.prometheus_port}"
    _get(f"{base}/-/reload", data=b"")  # pick up the rules file as it is in this checkout
    expected = {
        "GpuIdleAllocated", "GpuUnallocatedAccess", "PodStalled", "PodQueuedTooLong",
        "NodeTelemetryMissing", "GpuwatchPipelineLagging", "GpuwatchDeadLetters",
        "GpuwatchWorkerDown", "GpuwatchK8sWatcherDown", "GpuwatchSinkDown",
        "GpuwatchMetricsSeriesDropped", "GpuXidError", "GpuEccUncorrectable",
        "GpuRowRemapFailure", "GpuThrottled", "PodBlockedByFragmentation", "GpuCapacityStranded",
        "WorkloadQueuedTooLong", "GpuwatchNodeSamplesStopped", "GpuwatchAllNodeAgentsDown",
        "GpuwatchNodeAgentDown", "GpuwatchNodeAgentNotDelivering",
        "GpuwatchNodeAgentSamplesDropped", "GpuwatchNodeAgentSamplesLost",
        "GpuwatchNodeSamplesMissing", "GpuwatchLateEvents", "GpuwatchWorkUnitsDropped",
        "GpuwatchRedisSinkRejected", "GpuwatchSinkInvalidRecords",
        "GpuwatchK8sWatcherMessagesLost", "GpuwatchK8sWatcherMalformedObjects",
        "GpuwatchWorkerStalled", "GpuwatchSinkStalled",
    }  # fmt: skip

    def evaluated() -> dict[str, str]:
        groups = _get(f"{base}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups if g["file"].endswith("gpuwatch-rules.yml") for r in g["rules"]]
        done = all(r["lastEvaluation"] > "2000" for r in rules)  # RFC 3339, zero time is 0001
        return {r["name"]: r["health"] for r in rules} if rules and done else {}

    health = _poll("an evaluation of every gpuwatch rule", evaluated)
    assert set(health) == expected
    assert set(health.values()) == {"ok"}, health
