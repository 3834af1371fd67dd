"""What a sink uses of a Kafka consumer, given by the wiring: sinks import no Kafka client.

The wiring (gpuwatch/run/sink.py) passes kafka-python's consumer factory and errors as a
`KafkaClient`; the sinks' consumers (the Redis writer, the metrics feed) are written
against these protocols, and tested with fakes of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.settings import KafkaSettings

__all__ = ["Consumer", "ConsumerFactory", "ConsumerLoop", "KafkaClient", "Message"]

log = logging.getLogger(__name__)


class Message(Protocol):
    """A polled record (kafka-python's `ConsumerRecord`)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...


class Consumer(Protocol):
    """What a sink uses of a Kafka consumer (kafka-python's `KafkaConsumer`).

    Partitions are the client's own (kafka-python's `TopicPartition`: a named tuple of
    `topic` and `partition`), handed back to it as they came.
    """

    def partitions_for_topic(self, topic: str) -> set[int]: ...
    def subscribe(self, topics: list[str]) -> None: ...
    def poll(self, timeout_ms: int) -> Mapping[Any, Sequence[Message]]: ...
    def commit(self) -> None: ...
    def assignment(self) -> set[Any]: ...
    def position(self, tp: Any) -> int | None: ...
    def beginning_offsets(self, tps: list[Any]) -> Mapping[Any, int]: ...
    def end_offsets(self, tps: list[Any]) -> Mapping[Any, int]: ...
    def offsets_for_times(self, timestamps: Mapping[Any, int]) -> Mapping[Any, Any]: ...
    def committed(self, tp: Any) -> int | None: ...
    def seek(self, tp: Any, offset: int) -> None: ...
    def pause(self, *tps: Any) -> None: ...
    def paused(self) -> set[Any]: ...
    def resume(self, *tps: Any) -> None: ...
    def close(self) -> None: ...


class ConsumerFactory(Protocol):
    """Builds a consumer on the cluster of `kafka` (`gpuwatch.kafka.consumer`)."""

    def __call__(self, kafka: KafkaSettings, /, **options: Any) -> Consumer: ...


@dataclass(frozen=True)
class KafkaClient:
    """The Kafka client a sink is given: its consumer factory and its errors."""

    consumer: ConsumerFactory
    """Builds the sink's consumer from the Kafka settings and kafka-python's options."""
    error: type[Exception]
    """The base of the client's errors: the broker or the group away for a while (retried)."""
    commit_failed: type[Exception]
    """A commit the group refused: it went on without this consumer (counted, written again)."""
    rebalancing: type[Exception]
    """A commit asked for while the consumer rejoins its group: polls finish the rejoin."""


class ConsumerLoop:
    """A sink's consumer loop: subscribed to `topics`, `step` until `stopping()`.

    A subclass sets `name`, `topics` and `consumer_options()` and writes `step`. Kafka
    errors (the broker or the group away for a while) are counted and retried after
    `retry_s`; any other exception is a bug of ours: logged, kept in `error`, the end of
    the loop (the process exits 1).
    """

    name = "sink"
    retry_s = 0.5

    def __init__(self, kafka_settings: KafkaSettings, kafka: KafkaClient, topics: list[str]):
        self.topics = topics
        self._kafka_settings = kafka_settings
        self._kafka = kafka
        self._stop = threading.Event()
        self._assigned: set[Any] = set()
        self.kafka_errors = 0
        """Polls and commits Kafka refused (retried: a rebalance, the broker away)."""
        self.error: BaseException | None = None
        """What ended `run`, if it ended on an error."""
        self.renewed = 0
        """Consumers closed and made anew (`renew_consumer`)."""
        self._renew = False

    def consumer_options(self) -> dict[str, Any]:
        """kafka-python's options of this loop's consumer (group, commits, fetch sizes)."""
        raise NotImplementedError

    def step(self, consumer: Consumer) -> None:
        """One poll and what is done with it."""
        raise NotImplementedError

    def assignment_changes(self, consumer: Consumer) -> tuple[set[Any], set[Any]]:
        """The partitions assigned since the last call, and those gone since."""
        assigned = consumer.assignment()
        new, gone = assigned - self._assigned, self._assigned - assigned
        self._assigned = set(assigned)
        return new, gone

    @staticmethod
    def offset_at(consumer: Consumer, tp: Any, since_ms: int) -> int:
        """The first offset of `tp` with a record timestamp at or after `since_ms` (epoch
        ms); its end when none is that recent."""
        found = consumer.offsets_for_times({tp: since_ms}).get(tp)
        return int(found.offset) if found is not None else consumer.end_offsets([tp])[tp]

    def renew_consumer(self) -> None:
        """Close the consumer after the step in hand and make a new one, which joins the
        group afresh (one found stuck rejoining it); it reads on from the group's commits."""
        self._renew = True

    def stopping(self) -> None:
        """Ask `run` to return after the step in hand (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Subscribe, then `step` until `stopping()`; `error` says what ended it."""
        try:
            consumer = self._subscribed()
        except self._kafka.error as exc:
            self.error = exc
            log.error("%s cannot start: %r", self.name, exc)
            return
        try:
            while not self._stop.is_set():
                try:
                    if self._renew:  # asked for by the last step; tried again if it fails
                        consumer.close()  # closing a closed consumer does nothing
                        self._assigned = set()
                        consumer = self._subscribed()
                        self._renew = False
                        self.renewed += 1
                    self.step(consumer)
                except self._kafka.error as exc:  # the broker or the group, for a while
                    self.kafka_errors += 1
                    log.warning("%s: Kafka error, retrying: %r", self.name, exc)
                    self._stop.wait(self.retry_s)
        except Exception as exc:  # a bug of ours: said loudly; stream processing goes on
            self.error = exc
            log.exception("%s stopped", self.name)
        finally:
            consumer.close()

    def _subscribed(self) -> Consumer:
        """A new consumer, subscribed to the topics."""
        consumer = self._kafka.consumer(self._kafka_settings, **self.consumer_options())
        # The topics' metadata before joining the group. The first assignment is made from
        # what the client knows when it joins, and metadata that arrives during the join
        # counts as assigned: a topic unknown then stayed unassigned until the client's
        # next metadata change (minutes; the sink stood still).
        for topic in self.topics:
            consumer.partitions_for_topic(topic)
        consumer.subscribe(self.topics)
        return consumer
