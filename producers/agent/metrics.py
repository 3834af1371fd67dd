"""The node agent's own metrics, read from its counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from producers.agent.loop import NodeAgent
from producers.agent.publisher import Publisher

PREFIX = "gpuwatch_agent_"


class AgentCollector(Collector):
    """Samples, drops, buffer, read time and errors of one agent and its publisher."""

    def __init__(self, agent: NodeAgent, publisher: Publisher) -> None:
        self._agent = agent
        self._publisher = publisher

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """One family per figure, labelled with the node."""
        stats, pub = self._agent.stats, self._publisher
        counters = {
            "samples": ("Node samples taken", stats.ticks),
            "skipped_ticks": ("Ticks skipped after an overrun", stats.skipped_ticks),
            "read_errors": ("Device reads that failed", stats.read_errors),
            "sent": ("Samples acknowledged by Kafka", pub.stats.sent),
            "dropped": ("Samples dropped, oldest first, from a full buffer", pub.outbox.dropped),
            "lost": ("Samples given up after the delivery timeout", pub.stats.failed),
        }
        gauges = {
            "buffer_bytes": ("Bytes waiting for Kafka", pub.outbox.size_bytes),
            "in_flight_bytes": (
                "Bytes handed to the Kafka client, not yet acknowledged",
                pub.in_flight_bytes,
            ),
            "read_seconds": (
                "Seconds the last tick spent reading GPUs, PIDs and allocations",
                stats.last_read_s,
            ),
            "gpus": ("GPUs and MIG instances in the last sample", stats.gpus),
        }
        node = [self._agent.node]
        for kind, figures in ((CounterMetricFamily, counters), (GaugeMetricFamily, gauges)):
            for name, (doc, value) in figures.items():
                family = kind(PREFIX + name, doc, labels=["node"])
                family.add_metric(node, value)
                yield family
