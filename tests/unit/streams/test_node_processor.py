"""The node side of a partition: windows by stream time, replays after a restart, bad input."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec
import pytest
from test_gpu_alerts_fixtures import (
    GPU_A,
    GPU_B,
    NODE,
    POD_P,
    POD_Q,
    RULES,
    S,
    alloc,
    gpu,
    sample,
)

from schemas import ALERTS, GPU_WINDOWS, K8S_NODES, NVML_SAMPLES, POD_USAGE, DeadLetter, NvmlSample
from schemas.deadletter import TOPIC as DEADLETTER
from schemas.ids import NodeName
from schemas.nvml_sample import PodWork
from schemas.prices import BUILTIN_PRICES
from streams.core.integrals import PriceBook
from streams.core.ticks import Tick
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Source

W0 = 1_764_399_960_000  # a window start (a multiple of 60 s)
PREFIX = "t."
SAMPLES = NVML_SAMPLES.full_name(PREFIX)


def config() -> NodeConfig:
    return NodeConfig(PREFIX, 60 * S, 10 * S, RULES, PriceBook(BUILTIN_PRICES))


def samples(start_s: int, stop_s: int, util: float = 50.0) -> list[NvmlSample]:
    """One node, GPU A held by pod P at `util` %, GPU B unallocated, 1 s apart."""
    return [
        sample(W0 + t * S, [gpu(GPU_A, util), gpu(GPU_B, 0.0)], [alloc(POD_P, GPU_A)], seq=t)
        for t in range(start_s, stop_s)
    ]


def feed(part: NodePartition, items: list[NvmlSample], out: Outputs, offset: int = 0) -> None:
    """Each sample keyed by its node, as the agents key them."""
    for i, item in enumerate(items):
        source = Source(SAMPLES, 0, offset + i, item.node.encode())
        part.handle(source, NVML_SAMPLES.encode(item), out)


def decoded(out: Outputs, spec: Any) -> list[Any]:
    name = spec.full_name(PREFIX)
    return [spec.decode(r.value) for r in out.records if r.topic == name]


def test_windows_close_at_end_plus_lateness_with_the_hand_computed_numbers() -> None:
    part, out = NodePartition(0, config(), Counters()), Outputs(PREFIX, Counters())
    feed(part, samples(0, 69), out)
    assert decoded(out, GPU_WINDOWS) == []  # stream time t0 + 68 s: not yet
    feed(part, samples(69, 71), out)  # t0 + 70 s: [t0, t0 + 60 s) closes
    windows = {w.uuid: w for w in decoded(out, GPU_WINDOWS)}
    assert windows[GPU_A].util_mean_pct == pytest.approx(50.0)
    assert windows[GPU_A].allocated_seconds == pytest.approx(60.0)
    assert windows[GPU_B].unallocated_seconds == pytest.approx(60.0)
    usage = [u for u in decoded(out, POD_USAGE) if u.end_ts <= W0 + 60 * S]
    assert sum(g.used_gpu_seconds for u in usage for g in u.gpus) == pytest.approx(30.0)
    assert {r.key for r in out.records if r.topic == GPU_WINDOWS.full_name(PREFIX)} == {
        GPU_A.encode(),
        GPU_B.encode(),
    }


def test_a_restart_from_stored_state_replays_to_the_same_records() -> None:
    items = samples(0, 140)
    whole, out = NodePartition(0, config(), Counters()), Outputs(PREFIX, Counters())
    feed(whole, items, out)
    expected = [(r.topic, r.key, r.value) for r in out.records]

    # Crash after 50 samples with the state stored up to 40: 40..49 are processed again.
    table: dict[bytes, bytes] = {}
    first, out1 = NodePartition(0, config(), Counters()), Outputs(PREFIX, Counters())
    feed(first, items[:40], out1)
    table.update((k, v) for k, v in first.take_writes() if v is not None)
    feed(first, items[40:50], out1, offset=40)
    counters = Counters()
    second, out2 = NodePartition(0, config(), counters, table.items()), Outputs(PREFIX, counters)
    feed(second, items[30:], out2, offset=30)  # from an older commit: 30..39 are replays
    assert counters.duplicates == 10
    got = [(r.topic, r.key, r.value) for r in out1.records + out2.records]
    assert sorted(set(got)) == sorted(set(expected))  # the same records, some twice
    assert len(got) > len(expected)


def test_a_restart_from_a_state_write_cut_short_replays_to_the_same_records() -> None:
    """Two nodes of one partition; the crash stored the first one's newer document only."""
    other = NodeName("gpu-node-18")
    items: list[NvmlSample] = []
    for t in range(300):
        items.append(sample(W0 + t * S, [gpu(GPU_A, 50.0)], [alloc(POD_P, GPU_A)], seq=t))
        held_b = sample(W0 + t * S, [gpu(GPU_B, 30.0)], [alloc(POD_Q, GPU_B)], seq=t)
        items.append(msgspec.structs.replace(held_b, node=other))
    whole, out = NodePartition(0, config(), Counters()), Outputs(PREFIX, Counters())
    feed(whole, items, out)
    expected = {(r.topic, r.key, r.value) for r in out.records}

    table: dict[bytes, bytes] = {}
    first, out1 = NodePartition(0, config(), Counters()), Outputs(PREFIX, Counters())
    feed(first, items[:80], out1)
    table.update((k, v) for k, v in first.take_writes() if v is not None)
    table.update([first.checkpoint()])  # stored with the positions: 80
    feed(first, items[80:300], out1, offset=80)
    cut_short = first.take_writes()
    assert [k for k, _ in cut_short] == [NODE.encode(), other.encode()]
    table.update(cut_short[:1])  # the crash: one node's document newer than the positions
    counters = Counters()
    second, out2 = NodePartition(0, config(), counters, table.items()), Outputs(PREFIX, counters)
    feed(second, items[80:], out2, offset=80)
    assert counters.late == 0
    assert counters.duplicates == 110  # the first node's, up to its newer document
    got = {(r.topic, r.key, r.value) for r in out1.records + out2.records}
    assert got == expected


def test_bad_input_becomes_a_dead_letter_and_late_input_is_counted() -> None:
    counters = Counters()
    part, out = NodePartition(0, config(), counters), Outputs(PREFIX, counters)
    feed(part, samples(0, 75), out)
    part.handle(Source(SAMPLES, 0, 75, b"x"), b"{not json", out)
    absurd = NVML_SAMPLES.encode(samples(75, 76)[0]).replace(b'"power_w":100.0', b'"power_w":9e9')
    part.handle(Source(SAMPLES, 0, 76, b"x"), absurd, out)
    part.handle(Source(SAMPLES, 0, 77, b"x"), None, out)
    letters: list[DeadLetter] = decoded(out, DEADLETTER)
    assert [(d.offset, d.partition, d.key) for d in letters] == [(n, 0, "x") for n in (75, 76, 77)]
    assert "not JSON" in letters[0].error
    assert letters[1].error == (
        f"gpu {GPU_A}: power_w 9000000000.0 is above 5000 W; "
        f"gpu {GPU_B}: power_w 9000000000.0 is above 5000 W; "
        f"key 'x' is not the value's node name '{NODE}'"
    )  # every reason, the key's last
    assert letters[1].raw_bytes() == absurd
    assert "tombstone" in letters[2].error
    assert counters.deadletter == 3
    assert counters.dead_by == {
        (SAMPLES, "json"): 1,
        (SAMPLES, "values"): 1,
        (SAMPLES, "tombstone"): 1,
    }
    # A node first seen now, with data for the window the partition closed at t0 + 70 s.
    newcomer = msgspec.structs.replace(samples(5, 6)[0], node=NodeName("gpu-node-late"))
    feed(part, [newcomer], out, offset=78)
    assert counters.late == 1


def node_event(kind: str) -> bytes:
    """A `k8s.nodes` message of the test node."""
    event = {
        "schema": "gpuwatch.k8s.node/v1",
        "type": kind,
        "node": NODE,
        "ts": W0 + 100 * S,
        "gpu_capacity": {"nvidia.com/gpu": 2},
        "gpu_allocatable": {"nvidia.com/gpu": 2},
        "gpu_product": "NVIDIA-H100-80GB-HBM3",
        "labels": {"karpenter.sh/capacity-type": "spot"},
        "ready": True,
        "unschedulable": False,
    }
    return json.dumps(event).encode()


def test_a_tick_closes_a_silent_partitions_windows_and_a_deleted_node_goes() -> None:
    cfg = dataclasses.replace(config(), partitions=2)
    part, out = NodePartition(0, cfg, Counters()), Outputs(PREFIX, Counters())
    feed(part, samples(0, 30), out)
    # Partition 1 is 59 s past this one's last sample's end: not idle yet.
    part.on_tick(Tick(sender="w", claims={0: W0 + 29 * S, 1: W0 + 89 * S}), out)
    assert part.claim() == (W0 + 29 * S, False)
    assert decoded(out, GPU_WINDOWS) == []
    # 65 s past it (more than source_idle_after_s): idle, raised to partition 1's time.
    part.on_tick(Tick(sender="w", claims={1: W0 + 95 * S}), out)
    assert part.claim() == (W0 + 95 * S, True)
    assert {w.window_start for w in decoded(out, GPU_WINDOWS)} == {W0}
    missing = [a for a in decoded(out, ALERTS) if a.name == "NodeTelemetryMissing"]
    assert [(a.status, a.ts - W0) for a in missing] == [("firing", 60 * S)]  # 30 s + 30 s
    # Node events wait for stream time to reach them (100 s), then apply in order.
    nodes = Source(K8S_NODES.full_name(PREFIX), 0, 0, NODE.encode())
    part.handle(nodes, node_event("ADDED"), out)
    part.handle(nodes, node_event("DELETED"), out)
    assert [a for a in decoded(out, ALERTS) if a.status == "resolved"] == []
    part.on_tick(Tick(sender="w", claims={1: W0 + 101 * S}), out)
    resolved = [a for a in decoded(out, ALERTS) if a.status == "resolved"]
    assert [a.name for a in resolved] == ["NodeTelemetryMissing"]
    assert part.take_writes()[0] == (NODE.encode(), None)  # nothing left open: it goes
    assert NODE not in part.nodes


def test_data_after_a_week_long_gap_is_taken_and_only_the_wall_clock_bounds_the_future() -> None:
    week = 7 * 86_400 * S
    wall = W0 + week + 30 * S  # now: the node came back a week after its last sample
    cfg = NodeConfig(PREFIX, 60 * S, 10 * S, RULES, PriceBook(BUILTIN_PRICES), now_ms=lambda: wall)
    counters = Counters()
    part, out = NodePartition(0, cfg, counters), Outputs(PREFIX, counters)
    feed(part, samples(0, 5), out)
    back = [msgspec.structs.replace(s, ts=s.ts + week, seq=s.seq + 5) for s in samples(0, 5)]
    feed(part, back, out, offset=5)
    assert counters.deadletter == 0
    assert part.stream_time == W0 + week + 4 * S
    # A sample further ahead of the wall clock than the clock skew allowed (300 s) is
    # refused, and moves nothing; one at the limit is taken.
    future = msgspec.structs.replace(back[-1], ts=wall + 300 * S + 1, seq=10)
    feed(part, [future], out, offset=10)
    (letter,) = decoded(out, DEADLETTER)
    assert "300.001 s ahead of the wall clock" in letter.error
    assert part.stream_time == W0 + week + 4 * S
    at_limit = msgspec.structs.replace(back[-1], ts=wall + 300 * S, seq=11)
    feed(part, [at_limit], out, offset=11)
    assert counters.deadletter == 1
    assert part.stream_time == wall + 300 * S


def test_units_of_work_go_with_the_pods_usage_and_those_of_a_pod_without_any_are_counted() -> None:
    counters = Counters()
    part, out = NodePartition(0, config(), counters), Outputs(PREFIX, Counters())
    items = samples(0, 12)
    work = (
        PodWork(pod_uid=POD_P, units={"steps": 150.0}),
        PodWork(pod_uid=POD_Q, units={"steps": 40.0}),  # Q holds nothing in the samples
    )
    items[5] = msgspec.structs.replace(items[5], work=work)
    feed(part, items, out)
    usage = decoded(out, POD_USAGE)
    assert [u.units for u in usage if u.units] == [{"steps": 150.0}]
    assert counters.units_dropped == 1


def test_units_of_work_on_a_sample_sent_again_are_counted_once() -> None:
    """The agent's publisher sends again what Kafka did not acknowledge, through a fresh
    client, after what it had sent (a copy arriving after the original and its
    followers): the copy's units of work, like its usage, are the node's already."""
    items = samples(0, 12)
    work = (PodWork(pod_uid=POD_P, units={"steps": 150.0}),)
    items[5] = msgspec.structs.replace(items[5], work=work)
    once, out_once = NodePartition(0, config(), Counters()), Outputs(PREFIX, Counters())
    feed(once, items, out_once)
    counters = Counters()
    part, out = NodePartition(0, config(), counters), Outputs(PREFIX, counters)
    feed(part, items[:8], out)
    feed(part, items[4:8], out, offset=8)  # 4..7 again: unacknowledged, sent again
    feed(part, items[8:], out, offset=12)
    assert counters.duplicates == 4
    usage = decoded(out, POD_USAGE)
    assert [u.units for u in usage if u.units] == [{"steps": 150.0}]
    assert usage == decoded(out_once, POD_USAGE)
