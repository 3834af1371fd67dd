"""The simulation's /metrics: every simulated node agent's figures (label `node`) on the
agent port and the watcher's on the watcher port, read over HTTP as Prometheus scrapes them;
a taken port stops the command with one line naming the port and its setting (exit 2)."""

from __future__ import annotations

import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import free_port, wait_until

from gpuwatch.cli import main
from gpuwatch.config import load_settings
from gpuwatch.harness.simulate.metrics import MetricsPortError
from gpuwatch.harness.simulate.runner import SimulationService, run_simulation, start_simulation
from gpuwatch.harness.simulate.scenario import load_scenario
from producers.base.publisher import Done, MessageSender
from schemas.settings import Settings

EPOCH = 1_764_400_000
INCIDENT_NODES = ("h100-0", "h100-1", "h100-2")  # 3 x 4 H100; h100-2's agent down 400-490 s
T = TypeVar("T")

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Acks:
    """A MessageSender that acknowledges at once and counts what it got."""

    delivery_timeout_s = 600.0

    def __init__(self) -> None:
        self.sent = 0

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.sent += 1
        done(None)

    def abandon(self) -> None:
        """Nothing is held."""

    def flush(self, timeout_s: float) -> None:
        """Nothing is held."""

    def close(self, timeout_s: float) -> None:
        """Nothing to release."""


def acks(_topic: str, _client_id: str) -> MessageSender:
    return Acks()


@pytest.fixture
def settings() -> Settings:
    return load_settings(
        env={},
        overrides={
            "kafka.topic_prefix": "sim-metrics.",
            "agent.metrics_port": free_port(),
            "watcher.metrics_port": free_port(),
        },
    )


def scrape(port: int) -> tuple[str, Series]:
    """The exposition text and its samples: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return text, series


def by_node(series: Series, name: str) -> dict[str, float]:
    return {dict(labels)["node"]: value for (n, labels), value in series.items() if n == name}


def poll(read: Callable[[], T], ok: Callable[[T], bool], what: str, timeout_s: float = 10) -> T:
    """`read()` until `ok`; a refused connection (not listening yet) counts as not yet."""

    def passed() -> tuple[T] | None:
        value = read()
        return (value,) if ok(value) else None

    (value,) = wait_until(
        passed, timeout_s=timeout_s, what=what, interval_s=0.05, not_yet=(OSError,)
    )
    return value


def test_each_node_agent_exports_its_own_figures_and_a_down_one_none(settings: Settings) -> None:
    service = SimulationService(
        settings, load_scenario("incident"), epoch_s=EPOCH, senders=acks, serve_metrics=True
    )
    agent_port = settings.agent.metrics_port
    try:
        service.start()
        for _ in range(401):  # ticks sample [0, 1) ... [400, 401): h100-2 down in the last
            service.simulation.tick()
        text, series = scrape(agent_port)
        # One family per name however many nodes (a repeated TYPE line breaks the scrape).
        assert text.count("# TYPE gpuwatch_agent_samples_total counter") == 1
        assert by_node(series, "gpuwatch_agent_samples_total") == {
            "h100-0": 401,
            "h100-1": 401,
        }
        assert by_node(series, "gpuwatch_agent_gpus") == {"h100-0": 4, "h100-1": 4}
        # Each node's own publisher: its samples are acknowledged, none dropped or lost.
        poll(
            lambda: by_node(scrape(agent_port)[1], "gpuwatch_agent_sent_total"),
            lambda sent: sent == {"h100-0": 401, "h100-1": 401},
            "every sample acknowledged",
        )
        assert set(by_node(series, "gpuwatch_agent_dropped_total").values()) == {0}
        assert set(by_node(series, "gpuwatch_agent_lost_total").values()) == {0}

        for _ in range(90):  # to 491 s: h100-2 samples again from 490 s
            service.simulation.tick()
        _, series = scrape(agent_port)
        assert by_node(series, "gpuwatch_agent_samples_total") == {
            "h100-0": 491,
            "h100-1": 491,
            "h100-2": 401,
        }

        _, watcher = scrape(settings.watcher.metrics_port)
        nodes = (("namespace", ""), ("resource", "nodes"))
        assert watcher[("gpuwatch_k8s_watcher_tracked_objects", nodes)] == 3
        poll(
            lambda: scrape(settings.watcher.metrics_port)[1].get(
                ("gpuwatch_k8s_watcher_sent_total", (("topic", "k8s.nodes"),))
            ),
            lambda sent: sent == 3,
            "the three nodes published",
        )
    finally:
        service.stop()
    with pytest.raises(urllib.error.URLError, match="Connection refused"):  # closed with it
        scrape(agent_port)


def test_a_running_simulation_serves_growing_counters_and_the_watchers(
    settings: Settings,
) -> None:
    handle = start_simulation(
        settings, load_scenario("small"), speed=20, epoch_s=EPOCH, senders=acks, serve_metrics=True
    )
    try:
        first = poll(
            lambda: by_node(scrape(settings.agent.metrics_port)[1], "gpuwatch_agent_samples_total"),
            lambda samples: len(samples) == 3 and min(samples.values()) >= 1,
            "the three nodes sampled",
        )
        assert sorted(first) == ["h100-0", "h100-1", "l40s-0"]
        poll(
            lambda: by_node(scrape(settings.agent.metrics_port)[1], "gpuwatch_agent_samples_total"),
            lambda later: all(later[node] > first[node] for node in first),
            "every node's counter grows",
        )
        watcher = poll(
            lambda: scrape(settings.watcher.metrics_port)[1],
            lambda series: any(n == "gpuwatch_k8s_watcher_events_total" for n, _ in series),
            "pod changes watched (vision-train runs at 5 s)",
        )
        tracked = {
            dict(labels)["resource"]: value
            for (name, labels), value in watcher.items()
            if name == "gpuwatch_k8s_watcher_tracked_objects"
        }
        assert tracked["nodes"] == 3
        assert tracked["pods"] >= 6  # chat-serving, notebook-ana, llm-finetune, 3 dev pods
    finally:
        summary = handle.stop()
    assert summary is not None
    assert summary.sent["nvml.samples"] == summary.samples > 0


def test_a_taken_port_stops_it_naming_the_port_and_its_setting(settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = settings.model_copy(
            update={"watcher": settings.watcher.model_copy(update={"metrics_port": port})}
        )

        with pytest.raises(MetricsPortError) as caught:
            run_simulation(
                busy, load_scenario("small"), epoch_s=EPOCH, senders=acks, serve_metrics=True
            )

        # The agents' port was bound first and is free again.
        with socket.socket() as again:
            again.bind(("127.0.0.1", settings.agent.metrics_port))
    assert str(caught.value) == (
        f"port {port} on 127.0.0.1 is in use (watcher.metrics_port, env "
        "GPUWATCH_WATCHER_METRICS_PORT): cannot serve the Kubernetes watcher's metrics"
    )


def test_the_command_exits_2_with_one_line_when_the_agent_port_is_taken(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("GPUWATCH_AGENT_METRICS_PORT", str(port))
        monkeypatch.setenv("GPUWATCH_WATCHER_METRICS_PORT", str(free_port()))
        monkeypatch.setenv("GPUWATCH_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached
        root = logging.getLogger()
        monkeypatch.setattr(root, "level", root.level)  # the command raises it to INFO

        status = main(["simulate", "--scenario", "small", "--no-topic-check"])

    assert status == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"gpuwatch: port {port} on 127.0.0.1 is in use (agent.metrics_port, env "
        "GPUWATCH_AGENT_METRICS_PORT): cannot serve the node agents' metrics; stop what "
        "listens there, set another port, or pass --no-metrics"
    )
