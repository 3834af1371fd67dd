"""The idle-alert part's Prometheus, for real: the bench's private `prometheus` loads the
shipped rules, scrapes a worker's /metrics and shows the stream's firing alert in ALERTS,
where the bench's query finds it by GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest
from support import free_port, wait_until
from support.metric_records import T0, S, worker

from gpuwatch.harness.bench.alerts import AlertsQuery, PrivatePrometheus
from gpuwatch.harness.examples import example
from schemas.alert import Alert
from sinks.prometheus.metrics import serve

DEADLINE_S = 60.0  # Prometheus starts, loads its rules and scrapes within seconds


def idle_alert(gpu: str) -> Alert:
    """A firing GpuIdleAllocated message of `gpu` on node n1, held by ml/train-0."""
    raw = example("gpuwatch.alert/v1") | {
        "name": "GpuIdleAllocated", "status": "firing", "ts": T0, "fingerprint": f"fp-{gpu}",
        "since": T0 - 60 * S, "severity": "warning",
        "labels": {"node": "n1", "gpu": gpu, "model": "H100", "namespace": "ml", "pod": "train-0"},
        "subject": {"kind": "gpu", "uid": None, "uuid": gpu, "node": "n1"},
    }  # fmt: skip
    return msgspec.convert(raw, Alert)


def test_a_stream_alert_reaches_alerts_of_the_bench_prometheus(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("no prometheus binary (make os-deps installs it)")
    metrics = worker()
    metrics.observe_alert(idle_alert("GPU-bench-1"))
    port = free_port()
    server, _ = serve(port, "127.0.0.1", metrics.registry)
    prometheus = PrivatePrometheus(tmp_path, port)
    try:
        wait_until(
            prometheus.ready, timeout_s=DEADLINE_S, what="the shipped rules loaded, the worker up"
        )
        with AlertsQuery(prometheus) as query:
            wait_until(
                lambda: "GPU-bench-1" in query.seen,
                timeout_s=DEADLINE_S,
                what="GpuIdleAllocated of GPU-bench-1 firing in ALERTS",
            )
        assert set(query.seen) == {"GPU-bench-1"}
    finally:
        prometheus.stop()
        server.shutdown()
        server.server_close()
