"""Two clusters through one worker: each cluster's records are its own and add up alone.

The same history twice in one set of topics: once as the default cluster (no field), once
as the cluster `east`, with the same node names, the same pod names and times, and pod
uids and GPU uuids of its own (as real clusters have). One worker works both off as a
backlog, `east` with an idle threshold of its own (`GPUWATCH_CLUSTER_RULES`). Every pod
of both clusters must add up to its samples, as the history alone does
(`test_worker_backlog.py` proves a cluster alone adds up), by its cluster's threshold;
and every derived record
of `east` names it, the default cluster's records name none, and no record of one names
a pod or GPU of the other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from backlog_runs import PARTITIONS, messages, mismatches, totals
from clusters import in_cluster, other_uid
from histories import History, long_history
from topic_io import NewScope, consume_all, topic_scopes
from worker_fixtures import Message, StartWorker, produce, wait_for

from schemas.attribution import TOPIC as ATTRIBUTION
from schemas.gpu_window import TOPIC as GPU_WINDOWS
from schemas.pod_lifecycle import TOPIC as POD_LIFECYCLE
from schemas.settings import Settings

pytestmark = pytest.mark.integration

EAST = "east"
EAST_IDLE_PCT = 90.0


@pytest.fixture
def scope(stack: Settings) -> Iterator[NewScope]:
    with topic_scopes(stack, partitions=PARTITIONS) as new:
        yield new


def both_clusters(settings: Settings, history: History) -> list[Message]:
    """The history's messages as the default cluster and as `east`, interleaved in time."""
    out: list[tuple[int, int, Message]] = []
    for message, item in zip(messages(settings, history), history.inputs(), strict=True):
        out.append((item.ts, 0, message))
        out.append((item.ts, 1, in_cluster(message, EAST)))
    out.sort(key=lambda row: (row[0], row[1]))
    return [message for _, _, message in out]


def test_two_clusters_with_the_same_names_add_up_each_on_its_own(
    scope: NewScope, start_worker: StartWorker
) -> None:
    t0 = (int(time.time() * 1000) - 4 * 3_600_000) // 60_000 * 60_000  # within retention
    history = long_history(t0, hours=3, nodes=4, gpus=4, interval_ms=57_000, seed=7)
    backlog = scope()
    produce(backlog, both_clusters(backlog, history))
    want = history.expected()
    # East runs by a threshold of its own: its GPUs read 0 or 80 %, all idle under 90 %.
    want_east = history.expected(idle_util_pct=EAST_IDLE_PCT)
    assert want_east != want
    want_both = want | {other_uid(uid): v for uid, v in want_east.items()}
    assert len(want_both) == 2 * len(want) > 20
    rules = json.dumps({EAST: {"idle_util_pct": EAST_IDLE_PCT}})
    worker = start_worker(backlog, env={"GPUWATCH_CLUSTER_RULES": rules})
    last: list[str] = []

    def added_up() -> bool:
        last[:] = mismatches(totals(backlog), want_both)
        return not last

    try:
        wait_for("both clusters' pods to add up to their samples", added_up, worker, 240)
    except BaseException as exc:
        raise AssertionError(f"{len(last)} pods do not add up: {last[:10]}") from exc
    worker.stop()
    assert worker.counters()["late"] == 0
    assert worker.counters()["deadletter"] == 0

    prefix = backlog.kafka.topic_prefix
    east_uids = {other_uid(uid) for uid in want}
    for spec in (ATTRIBUTION, POD_LIFECYCLE):
        named = {"default": 0, EAST: 0}
        for record in consume_all(backlog, spec.full_name(prefix)):
            value = json.loads(record.value)
            cluster = value.get("cluster", "default")
            named[cluster] += 1
            assert (value["uid"] in east_uids) == (cluster == EAST), value
        assert named["default"] > 0, spec.name
        assert named[EAST] > 0, spec.name
    windows = {"default": set(), EAST: set()}
    for record in consume_all(backlog, GPU_WINDOWS.full_name(prefix)):
        value = json.loads(record.value)
        windows[value.get("cluster", "default")].add((value["node"], value["window_start"]))
        assert value["uuid"].split("-", 1)[1].startswith("e") == (value.get("cluster") == EAST), (
            value
        )
    # The same node names, window for window: each cluster's GPUs are its own.
    assert windows["default"] == windows[EAST]
