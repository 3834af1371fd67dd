"""Properties of the pod processor over generated histories of pod events, usage and ticks."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pod_fixtures import GPU_A, GPU_B, RULES, WINDOWS, container, gpu, pod, usage

from schemas.k8s_pod import K8sPod
from schemas.pod_usage import PodUsage
from schemas.settings import WindowSettings
from streams.core.pod import lifecycle
from streams.core.pod.pod_state import PodState, decode, encode
from streams.core.pod.pod_step import PodOutputs, step_pod_event, step_usage, step_watermark

S = 1000
BOUNDED = settings(max_examples=150, deadline=None)  # a few seconds per property
UNREADY = [{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": None}]
GATED = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": None}]
NO_FIT = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4"}]
EVICTED = [
    {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "TerminationByKubelet",
        "message": None,
    }
]

# Kind of pod event -> (phase, containers, conditions, watch type); None: the builder's default.
KINDS: dict[str, tuple[str, Any, Any, str]] = {
    "unschedulable": ("Pending", [], NO_FIT, "MODIFIED"),
    "gated": ("Pending", [], GATED, "MODIFIED"),
    "creating": ("Pending", None, None, "MODIFIED"),
    "pulling": ("Pending", [container("waiting", "ImagePullBackOff")], None, "MODIFIED"),
    "running": ("Running", None, None, "MODIFIED"),
    "resync": ("Running", None, None, "RESYNC"),
    "unready": ("Running", [container("running", restarts=1)], UNREADY, "MODIFIED"),
    "crashloop": (
        "Running",
        [container("waiting", "CrashLoopBackOff", restarts=2)],
        UNREADY,
        "MODIFIED",
    ),
    "unknown": ("Unknown", [], None, "MODIFIED"),
    "succeeded": ("Succeeded", None, None, "MODIFIED"),
    "oom": ("Failed", [container("terminated", "OOMKilled", exit_code=137)], None, "MODIFIED"),
    "evicted": ("Failed", [container("terminated", "Error", exit_code=137)], EVICTED, "MODIFIED"),
    "deleted": ("Running", None, None, "DELETED"),
}


@dataclass(frozen=True)
class Tick:
    """A stream-time tick of the partition."""

    now_ms: int


Input = K8sPod | PodUsage | Tick


@st.composite
def histories(draw: st.DrawFn, *, backwards: bool = False) -> list[Input]:
    """A pod's inputs in arrival order: pod events (rising versions), contiguous usage, ticks.

    With `backwards`, pod events may carry times earlier than the one before (a clock
    going back) while their versions still rise.
    """
    now, rv, until, idle_since = 1_000 * S, 1, 1_000 * S, None
    created = now - draw(st.integers(0, 100)) * S
    out: list[Input] = []
    for _ in range(draw(st.integers(1, 25))):
        what = draw(st.sampled_from(["pod", "pod", "usage", "usage", "tick"]))
        now += draw(st.integers(0, 400)) * S
        if what == "pod":
            phase, containers, conditions, type_ = KINDS[draw(st.sampled_from(sorted(KINDS)))]
            ts = now - (draw(st.integers(0, 200)) * S if backwards else 0)
            out.append(
                pod(
                    phase,
                    ts=max(ts, 0),
                    rv=rv,
                    type_=type_,
                    created_at=created,
                    containers=containers,
                    conditions=conditions,
                )
            )
            rv += draw(st.integers(1, 3))
        elif what == "usage":
            end = max(until, now) + draw(st.integers(1, 120)) * S
            idle = draw(st.sampled_from(["active", "idle", "still"]))
            idle_since = (
                None
                if idle == "active"
                else until
                if idle == "idle" or idle_since is None
                else idle_since
            )
            out.append(usage(until, end, idle_since=idle_since))
            until = now = end
        else:
            out.append(Tick(now))
    return out


def steps(
    inputs: list[Input], windows: WindowSettings = WINDOWS, *, stored: bool = False
) -> Iterator[tuple[PodState, PodOutputs]]:
    """The state and outputs after each input in order, a tick before any state skipped
    (through JSON between steps if `stored`)."""
    state: PodState | None = None
    for item in inputs:
        if isinstance(item, Tick):
            if state is None:
                continue
            state, out = step_watermark(state, item.now_ms, RULES, windows)
        elif isinstance(item, PodUsage):
            state, out = step_usage(state, item, RULES, windows)
        else:
            state, out = step_pod_event(state, item, RULES, windows)
        if stored:
            assert decode(encode(state)) == state
            state = PodState.from_dict(state.to_dict())
        yield state, out


def run(
    inputs: list[Input], windows: WindowSettings = WINDOWS, *, stored: bool = False
) -> PodOutputs:
    """Every output of feeding the inputs in order (through JSON between steps if `stored`)."""
    total = PodOutputs([], [], [], 0)
    for _, out in steps(inputs, windows, stored=stored):
        total = PodOutputs(
            total.lifecycle + out.lifecycle,
            total.attributions + out.attributions,
            total.alerts + out.alerts,
            total.late_usage + out.late_usage,
        )
    return total


@BOUNDED
@given(histories())
def test_the_same_input_twice_gives_the_same_output_once(inputs: list[Input]) -> None:
    once = run(inputs)
    assert run(inputs) == once
    assert run([item for item in inputs for _ in (0, 1)]) == once


@BOUNDED
@given(histories(), st.data())
def test_duplicated_and_stale_pod_events_change_no_transition(
    inputs: list[Input], data: st.DataObject
) -> None:
    events = [item for item in inputs if isinstance(item, K8sPod)]
    state: PodState | None = None
    expected = []
    for event in events:
        state, out = lifecycle.on_pod_event(state, event, RULES)
        expected += out
    # Order-preserving duplication: each event one to three times, plus old ones re-sent later.
    noisy: list[K8sPod] = []
    for i, event in enumerate(events):
        noisy += [event] * data.draw(st.integers(1, 3))
        if i and data.draw(st.booleans()):
            noisy.append(events[data.draw(st.integers(0, i - 1))])
    state, got = None, []
    for event in noisy:
        state, out = lifecycle.on_pod_event(state, event, RULES)
        got += out
    assert got == expected


@BOUNDED
@given(histories(backwards=True))
def test_state_times_are_never_negative_and_never_exceed_the_lifetime(inputs: list[Input]) -> None:
    records = run(inputs).lifecycle
    if not records:
        return
    first = records[0]
    born = min(first.ts, *(i.created_at for i in inputs if isinstance(i, K8sPod)))
    latest = max(
        i.now_ms if isinstance(i, Tick) else i.end_ts if isinstance(i, PodUsage) else i.ts
        for i in inputs
    )
    for before, record in itertools.pairwise(records):
        assert record.ts >= before.ts
    for record in records:
        spent = (record.queued_ms, record.running_ms, record.stalled_ms)
        assert min(spent) >= 0
        assert sum(spent) == record.ts - first.ts <= latest - born


@BOUNDED
@given(histories())
def test_stored_state_round_trips_between_steps(inputs: list[Input]) -> None:
    assert run(inputs, stored=True) == run(inputs)


@st.composite
def usage_streams(draw: st.DrawFn) -> list[PodUsage]:
    """Contiguous usage of a running pod on one or two GPUs, with arbitrary values."""
    start = draw(st.integers(0, 10_000)) * 100
    out = []
    for _ in range(draw(st.integers(1, 12))):
        end = start + draw(st.integers(1, 300_000))
        seconds = (end - start) / 1000
        gpus = tuple(
            gpu(
                uuid,
                seconds=seconds,
                cost_usd=draw(st.floats(0, 5)),
                used_gpu_seconds=draw(st.floats(0, seconds)),
            )
            for uuid in draw(st.sampled_from([(GPU_A,), (GPU_A, GPU_B)]))
        )
        out.append(usage(start, end, gpus=gpus))
        start = end + draw(st.sampled_from([0, 0, 0, 5_000]))  # now and then a gap
    return out


def halves(item: PodUsage, cut: int) -> list[PodUsage]:
    """A usage cut in two at `cut`, each part with its share of every integral."""
    if not item.ts < cut < item.end_ts:
        return [item]
    share = (cut - item.ts) / (item.end_ts - item.ts)
    parts = []
    for start, end, f in ((item.ts, cut, share), (cut, item.end_ts, 1 - share)):
        gpus = tuple(
            msgspec.structs.replace(
                g,
                allocated_seconds=g.allocated_seconds * f,
                used_gpu_seconds=g.used_gpu_seconds * f,
                idle_seconds=g.idle_seconds * f,
                vram_byte_seconds=g.vram_byte_seconds * f,
                energy_joules=g.energy_joules * f,
                cost_usd=g.cost_usd * f,
                waste_usd=g.waste_usd * f,
            )
            for g in item.gpus
        )
        parts.append(msgspec.structs.replace(item, ts=start, end_ts=end, gpus=gpus))
    return parts


TOTALS = (
    "allocated_gpu_seconds",
    "used_gpu_seconds",
    "idle_gpu_seconds",
    "vram_byte_seconds",
    "energy_joules",
    "cost_usd",
    "waste_usd",
)


def totals(stream: list[PodUsage], windows: WindowSettings) -> dict[str, float]:
    """Sums over every record of the stream's windows, once all are closed."""
    inputs: list[Input] = [pod("Running", ts=0, rv=1), *stream, Tick(10**12)]
    out = run(inputs, windows)
    assert out.late_usage == 0
    for record in out.attributions:
        assert record.cost_usd == pytest.approx(math.fsum(g.cost_usd for g in record.gpus))
        assert record.window_end - record.window_start == windows.window_s * 1000
    return {name: math.fsum(getattr(r, name) for r in out.attributions) for name in TOTALS}


@BOUNDED
@given(usage_streams(), st.sampled_from([1, 7, 60, 3600]), st.data())
def test_splitting_windows_or_usage_does_not_change_totals(
    stream: list[PodUsage], window_s: int, data: st.DataObject
) -> None:
    expected = {
        "allocated_gpu_seconds": math.fsum(g.allocated_seconds for u in stream for g in u.gpus),
        "cost_usd": math.fsum(g.cost_usd for u in stream for g in u.gpus),
    }
    cuts = [data.draw(st.integers(u.ts, u.end_ts)) for u in stream]
    split = [part for u, cut in zip(stream, cuts, strict=True) for part in halves(u, cut)]
    base = totals(stream, WINDOWS)
    for other in (totals(stream, WindowSettings(window_s=window_s)), totals(split, WINDOWS)):
        assert other == pytest.approx(base, rel=1e-9, abs=1e-9)
    for name, value in expected.items():
        assert base[name] == pytest.approx(value, rel=1e-9, abs=1e-9)
