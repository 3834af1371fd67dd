"""The chart's consumers (worker, Redis sink, metrics sink) are live by /livez, not /metrics:
a process whose processing stopped still answers /metrics (gpuwatch/run/progress.py)."""

from __future__ import annotations

from typing import Any

import pytest
from deploy_chart import helm_path, render

pytestmark = pytest.mark.timeout(900)  # the first use may build helm

CONSUMERS = ("worker", "sink-redis", "sink-metrics")


@pytest.fixture(scope="module")
def deployments() -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in render(helm_path())
        if o["kind"] == "Deployment"
    }


@pytest.mark.parametrize("component", CONSUMERS)
def test_the_liveness_probe_asks_livez_on_the_metrics_port(
    deployments: dict[str, dict[str, Any]], component: str
) -> None:
    (container,) = deployments[component]["spec"]["template"]["spec"]["containers"]
    liveness = container["livenessProbe"]
    assert liveness["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert "metrics" in {port["name"] for port in container["ports"]}
    # The startup probe still waits for /metrics: a table restore is not a stall yet.
    assert container["startupProbe"]["httpGet"]["path"] == "/metrics"
