"""The node agent's own metrics, read from its counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from producers.agent.loop import NodeAgent
from producers.agent.publisher import Publisher

PREFIX = "gpuwatch_agent_"


@runtime_checkable
class ClaimStats(Protocol):
    """What the allocation source tells of devices allocated through ResourceClaims."""

    @property
    def unmapped_devices(self) -> int:
        """Claim devices of the last listing that no ResourceSlice named."""
        ...

    @property
    def slice_read_failures(self) -> int:
        """Failed reads of this node's ResourceSlices."""
        ...


class AgentCollector(Collector):
    """Samples, drops, buffer, read time and errors of one agent and its publisher."""

    def __init__(
        self, agent: NodeAgent, publisher: Publisher, claims: ClaimStats | None = None
    ) -> None:
        self._agent = agent
        self._publisher = publisher
        self._claims = claims

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
        if self._claims is not None:
            counters["resourceslice_errors"] = (
                "Failed reads of this node's ResourceSlices (DRA devices), retried",
                self._claims.slice_read_failures,
            )
            gauges["unmapped_claim_devices"] = (
                "Devices allocated through ResourceClaims that no ResourceSlice names; "
                "their pods have no allocation until one does",
                self._claims.unmapped_devices,
            )
        node = [self._agent.node]
        for kind, figures in ((CounterMetricFamily, counters), (GaugeMetricFamily, gauges)):
            for name, (doc, value) in figures.items():
                family = kind(PREFIX + name, doc, labels=["node"])
                family.add_metric(node, value)
                yield family
