"""The same history gives the same records in every order of arrival (SEMANTICS.md, Time).

Generated histories (several nodes on more partitions than nodes or fewer, sample intervals
from 0.1 s to 60 s, nodes that go silent, pods with gaps that start and finish at any time,
relists) run through the worker's stream logic (`pipeline_model`: agent loops, partitions,
ticks; no Faust, no Kafka) in three orders: produced in event-time order and read as it
comes (a live worker), every pod event read before any sample, and every sample (and the
usage made of it) before any pod event. Attribution, GPU windows, lifecycle and alerts
must be identical, nothing late, and the attribution must add up to the samples. Then the
watermark rule is broken on purpose, one way at a time, and the property must find a
history that tells.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from histories import History, NodePlan, PodPlan, pod_uid
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from pipeline_model import Pipeline, run_backlog, run_live

from schemas.settings import RuleSettings, WindowSettings
from streams.core import ticks
from streams.core.pod import pod_step
from streams.processors import pod

S = 1000
T0 = 1_764_400_000_000  # a multiple of every window length used here
WINDOWS = WindowSettings(window_s=10, allowed_lateness_s=2)
RULES = RuleSettings(stall_after_s=30, queued_alert_after_s=20, idle_alert_after_s=15)
IDLE_AFTER_MS = 20_000
INTERVALS_MS = (100, 500, 1_000, 5_000, 20_000, 60_000)
MAX_SAMPLES = 120  # per node: a history runs in well under a second per order


def _span(draw: Any, length: int) -> tuple[int, int]:
    a = draw(st.integers(0, max(length - 1, 0)))
    b = draw(st.integers(a + 1, length))
    return a, b


@st.composite
def histories(draw: Any, intervals: tuple[int, ...] = INTERVALS_MS) -> History:
    """A small cluster's history; times in whole 100 ms."""
    longest = min(900, MAX_SAMPLES * max(intervals) // S)
    duration = draw(st.integers(30, longest)) * S
    fine = [i for i in intervals if duration // i <= MAX_SAMPLES]
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        interval = draw(st.sampled_from(fine))
        silent: tuple[tuple[int, int], ...] = ()
        if draw(st.booleans()):
            a, b = _span(draw, duration // 100)
            silent = ((a * 100, b * 100),)
        phase = draw(st.integers(0, max(interval // 100 - 1, 0))) * 100
        nodes.append(NodePlan(f"gwprop-n{i}", draw(st.integers(1, 2)), interval, phase, silent))
    pods = []
    for n in range(draw(st.integers(1, 6))):
        node = draw(st.sampled_from(nodes))
        created = draw(st.integers(0, duration // 100)) * 100
        start = created + draw(st.integers(0, 300)) * 100
        end = start + draw(st.integers(1, duration // 100 + 50)) * 100
        window_ms = WINDOWS.window_s * S
        if draw(st.booleans()) and end - end % window_ms > start:
            end -= end % window_ms  # a finish on a window boundary
        idle: tuple[tuple[int, int], ...] = ()
        vanished: tuple[tuple[int, int], ...] = ()
        if draw(st.booleans()):
            a, b = _span(draw, (end - start) // 100)
            idle = ((start + a * 100, start + b * 100),)
        if draw(st.booleans()):
            a, b = _span(draw, (end - start) // 100)
            vanished = ((start + a * 100, start + b * 100),)
        pods.append(
            PodPlan(
                uid=pod_uid(7, n),
                node=node.name,
                gpu=draw(st.integers(0, node.gpus - 1)),
                created_ms=created,
                start_ms=start,
                end_ms=end,
                finish=draw(st.sampled_from(["Succeeded", "Failed", "Deleted"])),
                idle=idle,
                vanished=vanished,
                deleted_after_ms=draw(st.sampled_from([None, 0, 1_000, 30_000])),
                steps_per_s=draw(st.sampled_from([None, 10.0, 2.5])),
            )
        )
    relists = tuple(sorted(draw(st.lists(st.integers(1, duration // S), max_size=2))))
    return History(T0, duration, tuple(nodes), tuple(pods), tuple(r * S for r in relists))


def run(history: History, order: str, partitions: int) -> Pipeline:
    kw: dict[str, Any] = {
        "partitions": partitions,
        "rules": RULES,
        "windows": WINDOWS,
        "idle_after_ms": IDLE_AFTER_MS,
    }
    if order == "live":
        return run_live(history.inputs(), **kw)
    return run_backlog(history.inputs(), order, **kw)


ORDERS = ("live", "pod events first", "samples first")


def differences(history: History, partitions: int) -> list[str]:
    """What differs between the orders, or is late; empty when the property holds."""
    runs = {order: run(history, order, partitions) for order in ORDERS}
    base = runs["live"].records()
    out = []
    # Late input (left out, or revising a closed window) is counted alike in every order;
    # none at all where no sample is longer than the allowed lateness (a longer one can end
    # after windows it covers closed).
    can_be_late = max(n.interval_ms for n in history.nodes) > WINDOWS.allowed_lateness_s * S
    live = runs["live"].counters
    for order, pipe in runs.items():
        c = pipe.counters
        if (c.late, c.revisions) != (live.late, live.revisions) or (
            (c.late or c.revisions) and not can_be_late
        ):
            out.append(f"{order}: {c.late} late, {c.revisions} revisions")
        records = pipe.records()
        for topic in sorted(set(base) | set(records)):
            if base.get(topic, []) != records.get(topic, []):
                out.append(f"{order}: {topic} differs from live")
    return out


BOUNDED = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@BOUNDED
@given(histories(), st.integers(1, 5))
def test_every_order_of_arrival_gives_the_same_records(history: History, partitions: int) -> None:
    assert differences(history, partitions) == []


@BOUNDED
@given(histories(intervals=(100, 500, 1_000, 2_000)), st.integers(1, 5))
def test_attribution_adds_up_to_the_samples_of_the_windows_closed(
    history: History, partitions: int
) -> None:
    """Allocated and idle seconds of the closed windows equal the samples' in those windows,
    and so do the units of work: a scrape's counts in the window of its sample's start,
    where the sample lists the pod; each window's cost per unit is its cost over them.

    With samples no longer than the allowed lateness, so that nothing is late.
    """
    pipe = run(history, "pod events first", partitions)
    records = pipe.records()
    got: dict[str, list[float]] = {}
    closed: dict[str, set[int]] = {}
    steps: dict[str, float] = {}
    for a in records.get("attribution", []):
        totals = got.setdefault(a["uid"], [0.0, 0.0])
        totals[0] += a["allocated_gpu_seconds"]
        totals[1] += a["idle_gpu_seconds"]
        closed.setdefault(a["uid"], set()).add(a["window_start"])
        if "work_units" in a:
            done = a["work_units"]["steps"]
            steps[a["uid"]] = steps.get(a["uid"], 0.0) + done
            per_step = a["cost_per_unit"]["steps"]
            assert per_step == (pytest.approx(a["cost_usd"] / done) if done else None)
    window_ms = WINDOWS.window_s * S
    want: dict[str, list[float]] = {}
    want_steps: dict[str, float] = {}
    for sample in history.samples():
        held = {alloc["pod_uid"] for alloc in sample["allocations"]}
        for work in sample.get("work", ()):
            start = sample["ts"] - sample["ts"] % window_ms
            if work["pod_uid"] in held and start in closed.get(work["pod_uid"], set()):
                uid = work["pod_uid"]
                want_steps[uid] = want_steps.get(uid, 0.0) + work["units"]["steps"]
        util = {g["uuid"]: g["util_pct"] for g in sample["gpus"]}
        for alloc in sample["allocations"]:
            uid, ts, end = alloc["pod_uid"], sample["ts"], sample["ts"] + sample["interval_ms"]
            cut = ts
            while cut < end:  # the seconds of each closed window the sample covers
                start = cut - cut % window_ms
                stop = min(start + window_ms, end)
                if start in closed.get(uid, set()):
                    totals = want.setdefault(uid, [0.0, 0.0])
                    totals[0] += (stop - cut) / S
                    if util[alloc["device_ids"][0]] < RULES.idle_util_pct:
                        totals[1] += (stop - cut) / S
                cut = stop
    assert set(got) == set(want)
    assert steps == pytest.approx(want_steps, abs=1e-6)
    for uid, (allocated, idle) in want.items():
        assert got[uid][0] == pytest.approx(allocated, abs=1e-6)
        assert got[uid][1] == pytest.approx(idle, abs=1e-6)


# --- Mutations of the rule: each must make the property fail on some history -----------


@contextmanager
def mutated(name: str) -> Iterator[None]:
    """The watermark rule broken one way (undone afterwards)."""
    patch = pytest.MonkeyPatch()
    if name == "the highest claim instead of the lowest":
        original = ticks.SourceWatermarks.update

        def update(self: Any, claims: dict[int, int], idle: Any = ()) -> int | None:
            original(self, claims, idle)
            if len(self._claims) == self.partitions:
                high = self._frontier(max(self._claims.values()))
                self.value = high if self.value is None else max(self.value, high)
            return self.value  # type: ignore[no-any-return]

        patch.setattr(ticks.SourceWatermarks, "update", update)
    elif name == "inputs applied as they come":

        def apply_now(self: Any, source: Any, item: Any, out: Any) -> None:
            c = self.config
            uid = item.event.uid if item.event is not None else item.usage.uid
            before = self.pods.get(uid)
            if item.event is not None:
                after, outputs = pod_step.step_pod_event(before, item.event, c.rules, c.windows)
            else:
                after, outputs = pod_step.step_usage(before, item.usage, c.rules, c.windows)
            self.counters.late += outputs.late_usage
            self._store(before, after, outputs, out)

        patch.setattr(pod.PodPartition, "_input", apply_now)
    elif name == "pod events move the watermark":
        original_input = pod.PodPartition._input

        def moved(self: Any, source: Any, item: Any, out: Any) -> None:
            if item.event is not None and self.sources.value is not None:
                self.sources.value = max(self.sources.value, item.key)
            original_input(self, source, item, out)

        patch.setattr(pod.PodPartition, "_input", moved)
    else:
        raise AssertionError(name)
    try:
        yield
    finally:
        patch.undo()


MUTATIONS = [
    "the highest claim instead of the lowest",
    "inputs applied as they come",
    "pod events move the watermark",
]


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_broken_watermark_rule_is_caught(mutation: str) -> None:
    with mutated(mutation):
        found = find(
            st.tuples(histories(), st.integers(1, 5)),
            lambda case: bool(differences(*case)),
            settings=settings(
                max_examples=400,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                derandomize=True,
            ),
        )
    assert differences(*found) == []  # the same history holds with the rule as written
