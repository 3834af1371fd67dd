"""The pod side of a partition: the join by uid, the watermark of all node partitions, cleanup."""

from __future__ import annotations

from typing import Any

import pytest
from test_pod_fixtures import RULES, UID, WINDOWS, pod, usage

from schemas import ATTRIBUTION, K8S_PODS, POD_LIFECYCLE, POD_USAGE
from schemas.deadletter import TOPIC as DEADLETTER
from streams.core.ticks import Tick
from streams.processors.outputs import Counters, Outputs, Source
from streams.processors.pod import FINISHED_KEEP_MS, PodConfig, PodPartition

S = 1000
B = 1_764_399_960_000  # event time 0 of these tests: a window start
PREFIX = "t."
PODS, USAGE = K8S_PODS.full_name(PREFIX), POD_USAGE.full_name(PREFIX)
KEY = UID.encode()  # the pod events' key: the pod's uid


def part(counters: Counters, stored: Any = ()) -> PodPartition:
    return PodPartition(0, PodConfig(PREFIX, 2, RULES, WINDOWS), counters, stored)


def claims(**by_partition: int) -> Tick:
    return Tick(sender="w", claims={int(k[1:]): v for k, v in by_partition.items()})


def decoded(out: Outputs, spec: Any) -> list[Any]:
    name = spec.full_name(PREFIX)
    return [spec.decode(r.value) for r in out.records if r.topic == name]


def test_windows_close_at_the_lowest_node_side_stream_time() -> None:
    counters = Counters()
    p, out = part(counters), Outputs(PREFIX, counters)
    p.handle(
        Source(PODS, 0, 0, KEY), K8S_PODS.encode(pod("Running", ts=B, rv=1, created_at=B)), out
    )
    for i, start in enumerate(range(0, 60, 10)):
        value = POD_USAGE.encode(usage(B + start * S, B + (start + 10) * S))
        p.handle(Source(USAGE, 0, i, None), value, out)
    p.on_tick(claims(p0=B + 500 * S), out)  # partition 1 has not claimed: no watermark
    assert decoded(out, ATTRIBUTION) == []
    p.on_tick(claims(p1=B + 69 * S), out)  # min is 69 s: [0, 60) closes at 70 s
    assert decoded(out, ATTRIBUTION) == []
    p.on_tick(claims(p1=B + 70 * S), out)
    (record,) = decoded(out, ATTRIBUTION)
    assert (record.window_start, record.allocated_gpu_seconds) == (B, pytest.approx(60.0))
    assert [c.to_state for c in decoded(out, POD_LIFECYCLE)] == ["running"]
    assert counters.ticks == 3


def test_stored_states_come_back_and_a_replayed_event_changes_nothing() -> None:
    counters = Counters()
    p, out = part(counters), Outputs(PREFIX, counters)
    event = K8S_PODS.encode(pod("Running", ts=B, rv=1, created_at=B))
    p.handle(Source(PODS, 0, 0, KEY), event, out)
    # Held ahead of the watermark: nothing stored, the position stays at it.
    assert p.take_writes() == []
    assert p.resume_offsets() == {PODS: 0}
    p.on_tick(claims(p0=B + 10 * S, p1=B + 10 * S), out)
    assert p.resume_offsets() == {}
    stored = [(k, v) for k, v in p.take_writes() if v is not None]
    assert [k for k, _ in stored] == [UID.encode()]
    again, out2 = part(counters, stored), Outputs(PREFIX, counters)
    again.handle(Source(PODS, 0, 0, KEY), event, out2)  # read again after a restart
    again.handle(Source(PODS, 0, 0, KEY), event, out2)  # and redelivered while held
    assert counters.duplicates == 1
    again.on_tick(claims(p0=B + 10 * S, p1=B + 10 * S), out2)
    assert out2.records == []
    assert again.take_writes() == []


def test_a_finished_pod_is_forgotten_an_hour_of_event_time_after() -> None:
    counters = Counters()
    p, out = part(counters), Outputs(PREFIX, counters)
    p.handle(
        Source(PODS, 0, 0, KEY), K8S_PODS.encode(pod("Running", ts=B, rv=1, created_at=B)), out
    )
    p.handle(
        Source(PODS, 0, 1, KEY),
        K8S_PODS.encode(pod("Succeeded", ts=B + 10 * S, rv=2, created_at=B)),
        out,
    )
    p.take_writes()
    late = 10 * S  # the watermark is the usage frontier, the lateness behind the claims
    p.on_tick(claims(p0=B + 10 * S + FINISHED_KEEP_MS - 1 + late, p1=B + 10**10), out)
    assert UID in p.pods
    p.on_tick(claims(p0=B + 10 * S + FINISHED_KEEP_MS + late), out)
    assert UID not in p.pods
    assert p.take_writes() == [(UID.encode(), None)]


def test_a_pod_event_dated_past_the_clock_skew_or_keyed_by_another_uid_is_dead_lettered() -> None:
    """Neither is held for the watermark nor starts a pod; the pod's own events still do."""
    wall = B + 600 * S
    config = PodConfig(PREFIX, 1, RULES, WINDOWS, now_ms=lambda: wall, max_clock_skew_ms=300 * S)
    counters = Counters()
    p, out = PodPartition(0, config, counters), Outputs(PREFIX, counters)
    ahead = K8S_PODS.encode(pod("Running", ts=wall + 6 * 3_600 * S, rv=1, created_at=B))
    assert p.handle(Source(PODS, 0, 0, KEY), ahead, out) is None
    mine = K8S_PODS.encode(pod("Running", ts=B, rv=2, created_at=B))
    assert p.handle(Source(PODS, 0, 1, b"another-uid"), mine, out) is None
    assert p.handle(Source(PODS, 0, 2, None), mine, out) is None
    assert p.resume_offsets() == {}  # nothing held
    letters = [r.value for r in out.take() if r.topic == DEADLETTER.full_name(PREFIX)]
    assert [DEADLETTER.decode(raw).error for raw in letters] == [
        f"ts {wall + 6 * 3_600 * S} is 21600 s ahead of the wall clock {wall}, more than the "
        "clock skew allowed (300 s, GPUWATCH_MAX_CLOCK_SKEW_S)",
        f"key 'another-uid' is not the value's pod uid '{UID}'",
        f"no key: the key must be the value's pod uid '{UID}'",
    ]
    assert counters.dead_by == {(PODS, "values"): 1, (PODS, "key"): 2}
    at_limit = K8S_PODS.encode(pod("Running", ts=wall + 300 * S, rv=3, created_at=B))
    assert p.handle(Source(PODS, 0, 3, KEY), at_limit, out) == wall + 300 * S
    p.on_tick(claims(p0=wall + 400 * S), out)
    assert list(p.pods) == [UID]
    assert counters.deadletter == 3
