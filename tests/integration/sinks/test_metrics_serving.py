"""/metrics served over HTTP, a taken port refused; scrapes while records arrive."""

from __future__ import annotations

import threading
import urllib.request

import pytest
from prometheus_client import generate_latest
from support import free_port
from support.metric_records import T0, gpu, parsed, pods, populated, sample, value, worker

from sinks.prometheus.collector import exposition
from sinks.prometheus.metrics import MetricsServeError, serve


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
