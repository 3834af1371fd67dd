"""Rendering: the fast text equals prometheus_client's, the series caps hold, /metrics serves."""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_metrics_fixtures import (
    T0,
    Clock,
    S,
    alert,
    attribution,
    gpu,
    lifecycle,
    sample,
    usage,
    value,
    window,
    worker,
)

from schemas.pod_lifecycle import PodLifecycle
from sinks.prometheus.collector import exposition
from sinks.prometheus.metrics import MetricsServeError, WorkerMetrics, serve

Samples = set[tuple[str, tuple[tuple[str, str], ...], float]]


def parsed(text: bytes) -> Samples:
    """(name, sorted labels, value) of every sample of a text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def populated() -> WorkerMetrics:
    """A worker with a value in every family, and label values that need escaping."""
    metrics = worker()
    metrics.observe_lifecycle(lifecycle(to="queued", ts=T0, pod='we"ird\\pod'))
    metrics.observe_lifecycle(lifecycle("u2", to="running", ts=T0 + 30 * S))
    metrics.observe_usage(usage("u2", ts=T0 + 30 * S))
    metrics.observe_attribution(attribution("u2", start=T0))
    metrics.observe_gpu_window(window("GPU-1", T0))
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1", 3.0, pods=("x",))], {"u2": ["GPU-1"]}))
    metrics.observe_alert(alert())
    metrics.count_event("gpuwatch.nvml.samples", 3)
    metrics.count_deadletter("gpuwatch.k8s.pods", "schema")
    metrics.set_lag(2.5)
    return metrics


def test_the_fast_exposition_says_what_prometheus_client_says() -> None:
    metrics = populated()
    fast, reference = exposition(metrics.registry), generate_latest(metrics.registry)
    assert parsed(fast) == parsed(reference)
    names = {name for name, _, _ in parsed(fast)}
    assert len(names) == 16  # every family of DESIGN.md section 5 and the cap's own
    assert b'pod="we\\"ird\\\\pod"' in fast


def test_values_read_back_through_a_fresh_registry() -> None:
    metrics = populated()
    text = parsed(generate_latest(metrics.registry))
    pod = {"namespace": "ml", "node": "n1", "pod": "train-0", "team": "vision"}
    running = tuple(sorted((pod | {"state": "running"}).items()))
    assert ("gpuwatch_pod_state", running, 1.0) in text
    assert value(metrics, "gpuwatch_cost_usd_total", namespace="ml", team="vision") == 0.0658
    assert value(metrics, "gpuwatch_gpu_unallocated_access", node="n1", gpu="GPU-1", model="H100")


def test_other_collectors_of_the_registry_are_exposed_too() -> None:
    registry = CollectorRegistry()
    WorkerMetrics(registry, clock=Clock())
    Counter("gpuwatch_test_other", "another collector", registry=registry).inc(7)
    assert ("gpuwatch_test_other_total", (), 7.0) in parsed(exposition(registry))


def test_a_second_worker_metrics_on_one_registry_is_refused() -> None:
    metrics = worker()
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        WorkerMetrics(metrics.registry)


def pods(n: int, to: str = "running") -> Iterator[PodLifecycle]:
    """Transitions of n distinct pods, built once from the example."""
    first = lifecycle(to=to)
    for i in range(n):
        yield PodLifecycle(**{**{f: getattr(first, f) for f in first.__struct_fields__},
                              "uid": f"uid-{i}", "pod": f"job-{i}", "ts": T0 + i})  # fmt: skip


def test_the_pod_cap_holds_under_100k_distinct_pods_and_counts_what_it_refused() -> None:
    metrics = worker()  # the default cap: 50 000 pods
    for record in pods(100_000):
        metrics.observe_lifecycle(record)
    text = exposition(metrics.registry)
    assert text.count(b"\ngpuwatch_pod_state{") == 50_000
    assert value(metrics, "gpuwatch_metrics_tracked", kind="pod") == 50_000
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="pod") == 50_000


def test_finished_pods_make_room_for_new_ones_at_the_cap() -> None:
    metrics = worker(max_pod_series=1000)
    for record in pods(5000, to="finished"):
        metrics.observe_lifecycle(record)
    metrics.observe_lifecycle(lifecycle("live", to="running", pod="live-0"))
    assert value(metrics, "gpuwatch_metrics_tracked", kind="pod") == 1000
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="pod") == 0
    assert value(metrics, "gpuwatch_pod_state", namespace="ml", pod="live-0", team="vision",
                 node="n1", state="running") == 1  # fmt: skip


def test_gpu_and_label_set_caps() -> None:
    metrics = worker(max_gpu_series=2, max_label_sets=3)
    metrics.observe_sample(sample("n1", T0, [gpu("GPU-1"), gpu("GPU-2"), gpu("GPU-3")], {}))
    for topic in ("a", "b", "c", "d", "a"):
        metrics.count_event(topic)
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="gpu") == 1
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="label_set") == 1
    assert value(metrics, "gpuwatch_events_total", topic="a") == 2
    assert value(metrics, "gpuwatch_events_total", topic="d") is None


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serve_answers_scrapes_and_refuses_a_taken_port() -> None:
    metrics = populated()
    port = free_port()
    server, thread = serve(port, "127.0.0.1", metrics.registry)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read()
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert parsed(body) == parsed(generate_latest(metrics.registry))
        with pytest.raises(MetricsServeError, match=f"127.0.0.1:{port}"):
            serve(port, "127.0.0.1", metrics.registry)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_scrapes_while_records_arrive_see_consistent_state() -> None:
    metrics = worker()
    errors: list[BaseException] = []
    done = threading.Event()

    def scrape() -> None:
        try:
            while not done.is_set():
                exposition(metrics.registry)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    samples = [sample(f"n{n}", T0, [gpu(f"GPU-{n}-{g}") for g in range(8)], {}) for n in range(50)]
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i, record in enumerate(pods(10_000)):
            metrics.observe_lifecycle(record)
            metrics.observe_sample(samples[i % 50])
    finally:
        done.set()
        scraper.join(timeout=10)
    assert errors == []
    assert value(metrics, "gpuwatch_metrics_tracked", kind="pod") == 10_000
