"""AgentCollector: the agent's and publisher's counters as Prometheus families, read at scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.empty_node import empty_node_agent

from producers.agent.metrics import AgentCollector
from producers.base.outbox import Entry
from producers.base.publisher import Done, Publisher, Rejected


class HoldingSender:
    delivery_timeout_s = 600.0

    def __init__(self) -> None:
        self.pending: list[Done] = []

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.pending.append(done)

    def abandon(self) -> None:
        return None

    def flush(self, timeout_s: float) -> None:
        return None

    def close(self, timeout_s: float) -> None:
        return None


def scrape(registry: CollectorRegistry) -> dict[str, tuple[str, dict[str, str], float]]:
    """Sample name -> (family type, labels, value) from the text exposition."""
    text = generate_latest(registry).decode()
    return {
        sample.name: (family.type, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_the_collector_reports_each_figure_with_the_node_label() -> None:
    sender = HoldingSender()
    agent = empty_node_agent("gpu-node-17", lambda key, value: None)
    agent.tick()
    size = len(b"gpu-node-17") + agent.stats.last_sample_bytes  # an outbox entry: key + value
    publisher = Publisher(sender, max_buffer_bytes=1000 + size)
    agent = empty_node_agent("gpu-node-17", publisher.publish)
    for _ in range(3):
        agent.tick()
    agent.stats.skipped_ticks = 4
    agent.stats.read_errors = 5
    agent.stats.last_read_s = 0.125
    agent.stats.gpus = 8
    assert publisher.step() == 3  # all three handed over, none acknowledged yet
    sender.pending[0](None)
    sender.pending[1](Rejected("too large"))
    sender.pending[2](TimeoutError("delivery timeout"))
    assert publisher.step() == 1  # the third, sent again
    # Three of 400 bytes next to the one in flight: the first of them is dropped.
    for _ in range(3):
        publisher.outbox.put(Entry(b"k", b"v" * 399))

    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, publisher))
    got = scrape(registry)

    node = {"node": "gpu-node-17"}
    assert got == {
        "gpuwatch_agent_samples_total": ("counter", node, 3.0),
        "gpuwatch_agent_skipped_ticks_total": ("counter", node, 4.0),
        "gpuwatch_agent_read_errors_total": ("counter", node, 5.0),
        "gpuwatch_agent_sent_total": ("counter", node, 1.0),
        "gpuwatch_agent_dropped_total": ("counter", node, 1.0),
        "gpuwatch_agent_lost_total": ("counter", node, 1.0),
        "gpuwatch_agent_retried_total": ("counter", node, 1.0),
        "gpuwatch_agent_buffer_bytes": ("gauge", node, 800.0 + size),
        "gpuwatch_agent_in_flight_bytes": ("gauge", node, float(size)),
        "gpuwatch_agent_read_seconds": ("gauge", node, 0.125),
        "gpuwatch_agent_gpus": ("gauge", node, 8.0),
    }


def test_values_are_read_at_scrape_time() -> None:
    publisher = Publisher(HoldingSender(), max_buffer_bytes=1000)
    queued: list[int] = []

    def publish(key: bytes, value: bytes) -> None:
        queued.append(len(key) + len(value))
        publisher.publish(key, value)

    agent = empty_node_agent("n1", publish)
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, publisher))
    before = scrape(registry)
    assert before["gpuwatch_agent_samples_total"][2] == 0.0
    assert before["gpuwatch_agent_buffer_bytes"][2] == 0.0

    agent.tick()
    agent.tick()

    after = scrape(registry)
    assert after["gpuwatch_agent_samples_total"] == ("counter", {"node": "n1"}, 2.0)
    assert len(queued) == 2
    assert after["gpuwatch_agent_buffer_bytes"][2] == sum(queued)
