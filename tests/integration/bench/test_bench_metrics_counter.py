"""What the bench reads of a process's /metrics: one counter, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server
from support import free_port

from gpuwatch.harness.bench.procs import metrics_counter


@pytest.fixture
def served() -> Iterator[tuple[int, Counter]]:
    registry = CollectorRegistry()
    errors = Counter("gpuwatch_sink_kafka_errors", "Kafka errors", registry=registry)
    labelled = Counter("gpuwatch_sink_other", "labelled", ["kind"], registry=registry)
    labelled.labels(kind="x").inc(5)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield port, errors
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_a_counter_is_read_and_a_missing_one_or_a_silent_port_is_none(
    served: tuple[int, Counter],
) -> None:
    port, errors = served
    assert metrics_counter(port, "gpuwatch_sink_kafka_errors_total") == 0
    errors.inc(3)
    assert metrics_counter(port, "gpuwatch_sink_kafka_errors_total") == 3
    assert metrics_counter(port, "gpuwatch_sink_other_total") is None  # labelled only
    assert metrics_counter(port, "gpuwatch_sink_absent_total") is None
    assert metrics_counter(free_port(), "gpuwatch_sink_kafka_errors_total") is None
