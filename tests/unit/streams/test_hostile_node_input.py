"""Hostile input on the node side: node events judged like samples, data dated ahead of the
wall clock or keyed by another node, dead letters that fit."""

from __future__ import annotations

import json

import msgspec
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

from schemas import ALERTS, GPU_WINDOWS, K8S_NODES, NVML_SAMPLES, NvmlSample
from schemas.deadletter import TOPIC as DEADLETTER
from schemas.ids import NodeName
from schemas.prices import BUILTIN_PRICES
from streams.core.integrals import PriceBook
from streams.core.sanity import check_node
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import MAX_LETTER_BYTES, Counters, Outputs, Record, Source

W0 = 1_764_399_960_000  # a window start (a multiple of 60 s)
WALL = W0 + 600 * S
PREFIX = "t."
YEAR = 365 * 86_400 * S
HOUR = 3_600 * S
SKEW = 300 * S  # GPUWATCH_MAX_CLOCK_SKEW_S's default
OTHER = NodeName("gpu-node-18")
SAMPLES = NVML_SAMPLES.full_name(PREFIX)


def node_event(**changes: object) -> bytes:
    event = {
        "schema": "gpuwatch.k8s.node/v1",
        "type": "MODIFIED",
        "node": NODE,
        "ts": W0 + 5 * S,
        "gpu_capacity": {"nvidia.com/gpu": 1},
        "gpu_allocatable": {"nvidia.com/gpu": 1},
        "gpu_product": None,
        "labels": {},
        "ready": True,
        "unschedulable": False,
    }
    return json.dumps(event | changes).encode()


def partition() -> tuple[NodePartition, Outputs, Counters]:
    config = NodeConfig(
        PREFIX,
        60 * S,
        10 * S,
        RULES,
        PriceBook(BUILTIN_PRICES),
        now_ms=lambda: WALL,
        max_clock_skew_ms=SKEW,
    )
    counters = Counters()
    return NodePartition(0, config, counters), Outputs(PREFIX, counters), counters


def letters(out: Outputs) -> list[str]:
    topic = DEADLETTER.full_name(PREFIX)
    return [DEADLETTER.decode(r.value).error for r in out.records if r.topic == topic]


def test_check_node_refuses_what_check_sample_refuses_in_ts() -> None:
    good = K8S_NODES.decode(node_event())
    assert check_node(good, WALL, SKEW) == []
    ahead = K8S_NODES.decode(node_event(ts=WALL + 10 * YEAR))
    assert check_node(ahead, WALL, SKEW) == [
        f"ts {WALL + 10 * YEAR} is 315360000 s ahead of the wall clock {WALL}, more than the "
        "clock skew allowed (300 s, GPUWATCH_MAX_CLOCK_SKEW_S)"
    ]
    assert check_node(K8S_NODES.decode(node_event(ts=WALL + SKEW)), WALL, SKEW) == []
    seconds = K8S_NODES.decode(node_event(ts=W0 // S, node=""))
    assert check_node(seconds, None, SKEW) == [
        "node is empty",
        f"ts {W0 // S} is before 2015 (seconds instead of milliseconds?)",
    ]


def test_a_node_event_years_ahead_is_dead_lettered_and_closes_no_window() -> None:
    part, out, counters = partition()
    for t in range(30):
        value = sample(W0 + t * S, [gpu(GPU_A, 50.0)], [alloc(POD_P, GPU_A)], seq=t)
        source = Source(NVML_SAMPLES.full_name(PREFIX), 0, t, NODE.encode())
        part.handle(source, NVML_SAMPLES.encode(value), out)
    nodes = Source(K8S_NODES.full_name(PREFIX), 0, 0, NODE.encode())
    for ts in (WALL + 10 * YEAR, W0 * S):  # ten years ahead; microseconds
        assert part.handle(nodes, node_event(ts=ts), out) is None
    assert part.stream_time == W0 + 29 * S  # the last sample's
    assert [r for r in out.records if r.topic == GPU_WINDOWS.full_name(PREFIX)] == []
    assert counters.deadletter == 2
    errors = letters(out)
    assert "ahead of the wall clock" in errors[0]
    assert "after 2100" in errors[1]


def two_nodes(seconds: int) -> list[NvmlSample]:
    """NODE (GPU A, pod P busy) and OTHER (GPU B, pod Q idle) sampled at 1 Hz from W0."""
    out = []
    for t in range(seconds):
        out.append(sample(W0 + t * S, [gpu(GPU_A, 80.0)], [alloc(POD_P, GPU_A)], seq=t))
        other = sample(W0 + t * S, [gpu(GPU_B, 0.0)], [alloc(POD_Q, GPU_B)], seq=t)
        out.append(msgspec.structs.replace(other, node=OTHER))
    return out


def run(
    bad: dict[int, tuple[bytes | None, NvmlSample]], seconds: int = 150
) -> tuple[NodePartition, list[Record], Counters, dict[int, int | None]]:
    """Two healthy nodes' samples, each keyed by its node, with `bad` (key, sample) sent
    after the message of that index: the partition, its records, counters, and its stream
    time just before and after each bad message."""
    part, out, counters = partition()
    seen: dict[int, int | None] = {}
    offset = 0
    for i, item in enumerate(two_nodes(seconds)):
        part.handle(Source(SAMPLES, 0, offset, item.node.encode()), NVML_SAMPLES.encode(item), out)
        offset += 1
        if i in bad:
            key, value = bad[i]
            before = part.stream_time
            assert (
                part.handle(Source(SAMPLES, 0, offset, key), NVML_SAMPLES.encode(value), out)
                is None
            )
            assert part.stream_time == before
            seen[i] = before
            offset += 1
    return part, out.take(), counters, seen


def healthy(records: list[Record]) -> list[tuple[str, bytes, bytes]]:
    """The records of the healthy nodes' data: all but the dead letters."""
    return [(r.topic, r.key, r.value) for r in records if r.topic != DEADLETTER.full_name(PREFIX)]


def test_a_sample_dated_past_the_clock_skew_is_dead_lettered_and_moves_no_stream_time() -> None:
    """A fourth node's one sample six hours ahead, and one of a known node an hour ahead:
    both dead-lettered; the other nodes' records are those of the run without them."""
    future = sample(WALL + 6 * HOUR, [gpu(GPU_A, 10.0)], [], seq=1)
    stranger = msgspec.structs.replace(future, node=NodeName("gpu-node-ahead"))
    known = sample(WALL + HOUR, [gpu(GPU_A, 80.0)], [alloc(POD_P, GPU_A)], seq=9_999)
    _, clean, clean_counters, _ = run({})
    part, records, counters, seen = run(
        {41: (b"gpu-node-ahead", stranger), 101: (NODE.encode(), known)}
    )
    assert seen == {41: W0 + 20 * S, 101: W0 + 50 * S}
    assert healthy(records) == healthy(clean)
    assert [r for r in records if r.topic == ALERTS.full_name(PREFIX)] == [
        r for r in clean if r.topic == ALERTS.full_name(PREFIX)
    ]
    windows = [GPU_WINDOWS.decode(r.value) for r in records if r.topic.endswith("gpu.windows")]
    # Closed by the healthy data alone, at 70 s and 130 s of their time.
    assert sorted({w.window_start for w in windows}) == [W0, W0 + 60 * S]
    assert not any(
        a.name == "NodeTelemetryMissing"
        for a in (ALERTS.decode(r.value) for r in records if r.topic.endswith("alerts"))
    )
    assert sorted(part.nodes) == [NODE, OTHER]  # the stranger left no state
    assert part.stream_time == W0 + 149 * S
    errors = letters_of(records)
    assert errors == [
        f"ts {WALL + 6 * HOUR} is 21600 s ahead of the wall clock {WALL}, more than the clock "
        "skew allowed (300 s, GPUWATCH_MAX_CLOCK_SKEW_S)",
        f"ts {WALL + HOUR} is 3600 s ahead of the wall clock {WALL}, more than the clock skew "
        "allowed (300 s, GPUWATCH_MAX_CLOCK_SKEW_S)",
    ]
    assert counters.dead_by == {(SAMPLES, "values"): 2}
    assert counters.late == clean_counters.late == 0
    # The known node's next samples are not taken for replays of the one refused.
    assert counters.duplicates == clean_counters.duplicates == 0


def test_a_sample_keyed_by_another_node_or_by_none_is_dead_lettered() -> None:
    """Keyed by OTHER, NODE's sample would be a second state of NODE on OTHER's partition;
    keyed by none, on any partition. Both are refused whole and change nothing."""
    # Taken, NODE's sample of 100 s would make its own samples of 31 s to 99 s replays.
    mine = sample(W0 + 100 * S, [gpu(GPU_A, 0.0)], [alloc(POD_P, GPU_A)], seq=100)
    newcomer = msgspec.structs.replace(mine, node=NodeName("gpu-node-new"))
    _, clean, _, _ = run({})
    part, records, counters, _ = run(
        {61: (OTHER.encode(), mine), 62: (None, mine), 90: (NODE.encode(), newcomer)}
    )
    assert healthy(records) == healthy(clean)
    assert sorted(part.nodes) == [NODE, OTHER]
    assert letters_of(records) == [
        f"key '{OTHER}' is not the value's node name '{NODE}'",
        f"no key: the key must be the value's node name '{NODE}'",
        f"key '{NODE}' is not the value's node name 'gpu-node-new'",
    ]
    assert counters.dead_by == {(SAMPLES, "key"): 3}
    letter = DEADLETTER.decode(next(r.value for r in records if r.topic.endswith("deadletter")))
    assert letter.key == OTHER  # the key it came with, for whoever looks into it


def test_a_node_event_keyed_by_another_node_is_dead_lettered() -> None:
    part, out, counters = partition()
    nodes = Source(K8S_NODES.full_name(PREFIX), 0, 0, OTHER.encode())
    assert part.handle(nodes, node_event(), out) is None
    assert letters(out) == [f"key '{OTHER}' is not the value's node name '{NODE}'"]
    assert part.meta.held == []  # not waiting for stream time either
    assert counters.dead_by == {(K8S_NODES.full_name(PREFIX), "key"): 1}
    good = Source(K8S_NODES.full_name(PREFIX), 0, 1, NODE.encode())
    assert part.handle(good, node_event(), out) == W0 + 5 * S
    assert counters.deadletter == 1


def letters_of(records: list[Record]) -> list[str]:
    topic = DEADLETTER.full_name(PREFIX)
    return [DEADLETTER.decode(r.value).error for r in records if r.topic == topic]


def impossible_sample(processes: int) -> bytes:
    """A sample whose every process uses more memory than its GPU has."""
    procs = [
        {"pid": i, "mem_bytes": 10**15, "sm_pct": None, "pod_uid": None, "container": None}
        for i in range(processes)
    ]
    value = json.loads(NVML_SAMPLES.encode(sample(W0, [gpu(GPU_A, 50.0)], [], seq=0)))
    value["gpus"][0]["processes"] = procs
    return json.dumps(value).encode()


def test_a_value_over_half_a_megabyte_is_refused_and_its_dead_letter_fits() -> None:
    part, out, counters = partition()
    raw = impossible_sample(10_200)
    assert 900_000 < len(raw) < 1_048_576  # what the broker takes
    part.handle(Source(NVML_SAMPLES.full_name(PREFIX), 0, 0, NODE.encode()), raw, out)
    (record,) = out.records
    assert len(record.value) <= MAX_LETTER_BYTES
    letter = DEADLETTER.decode(record.value)
    assert letter.error.startswith(f"value of {len(raw)} bytes is over the limit of 524288 bytes")
    assert letter.error.endswith(f"of {len(raw)} bytes)")  # raw cut, and said so
    assert raw.startswith(letter.raw_bytes())
    assert part.nodes == {}  # not decoded
    assert counters.deadletter == 1


def test_thousands_of_reasons_still_make_a_dead_letter_that_fits() -> None:
    part, out, _ = partition()
    raw = impossible_sample(5_000)
    assert 400_000 < len(raw) < 512 * 1024
    part.handle(Source(NVML_SAMPLES.full_name(PREFIX), 0, 0, NODE.encode()), raw, out)
    (record,) = out.records
    assert len(record.value) <= MAX_LETTER_BYTES
    letter = DEADLETTER.decode(record.value)
    assert letter.error.startswith(f"gpu {GPU_A}: pid 0 mem_bytes {10**15} > mem_total_bytes")
    assert "more characters)" in letter.error
    assert raw.startswith(letter.raw_bytes())


def test_a_record_too_large_for_kafka_is_dead_lettered_instead_of_sent() -> None:
    counters = Counters()
    observed: list[object] = []
    out = Outputs(PREFIX, counters, observe=observed.append)
    event = K8S_NODES.decode(node_event(labels={f"k{i}": "v" * 1000 for i in range(950)}))
    out.emit(K8S_NODES, event)  # any topic: here a node event of 960 kB
    (record,) = out.records
    assert record.topic == DEADLETTER.full_name(PREFIX)
    letter = DEADLETTER.decode(record.value)
    assert (letter.source_topic, letter.partition, letter.offset) == ("t.k8s.nodes", -1, -1)
    assert letter.error.startswith("record of ")
    assert "bytes is over the limit of 900000" in letter.error
    assert counters.dead_by == {("t.k8s.nodes", "internal"): 1}
    assert observed == [letter]  # the sinks see what Kafka gets
