"""The node agent's own metrics, read from its counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from producers.agent.loop import NodeAgent
from producers.agent.publisher import Publisher


class AgentCollector(Collector):
    """Samples, drops, buffer, read time and errors of one agent and its publisher."""

    def __init__(self, agent: NodeAgent, publisher: Publisher) -> None:
        self._agent = agent
        self._publisher = publisher

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """One family per figure, labelled with the node."""
        agent, pub = self._agent, self._publisher
        node = agent.node

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["node"])
            family.add_metric([node], value)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["node"])
            family.add_metric([node], value)
            return family

        yield counter("gpuwatch_agent_samples", "Node samples taken", agent.stats.ticks)
        yield counter(
            "gpuwatch_agent_skipped_ticks",
            "Ticks skipped after an overrun",
            agent.stats.skipped_ticks,
        )
        yield counter(
            "gpuwatch_agent_read_errors", "Device reads that failed", agent.stats.read_errors
        )
        yield counter("gpuwatch_agent_sent", "Samples acknowledged by Kafka", pub.stats.sent)
        yield counter(
            "gpuwatch_agent_dropped",
            "Samples dropped, oldest first, from a full buffer",
            pub.outbox.dropped,
        )
        yield counter(
            "gpuwatch_agent_lost", "Samples given up after the delivery timeout", pub.stats.failed
        )
        yield gauge("gpuwatch_agent_buffer_bytes", "Bytes waiting for Kafka", pub.outbox.size_bytes)
        yield gauge(
            "gpuwatch_agent_in_flight_bytes",
            "Bytes handed to the Kafka client, not yet acknowledged",
            pub.in_flight_bytes,
        )
        yield gauge(
            "gpuwatch_agent_read_seconds",
            "Seconds the last tick spent reading GPUs, PIDs and allocations",
            agent.stats.last_read_s,
        )
        yield gauge(
            "gpuwatch_agent_gpus", "GPUs and MIG instances in the last sample", agent.stats.gpus
        )
