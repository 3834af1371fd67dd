"""The node agent's own metrics, read from its counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from producers.agent.loop import NodeAgent
from producers.base.publisher import Publisher

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
            "lost": ("Samples refused for good by Kafka (too large, invalid)", pub.stats.failed),
            "retried": (
                "Samples sent again after the Kafka client gave them up (broker away)",
                pub.stats.retried,
            ),
        }
        gauges = {
            "buffer_bytes": (
                "Bytes not yet acknowledged by Kafka (waiting and in flight)",
                pub.outbox.size_bytes,
            ),
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


class WorkScrapeStats(Protocol):
    """What a scraper of units of work counts (`producers.work.scraper.WorkStats`)."""

    @property
    def targets(self) -> int:
        """Pods scraped in the last round."""
        ...

    def outcomes(self) -> Mapping[str, int]:
        """Scrapes by outcome (ok, failed, too_large, bad_exposition)."""
        ...

    def failures(self) -> Mapping[str, int]:
        """Scrapes not ok by reason."""
        ...


class WorkTargetStats(Protocol):
    """What the source of the pods to scrape counts (`producers.work.targets.ApiTargets`)."""

    @property
    def failures(self) -> int:
        """Failed listings of the node's pods."""
        ...

    @property
    def bad_annotations(self) -> int:
        """Pods found with unusable gpuwatch.io/work annotations."""
        ...


class WorkCollector(Collector):
    """The scrapes of the node's pods' units of work (gpuwatch.io/work), by outcome."""

    def __init__(
        self, node: str, stats: WorkScrapeStats, targets: WorkTargetStats | None = None
    ) -> None:
        self._node = node
        self._stats = stats
        self._targets = targets

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Scrapes by outcome and by reason, the targets, and the pod listing's errors."""
        node = [self._node]
        scrapes = CounterMetricFamily(
            PREFIX + "work_scrapes",
            "Scrapes of pods' units of work by outcome (ok, failed, too_large, bad_exposition)",
            labels=["node", "outcome"],
        )
        for outcome, count in sorted(self._stats.outcomes().items()):
            scrapes.add_metric([*node, outcome], count)
        yield scrapes
        failures = CounterMetricFamily(
            PREFIX + "work_scrape_failures",
            "Scrapes of pods' units of work that were not ok, by reason",
            labels=["node", "reason"],
        )
        for reason, count in sorted(self._stats.failures().items()):
            failures.add_metric([*node, reason], count)
        yield failures
        targets = GaugeMetricFamily(
            PREFIX + "work_targets",
            "Pods whose units of work the last round scraped",
            labels=["node"],
        )
        targets.add_metric(node, self._stats.targets)
        yield targets
        if self._targets is not None:
            for name, doc, value in (
                (
                    "work_target_errors",
                    "Failed listings of the node's pods (units of work), retried",
                    self._targets.failures,
                ),
                (
                    "work_bad_annotations",
                    "Pods not scraped for units of work: unusable gpuwatch.io/work annotations",
                    self._targets.bad_annotations,
                ),
            ):
                family = CounterMetricFamily(PREFIX + name, doc, labels=["node"])
                family.add_metric(node, value)
                yield family
