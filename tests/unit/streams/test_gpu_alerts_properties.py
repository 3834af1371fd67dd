"""Properties of the GPU and node alert rules over generated sample streams and ticks."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gpu_alerts_fixtures import (
    GPU_A,
    GPU_B,
    POD_P,
    POD_Q,
    POD_R,
    RULES,
    T0,
    S,
    alloc,
    gpu,
    proc,
    sample,
)

from schemas.alert import Alert
from schemas.fields import Sharing
from schemas.ids import PodUid
from schemas.nvml_sample import NvmlSample
from streams.core.node.gpu_alerts import NodeAlertState, on_sample, on_watermark
from streams.core.split import split_gpu

BOUNDED = settings(max_examples=200, deadline=None)
IDLE_S, MISSING_S = 5, 10  # short thresholds: the streams are a minute long at most


@dataclass(frozen=True)
class Tick:
    """A stream-time tick of the worker."""

    watermark: int


Event = NvmlSample | Tick

step = st.tuples(
    st.sampled_from([0, 0, 0, 0, 1, 3, 12]),  # seconds lost before the sample
    st.sampled_from([None, 1.0, 1.0, 1.0, 50.0]),  # GPU A utilization
    st.booleans(),  # GPU A allocated to P
    st.sampled_from([False, False, True]),  # Q runs on A without holding it
    st.sampled_from([False, True]),  # a host process on B
    st.sampled_from([False, False, True]),  # R runs on B without holding it
    st.sampled_from([False] * 9 + [True]),  # the agent restarted: seq from 0
    st.sampled_from([None, None, 0, 5, 15]),  # a tick after the sample, this far ahead (s)
    st.sampled_from([1, 1, 2, 4, 8]),  # samples in a row with these readings
)


@st.composite
def streams(draw: st.DrawFn) -> list[Event]:
    """A node's samples in order, with lost ones, restarts and ticks between them."""
    events: list[Event] = []
    ts, seq, watermark = T0, 100, T0
    for lost, util, held, leak_a, host_b, leak_b, restart, tick, repeat in draw(
        st.lists(step, min_size=1, max_size=40)
    ):
        ts += lost * S
        seq = 0 if restart else seq + lost
        a = gpu(GPU_A, util, *([proc(7, POD_Q, sm=None)] if leak_a else []))
        b_procs = [proc(8, None)] * host_b + [proc(9, POD_R)] * leak_b
        b = gpu(GPU_B, 30.0, *b_procs)
        for _ in range(repeat):
            events.append(sample(ts, [a, b], [alloc(POD_P, GPU_A)] if held else [], seq=seq))
            ts, seq = ts + S, seq + 1
        if tick is not None:
            watermark = max(watermark, ts + tick * S)
            events.append(Tick(watermark))
    return events


Output = tuple[list[Alert], int]


def apply(state: NodeAlertState | None, event: Event) -> tuple[NodeAlertState | None, Output]:
    """One event: the next state, its alerts and missing seqs."""
    if isinstance(event, Tick):
        if state is None:
            return None, ([], 0)
        state, alerts = on_watermark(
            state, event.watermark, RULES, telemetry_missing_after_s=MISSING_S
        )
        return state, (alerts, 0)
    params = {"idle_alert_after_s": IDLE_S, "telemetry_missing_after_s": MISSING_S}
    state, alerts, lost = on_sample(state, event, RULES, **params)
    return state, (alerts, lost)


def process(
    events: list[Event], state: NodeAlertState | None = None, *, round_trip: bool = False
) -> tuple[NodeAlertState | None, list[Output]]:
    """Every event in order; with `round_trip` the state goes through JSON between steps."""
    outputs = []
    for event in events:
        if round_trip and state is not None:
            state = msgspec.json.decode(msgspec.json.encode(state), type=NodeAlertState)
        state, output = apply(state, event)
        outputs.append(output)
    return state, outputs


@BOUNDED
@given(streams())
def test_state_round_tripped_through_json_gives_identical_alerts(events: list[Event]) -> None:
    plain_state, plain = process(events)
    stored_state, stored = process(events, round_trip=True)
    assert stored == plain
    assert stored_state == plain_state
    assert process(events)[1] == plain  # processed twice from scratch: the same alerts


@BOUNDED
@given(streams(), st.data())
def test_replay_after_a_crash_repeats_no_alert(events: list[Event], data: st.DataObject) -> None:
    """State saved after event k, input re-read from event j <= k: the tail is as before."""
    k = data.draw(st.integers(0, len(events)), label="k")
    j = data.draw(st.integers(0, k), label="j")
    _, straight = process(events)
    saved, _ = process(events[:k], round_trip=True)
    _, replayed = process(events[j:k], saved, round_trip=True)
    assert all(alerts == [] and lost == 0 for alerts, lost in replayed)
    final, tail = process(events[k:], process(events[j:k], saved)[0], round_trip=True)
    assert tail == straight[k:]
    _, again = process(events, final)  # the whole stream once more: all of it is a replay
    assert all(alerts == [] for alerts, _ in again)


@BOUNDED
@given(streams())
def test_alerts_alternate_and_idle_fires_only_on_known_allocated_idle(events: list[Event]) -> None:
    _, outputs = process(events)
    alerts = [alert for out, _ in outputs for alert in out]
    by_fingerprint: dict[str, list[Alert]] = {}
    for alert in alerts:
        by_fingerprint.setdefault(alert.fingerprint, []).append(alert)
    for history in by_fingerprint.values():
        statuses = [alert.status for alert in history]
        assert statuses == ["firing", "resolved"] * (len(statuses) // 2) + ["firing"] * (
            len(statuses) % 2
        )
        for firing, resolved in zip(history[::2], history[1::2], strict=False):
            assert resolved.since == firing.since <= resolved.ts
    samples = [event for event in events if isinstance(event, NvmlSample)]
    for alert in alerts:
        assert alert.ts >= alert.since
        if alert.name == "GpuIdleAllocated" and alert.status == "firing":
            assert alert.subject.uuid == GPU_A  # B is never allocated
            assert alert.ts == alert.since + IDLE_S * S
            run = [s for s in samples if alert.since <= s.ts < alert.ts]
            assert run
            assert all(s.gpus[0].util_pct is not None and s.allocations for s in run)
        if alert.name == "GpuUnallocatedAccess":
            assert alert.labels["pod_uid"] in {POD_Q, POD_R}  # never P, never a host process


@BOUNDED
@given(
    st.sampled_from(["exclusive", "time-slicing", "mps"]),
    st.sampled_from([None, 0.0, 3.0, 4.99, 5.0, 60.0]),
    st.lists(
        st.tuples(
            st.sampled_from([POD_P, POD_Q, POD_R, None]),
            st.sampled_from([None, 0.0, 2.0, 30.0]),
        ),
        max_size=4,
    ),
    st.sets(st.sampled_from([POD_P, POD_Q])),
)
def test_idle_fires_exactly_when_split_says_every_holder_is_idle(
    sharing: Sharing,
    util: float | None,
    procs: list[tuple[PodUid | None, float | None]],
    holders: set[PodUid],
) -> None:
    """One sample with a 1 s threshold: the rule's shortcut agrees with split_gpu."""
    reading = gpu(
        GPU_A,
        util,
        *(proc(100 + i, pod, sm=sm) for i, (pod, sm) in enumerate(procs)),
        sharing=sharing,
    )
    held = sorted(holders)
    one = sample(T0, [reading], [alloc(uid, GPU_A) for uid in held])
    _, alerts, _ = on_sample(None, one, RULES, idle_alert_after_s=1)
    fired = any(alert.name == "GpuIdleAllocated" for alert in alerts)
    pods = split_gpu(reading, held, RULES.idle_util_pct).pods
    assert fired == (bool(held) and all(p.idle is True for p in pods if p.allocated_fraction))
