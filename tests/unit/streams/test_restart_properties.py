"""A crash at any point, even while the state is being written, changes no record.

The worker stores its state every few seconds, several keys to a partition's changelog,
the positions last; a crash while the producer sends them leaves any prefix of them
stored (SEMANTICS.md, Time). Generated histories (`test_backlog_properties.histories`)
run through the worker's stream logic live or as a backlog in either order, with a
crash at a random batch whose last state write is cut short at random in every
partition; the other worker reads again from the positions stored. Its records are the
ones of a run without a crash (some twice, always equal) and nothing more is late.
"""

from __future__ import annotations

import json
import random
from typing import Any

from histories import History, NodePlan, PodPlan, pod_uid
from hypothesis import example, given
from hypothesis import strategies as st
from pipeline_model import (
    ORDERS,
    SAMPLES,
    TICKS,
    Pipeline,
    run_live,
)
from test_backlog_properties import BOUNDED, IDLE_AFTER_MS, RULES, T0, WINDOWS, histories, run


def crashed(
    history: History, order: str, *, partitions: int, at: float, seed: int, every: int
) -> Pipeline:
    """The history read in `order` with a torn crash `at` a fraction of the way."""
    kw: dict[str, Any] = {"rules": RULES, "windows": WINDOWS, "idle_after_ms": IDLE_AFTER_MS}
    tear = random.Random(seed)
    inputs = history.inputs()
    if order == "live":
        cut = int(len(inputs) * at)
        return run_live(
            inputs, crash_at=cut, tear=tear, partitions=partitions, state_every=every, **kw
        )
    pipe = Pipeline(partitions=partitions, state_every=every, **kw)
    pipe.produce(inputs)
    batches = sum(len(p) for p in pipe.logs[SAMPLES]) // pipe.batch + 2
    cut, n = max(1, int(batches * at)), 0
    while (topic := pipe.step(ORDERS[order])) is not None:
        if topic != TICKS:
            n += 1
            if n % 5 == 0:
                pipe.tick()
            if n == cut:
                pipe.restart(tear)
    pipe.settle()
    pipe.close()
    return pipe


def distinct(records: dict[str, list[Any]]) -> dict[str, list[str]]:
    return {t: sorted({json.dumps(v, sort_keys=True) for v in vs}) for t, vs in records.items()}


def _two_nodes(interval_ms: int, duration_ms: int) -> History:
    """Two nodes of one GPU, each held by a pod from the start almost to the end."""
    nodes = tuple(NodePlan(f"gwprop-n{i}", 1, interval_ms, 0, ()) for i in range(2))
    pods = tuple(
        PodPlan(
            uid=pod_uid(7, i),
            node=f"gwprop-n{i}",
            gpu=0,
            created_ms=0,
            start_ms=0,
            end_ms=duration_ms - 1_000,
        )
        for i in range(2)
    )
    return History(T0, duration_ms, nodes, pods, ())


CRASHES = st.tuples(st.floats(0.05, 0.95), st.integers(0, 2**32), st.integers(1, 8))
"""Where the crash comes (a fraction of the way), what of the last write it leaves (a
seed) and how many batches go between two state writes."""


@BOUNDED
@given(
    histories(),
    st.sampled_from(["live", "samples first", "pod events first"]),
    st.integers(1, 3),
    CRASHES,
)
# One partition, both nodes' documents newer than the partition's stored stream time: it
# must not be taken from them, or the other node's samples read again are late.
@example(_two_nodes(1_000, 120_000), "samples first", 1, (0.6, 1, 4))
def test_a_crash_while_the_state_is_written_changes_no_record(
    history: History, order: str, partitions: int, crash: tuple[float, int, int]
) -> None:
    at, seed, every = crash
    reference = run(history, "live", partitions)
    pipe = crashed(history, order, partitions=partitions, at=at, seed=seed, every=every)
    assert pipe.counters.late == reference.counters.late
    assert distinct(pipe.records()) == distinct(reference.records())
