"""Reads back what `k8s.pods` / `k8s.nodes` / `k8s.workloads` hold, for a restarted watcher
(producers.k8s.recall).

How far back, bounded: the watcher re-sends every live object on its first list and every
`full_resync_s` after (a 410's relist does not restart that period), and the periodic one is
due at the latest one watch request (`watch_timeout_s`) late. So every object live when the
watcher last wrote has a record written within `full_resync_s + watch_timeout_s` before the
newest record of its cluster; `READBACK_SLACK_S` covers a slow list and a late flush. The
topic is read from that point to its end (its end offsets when the read began), not over
its whole retention: at a full resync every six hours that is about one resync's worth of
records and the changes since, whatever the retention.

Topics can be shared by clusters, so the anchor is this cluster's newest record: the read
starts a window before the topic's newest record; when this cluster's newest record is
older than that window allows (its watcher was down while others wrote), the part before
is read too, and when the window holds none of this cluster's records, the rest of the
topic (what retention kept). With no periodic resync (`full_resync_s` None) the whole
topic is read. Records read, keys found and seconds taken are logged.
"""

from __future__ import annotations

import logging
import time
from typing import TypeVar

import msgspec

from gpuwatch.kafka import KafkaError
from gpuwatch.replay.read import Progress, RangeReader, ReadError
from gpuwatch.timerange import TimeRange
from producers.k8s.recall import Recall, RecallFailed
from schemas.codec import TopicSpec
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.k8s_workload import K8sWorkload
from schemas.settings import KafkaSettings

__all__ = ["READBACK_SLACK_S", "read_back", "recall_of", "window_ms"]

log = logging.getLogger(__name__)

V = TypeVar("V", K8sPod, K8sNode, K8sWorkload)

READBACK_SLACK_S = 3600.0  # a paginated list of a large cluster and its flush take minutes
END_MS = 2**62  # no end: read to the end offsets


def window_ms(full_resync_s: float | None, watch_timeout_s: float) -> int | None:
    """How far before this cluster's newest record a read-back starts; None: everything."""
    if full_resync_s is None:
        return None
    return int((full_resync_s + watch_timeout_s + READBACK_SLACK_S) * 1000)


def _read(
    reader: RangeReader, topic: str, spec: TopicSpec[V], cluster: str, span: TimeRange
) -> tuple[list[V], int | None, int]:
    """The values of the records written in `span` (in order per partition), when this
    cluster's newest of them was written, and how many records were read."""
    plan = reader.plan([topic], span)
    values: list[V] = []
    ours: int | None = None
    for hit in reader.read(plan, [topic], span, 0):
        try:
            value = spec.decode(hit.value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # not the watcher's: the deadletter's business downstream
        values.append(value)
        if value.cluster == cluster:
            ours = hit.written_ms if ours is None else max(ours, hit.written_ms)
    return values, ours, plan.scanned.get(topic, 0)


def read_back(
    kafka: KafkaSettings, spec: TopicSpec[V], cluster: str, window: int | None
) -> list[V]:
    """The values of `spec`'s topic a restarted watcher compares its first list with.

    Raises RecallFailed when Kafka cannot be read.
    """
    topic = spec.full_name(kafka.topic_prefix)
    began = time.monotonic()
    try:
        with RangeReader(
            kafka, Progress(verb="k8s-watcher read-back"), client_id="gpuwatch-k8s-readback"
        ) as reader:
            newest = reader.newest_write_ms(topic)
            if newest is None:
                log.info("read back topic=%s records=0 (empty)", topic)
                return []
            start = 0 if window is None else max(0, newest - window)
            values, ours, records = _read(reader, topic, spec, cluster, TimeRange(start, END_MS))
            if window is not None and start > 0:
                earlier = 0 if ours is None else max(0, ours - window)
                if earlier < start:
                    older, _, more = _read(reader, topic, spec, cluster, TimeRange(earlier, start))
                    values, records, start = older + values, records + more, earlier
    except (ReadError, KafkaError) as exc:
        raise RecallFailed(f"cannot read back {topic}: {exc}") from exc
    log.info(
        "read back topic=%s since_ms=%d newest_ms=%d records=%d values=%d seconds=%.2f",
        topic,
        start,
        newest,
        records,
        len(values),
        time.monotonic() - began,
    )
    return values


def recall_of(
    kafka: KafkaSettings, spec: TopicSpec[V], cluster: str, window: int | None
) -> Recall[V]:
    """The read-back of one topic for the watches that publish to it, done on first use
    (`producers.k8s.recall.Recall` over `read_back`)."""
    return Recall(lambda: read_back(kafka, spec, cluster, window), spec.key_of, cluster)
