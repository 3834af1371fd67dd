"""Data that comes late revises the windows it belongs to (SEMANTICS.md, Late data).

Generated histories run through the worker's stream logic (`pipeline_model`) twice: every
sample on time, and with some nodes' agents cut off from Kafka for a while, their samples
of that while held back and sent together when it ends (as the node agent's outbox sends
them), so that the windows they belong to closed without them. A consumer that keeps the
newest revision of each window record must end with the records of the on-time run: the
same identities and, up to the rounding of sums grouped otherwise, the same figures. Also
with a crash (a torn state write) in the late run, and in the backlog orders.
"""

from __future__ import annotations

import math
import random
from typing import Any

from histories import History, delayed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_model import Pipeline, run_backlog, run_live
from test_backlog_properties import IDLE_AFTER_MS, RULES, histories

from schemas.settings import WindowSettings

S = 1000
# Windows of 10 s, closed 2 s after their end; revisable for 5 minutes of stream time.
WINDOWS = WindowSettings(window_s=10, allowed_lateness_s=2, revision_horizon_s=300)
MAX_OUTAGE_MS = 200_000  # within the horizon, less the windows' length and lateness


def kw(partitions: int, history: History) -> dict[str, Any]:
    """The pipeline's settings; once everything is read, the input ends where the history
    does, so that both runs close every window of it (a run whose last input is late data
    would otherwise keep open what the other, ending on time, closed, or the other way
    round)."""
    return {
        "partitions": partitions,
        "rules": RULES,
        "windows": WINDOWS,
        "idle_after_ms": IDLE_AFTER_MS,
        # Past the history's end by a window: what late data opened closes too.
        "end_ms": history.t0 + history.duration_ms + WINDOWS.window_s * 1000,
    }


@st.composite
def outages(draw: Any, history: History) -> dict[bytes, tuple[int, int]]:
    """Some nodes cut off from Kafka over a span of the history (their samples held)."""
    out: dict[bytes, tuple[int, int]] = {}
    for node in history.nodes:
        if draw(st.booleans()):
            start = history.t0 + draw(st.integers(0, history.duration_ms // 100)) * 100
            length = draw(st.integers(1, MAX_OUTAGE_MS // 100)) * 100
            out[node.name.encode()] = (start, start + length)
    return out


def same(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two JSON values differ, floats compared up to rounding."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, int | float) and isinstance(b, int | float)
        if numbers and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6):
            return []
        return [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        keys = (set(a) | set(b)) - {"revision"}
        return [d for k in sorted(keys) for d in same(a.get(k), b.get(k), f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in same(x, y, where)]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


# What a pod's lifecycle decides in its records: the state at the window's end, and the end
# of the window that holds its finish.
LIFECYCLE_FIELDS = ("state", "ts", "window_end")


def lifecycles(run: Pipeline) -> dict[str, list[tuple[int, str]]]:
    """Each pod's transitions (time, state) as the run published them."""
    out: dict[str, list[tuple[int, str]]] = {}
    for record in sorted(run.records().get("pod.lifecycle", []), key=lambda r: r["ts"]):
        out.setdefault(record["uid"], []).append((record["ts"], record["to_state"]))
    return out


def differences(on_time: Pipeline, late: Pipeline) -> list[str]:
    """How the newest revisions of the late run differ from the on-time run's records.

    Lifecycle transitions are not revised: where the late usage changed what a pod's
    lifecycle saw (an idle spell that would have stalled it before the finish event came),
    its records' state and the end of its finish window follow the lifecycle it had, and
    only those fields may differ; every figure must still be equal."""
    want, got = on_time.newest(), late.newest()
    moved = {
        uid for uid, changes in lifecycles(on_time).items() if lifecycles(late).get(uid) != changes
    }
    out = []
    for topic in ("attribution", "gpu.windows"):
        w, g = want.get(topic, {}), got.get(topic, {})
        if set(w) != set(g):
            out.append(f"{topic}: missing {sorted(set(w) - set(g))[:3]}")
            out.append(f"{topic}: extra {sorted(set(g) - set(w))[:3]}")
        for identity in sorted(set(w) & set(g)):
            a, b = w[identity], g[identity]
            if topic == "attribution" and identity[0] in moved:
                a = {k: v for k, v in a.items() if k not in LIFECYCLE_FIELDS}
                b = {k: v for k, v in b.items() if k not in LIFECYCLE_FIELDS}
            out += [f"{topic} {identity}{d}" for d in same(a, b)[:3]]
    if late.counters.late:
        out.append(f"{late.counters.late} late")
    return out


BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@BOUNDED
@given(st.data(), histories(intervals=(100, 500, 1_000, 2_000)), st.integers(1, 4))
def test_late_samples_revise_their_windows_to_the_on_time_records(
    data: st.DataObject, history: History, partitions: int
) -> None:
    cut_off = data.draw(outages(history))
    inputs = history.inputs()
    on_time = run_live(inputs, **kw(partitions, history))
    late = run_live(delayed(inputs, cut_off), **kw(partitions, history))
    assert differences(on_time, late) == []
    if not cut_off:
        assert late.counters.revisions == 0  # nothing comes late, nothing is revised


@BOUNDED
@given(
    st.data(),
    histories(intervals=(100, 500, 1_000, 2_000)),
    st.integers(1, 4),
    st.integers(0, 2**32 - 1),
)
def test_a_crash_while_late_data_comes_changes_nothing_in_the_newest_revisions(
    data: st.DataObject, history: History, partitions: int, seed: int
) -> None:
    cut_off = data.draw(outages(history))
    inputs = delayed(history.inputs(), cut_off)
    on_time = run_live(history.inputs(), **kw(partitions, history))
    crash_at = data.draw(st.integers(0, len(inputs) - 1))
    crashed = run_live(
        inputs,
        crash_at=crash_at,
        tear=random.Random(seed),
        state_every=3,
        **kw(partitions, history),
    )
    assert differences(on_time, crashed) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), histories(intervals=(100, 500, 1_000, 2_000)), st.integers(1, 4))
def test_a_backlog_with_late_data_in_it_ends_with_the_on_time_records(
    data: st.DataObject, history: History, partitions: int
) -> None:
    """Produced whole, late samples last in their topic as the outbox sent them: read in
    each backlog order, the newest revisions are the on-time records."""
    cut_off = data.draw(outages(history))
    on_time = run_live(history.inputs(), **kw(partitions, history))
    for order in ("pod events first", "samples first"):
        backlog = run_backlog(delayed(history.inputs(), cut_off), order, **kw(partitions, history))
        assert differences(on_time, backlog) == [], order


def test_a_node_cut_off_for_two_minutes_keeps_every_second_of_its_usage() -> None:
    """The example of the issue, by hand: two nodes of one partition, each with a pod at
    50 % on its GPU; one node's agent cut off for 120 s, its samples sent together after."""
    from histories import NodePlan, PodPlan, pod_uid

    t0 = 1_764_399_960_000  # a window start
    nodes = (NodePlan("gwlate-a", 1, 1_000, 0, ()), NodePlan("gwlate-b", 1, 1_000, 0, ()))
    pods = tuple(
        PodPlan(
            uid=pod_uid(3, i),
            node=node.name,
            gpu=0,
            created_ms=0,
            start_ms=0,
            end_ms=200_000,
            finish="Succeeded",
            idle=(),
            vanished=(),
            deleted_after_ms=None,
            steps_per_s=None,
        )
        for i, node in enumerate(nodes)
    )
    history = History(t0, 250_000, nodes, pods, ())
    windows = WindowSettings(window_s=60, allowed_lateness_s=10)  # the defaults: an hour
    args = {"partitions": 1, "rules": RULES, "windows": windows, "idle_after_ms": 60_000}
    on_time = run_live(history.inputs(), **args)
    outage = {b"gwlate-b": (t0 + 30_000, t0 + 150_000)}
    late = run_live(delayed(history.inputs(), outage), **args)
    assert (late.counters.late, on_time.counters.revisions) == (0, 0)
    assert late.counters.revisions > 0
    assert differences(on_time, late) == []
    # What was kept for revision is forgotten once the data has passed it.
    node_side = [
        n.windows.revisable for p in late.node.partitions.values() for n in p.nodes.values()
    ]
    pod_side = [state.revisable for p in late.pod.partitions.values() for state in p.pods.values()]
    assert not any(node_side)
    assert not any(pod_side)
    seconds = {
        (r["uid"], r["window_start"] - t0): r["allocated_gpu_seconds"]
        for r in late.newest()["attribution"].values()
    }
    for pod in pods:
        got = [seconds.get((pod.uid, start)) for start in (0, 60_000, 120_000, 180_000)]
        assert got == [60.0, 60.0, 60.0, 20.0], pod.node
    gpu_seconds = sorted(
        (w["node"], w["window_start"] - t0, w["allocated_seconds"])
        for w in late.newest()["gpu.windows"].values()
    )
    assert [s for node, _, s in gpu_seconds if node == "gwlate-b"][:3] == [60.0, 60.0, 60.0]
