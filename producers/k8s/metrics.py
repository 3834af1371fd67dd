"""The watcher's own metrics, read from its counters at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from producers.base.publisher import Publisher
from producers.k8s.owners import OwnerStats
from producers.k8s.watching import Watch

PREFIX = "gpuwatch_k8s_watcher_"


class WatcherCollector(Collector):
    """Events, publishes, relists, API errors and last event age of every watch, owner
    lookups, and the publishers' buffers (labels: resource, namespace; topic)."""

    def __init__(
        self,
        watches: Sequence[Watch[Any, Any]],
        owners: OwnerStats,
        publishers: Mapping[str, Publisher] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._watches = watches
        self._owners = owners
        self._publishers = publishers or {}
        self._monotonic = monotonic

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """One family per figure."""
        watch_labels = ["resource", "namespace"]

        def by(name: str, doc: str, extra: str) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, doc, labels=[*watch_labels, extra])

        events = by("events", "Watch events received", "type")
        published = by("published", "Messages published", "type")
        relists = by("relists", "Lists of a collection, by reason", "reason")
        errors = by("api_errors", "Failed API requests, by HTTP status", "status")
        malformed = CounterMetricFamily(
            PREFIX + "malformed", "Objects or events skipped as unusable", labels=watch_labels
        )
        requests = CounterMetricFamily(
            PREFIX + "watch_requests", "Watch requests opened", labels=watch_labels
        )
        age = GaugeMetricFamily(
            PREFIX + "last_event_age_seconds",
            "Seconds since the last watch event or list (bookmarks count)",
            labels=watch_labels,
        )
        tracked = GaugeMetricFamily(
            PREFIX + "tracked_objects", "Objects published and not deleted", labels=watch_labels
        )
        now = self._monotonic()
        for watch in self._watches:
            where = [watch.collection.resource, watch.collection.namespace or ""]
            stats = watch.stats
            for family, counts in (
                (events, stats.events),
                (published, stats.published),
                (relists, stats.relists),
                (errors, stats.api_errors),
            ):
                for label, value in sorted(dict(counts).items()):
                    family.add_metric([*where, label], value)
            malformed.add_metric(where, stats.malformed)
            requests.add_metric(where, stats.watch_requests)
            tracked.add_metric(where, stats.tracked)
            if stats.last_event_at is not None:
                age.add_metric(where, max(0.0, now - stats.last_event_at))
        yield from (events, published, relists, errors, malformed, requests, age, tracked)
        yield CounterMetricFamily(
            PREFIX + "owner_lookups", "ReplicaSet/Job reads", value=self._owners.lookups
        )
        yield CounterMetricFamily(
            PREFIX + "owner_lookup_failures",
            "ReplicaSet/Job reads that failed",
            value=self._owners.failures,
        )
        sent = CounterMetricFamily(PREFIX + "sent", "Messages acknowledged", labels=["topic"])
        dropped = CounterMetricFamily(
            PREFIX + "dropped", "Messages dropped from a full buffer", labels=["topic"]
        )
        lost = CounterMetricFamily(
            PREFIX + "lost",
            "Messages Kafka refused for good (too large, invalid)",
            labels=["topic"],
        )
        buffered = GaugeMetricFamily(
            PREFIX + "buffer_bytes", "Bytes waiting for Kafka", labels=["topic"]
        )
        for topic, publisher in sorted(self._publishers.items()):
            sent.add_metric([topic], publisher.stats.sent)
            dropped.add_metric([topic], publisher.outbox.dropped)
            lost.add_metric([topic], publisher.stats.failed)
            buffered.add_metric([topic], publisher.outbox.size_bytes)
        yield from (sent, dropped, lost, buffered)
