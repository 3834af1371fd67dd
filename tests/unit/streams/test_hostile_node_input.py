"""Hostile input on the node side: node events judged like samples, dead letters that fit."""

from __future__ import annotations

import json

from test_gpu_alerts_fixtures import GPU_A, NODE, POD_P, RULES, S, alloc, gpu, sample

from schemas import GPU_WINDOWS, K8S_NODES, NVML_SAMPLES
from schemas.deadletter import TOPIC as DEADLETTER
from schemas.prices import BUILTIN_PRICES
from streams.core.integrals import PriceBook
from streams.core.sanity import check_node
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import MAX_LETTER_BYTES, Counters, Outputs, Source

W0 = 1_764_399_960_000  # a window start (a multiple of 60 s)
WALL = W0 + 600 * S
PREFIX = "t."
YEAR = 365 * 86_400 * S


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
        PREFIX, 60 * S, 10 * S, RULES, PriceBook(BUILTIN_PRICES), now_ms=lambda: WALL
    )
    counters = Counters()
    return NodePartition(0, config, counters), Outputs(PREFIX, counters), counters


def letters(out: Outputs) -> list[str]:
    topic = DEADLETTER.full_name(PREFIX)
    return [DEADLETTER.decode(r.value).error for r in out.records if r.topic == topic]


def test_check_node_refuses_what_check_sample_refuses_in_ts() -> None:
    good = K8S_NODES.decode(node_event())
    assert check_node(good, WALL) == []
    ahead = K8S_NODES.decode(node_event(ts=WALL + 10 * YEAR))
    assert check_node(ahead, WALL) == [
        f"ts {WALL + 10 * YEAR} is more than a day ahead of the wall clock {WALL}"
    ]
    seconds = K8S_NODES.decode(node_event(ts=W0 // S, node=""))
    assert check_node(seconds, None) == [
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
