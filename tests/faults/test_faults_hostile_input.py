"""10,000 malformed and hostile messages into a worker with its sinks, around valid traffic.

The valid traffic is the worker tests' scenario (90 s of a node with a training and an
idle pod, a queued pod). Into its three input topics go, interleaved on the same
partitions, the seeded messages of `hostile_messages`: 10,000 that no worker may process
and about 300 valid ones with names built to break Prometheus' text format and Redis keys.
A second worker runs the valid traffic alone. Asserted:

- the worker never crashes, and exits 0 on SIGTERM;
- each invalid message is in `deadletter` once, found by its source partition and offset,
  with its exact bytes and a reason that says what is wrong; nothing else is there;
- every record the valid traffic makes alone is made again, equal; the other records are
  about the hostile pods, GPUs and nodes only;
- /metrics parses, has no duplicate series, and shows the hostile names escaped;
- Redis holds what the derived topics say, hostile keys included, and every key reads.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import redis
from fault_checks import KEYS_OF, differences, redis_mismatches, subject_of
from fault_services import StartRedis
from hostile_messages import (
    NODES,
    PODS,
    SAMPLES,
    TOTAL,
    Bases,
    Hostile,
    HostilePod,
    gpu_uuid,
    hostile_node_names,
    hostile_pods,
    invalid_messages,
    node_value,
    pod_value,
    sample_value,
)
from kafka.partitioner.default import murmur2
from prometheus_client.parser import text_string_to_metric_families
from support import free_port, holds_within
from topic_io import PARTITIONS, NewScope, consume_all
from worker_fixtures import (
    QUEUED_UID,
    Identities,
    Scenario,
    StartWorker,
    aligned_t0,
    decoded,
    identities,
    scenario,
)

from gpuwatch import kafka
from gpuwatch.harness.examples import example
from schemas import ATTRIBUTION, DEADLETTER, POD_LIFECYCLE
from schemas.settings import Settings

pytestmark = pytest.mark.integration

SEED = 20261129
DONE_WITHIN_S = 90.0  # the worker takes seconds for all of it; the machine is shared
MAX_LABEL = 253


@dataclass(frozen=True)
class Out:
    """One message to produce and what it is: valid, hostile (valid), or invalid."""

    role: str
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    hostile: Hostile | None = None


def partition_of(key: bytes) -> int:
    """The partition Kafka's default partitioner gives a key."""
    return (murmur2(key) & 0x7FFFFFFF) % PARTITIONS


def collision_pods(case: Scenario) -> list[HostilePod]:
    """Pods whose uids are valid pods' uids with a key suffix of the Redis sink's own."""
    out = []
    for uid, suffix in ((case.training.uid, ":windows"), (case.idle.uid, ":seen")):
        out.append(
            HostilePod(
                uid=uid + suffix,
                namespace="ml",
                name=f"collide{suffix}",
                team="vision",
                node=None,
                shown=("ml", f"collide{suffix}", "vision"),
            )
        )
    out.append(HostilePod("", "empty-uid", "empty-uid", "t", None, ("empty-uid", "empty-uid", "t")))
    return out


def build(settings: Settings, case: Scenario) -> tuple[list[Out], list[HostilePod], list[str]]:
    """The valid traffic with the hostile and invalid messages interleaved, in send order."""
    prefix = settings.kafka.topic_prefix
    t0 = case.t0
    pod_events = [json.loads(v) for t, _, v, _ in case.messages if t.endswith(".k8s.pods")]
    node_event = {**example("gpuwatch.k8s.node/v1"), "node": case.node, "ts": t0}
    bases = Bases(
        t0, case.node, [msgspec.to_builtins(s) for s in case.samples], pod_events, node_event
    )
    invalid = invalid_messages(SEED, bases)
    nodes = hostile_node_names()
    pods = hostile_pods(t0, nodes) + collision_pods(case)
    runners = [p for p in pods if p.node is not None]
    valid = [Out("valid", t, k, v, p) for t, k, v, p in case.messages]
    out: list[Out] = []
    for pod in pods:
        value = json.dumps(pod_value(pod, t0)).encode()
        out.append(Out("hostile", prefix + PODS, pod.uid.encode(), value))
    for i, node in enumerate(nodes):
        out.append(
            Out(
                "hostile",
                prefix + NODES,
                node.encode(),
                json.dumps(node_value(node, i, t0)).encode(),
            )
        )
    samples_at = partition_of(case.node.encode())
    per_slot = -(-len(invalid) // len(valid))
    second = 0
    for slot, message in enumerate(valid):
        out.append(message)
        if message.topic.endswith(SAMPLES):
            ts = case.samples[second].ts
            for i, (node, pod) in enumerate(zip(nodes, runners, strict=True)):
                value = json.dumps(sample_value(node, i, pod, ts, second)).encode()
                out.append(Out("hostile", prefix + SAMPLES, node.encode(), value, samples_at))
            second += 1
        for h in invalid[slot * per_slot : (slot + 1) * per_slot]:
            out.append(Out("invalid", prefix + h.topic, h.key, h.value, hostile=h))
    assert sum(o.role == "invalid" for o in out) == TOTAL
    return out, pods, nodes


def produce_all(settings: Settings, plan: list[Out]) -> list[tuple[Out, int, int]]:
    """Send in order; each message with its partition and offset."""
    producer = kafka.producer(settings.kafka, acks="all", linger_ms=20, batch_size=1 << 20)
    try:
        futures = [
            producer.send(o.topic, key=o.key, value=o.value, partition=o.partition) for o in plan
        ]
        producer.flush(timeout=120)
        metas = [f.get(timeout=60) for f in futures]
    finally:
        producer.close()
    return [(o, m.partition, m.offset) for o, m in zip(plan, metas, strict=True)]


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
    return body.decode("utf-8")


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample: Prometheus' own parser must read it all."""
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def dead_total(port: int) -> float:
    try:
        text = metrics_text(port)
    except OSError:
        return -1.0
    return sum(v for n, _, v in metric_samples(text) if n == "gpuwatch_deadletter_total")


def check_dead_letters(settings: Settings, invalid: list[tuple[Out, int, int]]) -> int:
    """One dead letter per invalid message, at its place, its bytes, a reason that says why.

    Only a letter too large for Kafka has its raw cut, to its value's first bytes, and says
    so. Returns how many were cut.
    """
    topic = settings.kafka.topic_prefix + "deadletter"
    by_place: dict[tuple[str, int, int], Any] = {}
    for record in consume_all(settings, topic):
        letter = DEADLETTER.decode(record.value)
        place = (letter.source_topic, letter.partition, letter.offset)
        assert place not in by_place, place
        by_place[place] = letter
    wrong: list[str] = []
    cut = 0
    for o, partition, offset in invalid:
        h = o.hostile
        assert h is not None
        letter = by_place.pop((o.topic, partition, offset), None)
        value = h.value or b""
        if letter is None:
            wrong.append(f"{h.kind} {h.topic}: not dead-lettered: {value[:120]!r}")
        elif not letter.error or h.expect not in letter.error or "internal error" in letter.error:
            wrong.append(f"{h.kind}: reason {letter.error[:200]!r} lacks {h.expect!r}")
        elif (kept := letter.raw_bytes()) != value:
            note = f"(raw cut to the first {len(kept)} of {len(value)} bytes)"
            if not (value.startswith(kept) and letter.error.endswith(note)):
                wrong.append(f"{h.kind}: raw differs, {letter.error[-80:]!r}")
            cut += 1
    assert wrong == [], f"{len(wrong)} wrong, first: {wrong[:10]}"
    assert by_place == {}, f"dead letters of valid messages: {list(by_place.values())[:3]}"
    return cut


def check_subjects(
    got: Identities, want: Identities, case: Scenario, pods: list[HostilePod], nodes: list[str]
) -> None:
    """Records beyond the reference run's are about the hostile pods, GPUs and nodes only."""
    valid = {case.training.uid, case.idle.uid, QUEUED_UID, case.node}
    valid |= {*case.training.gpu_uuids, *case.idle.gpu_uuids}
    hostile = {p.uid for p in pods} | set(nodes) | {gpu_uuid(i) for i in range(len(nodes))}
    for topic, records in got.items():
        for identity, copies in records.items():
            if identity not in want[topic]:
                subjects = {subject_of(topic, c) for c in copies}
                assert subjects <= hostile, (topic, identity, subjects)
                assert not subjects & valid, (topic, identity)
    charged = {k[0] for k in got["attribution"] if k[0] in hostile}
    assert charged == {p.uid for p in pods if p.node is not None}  # they ran: they cost


def check_redis(
    client: redis.Redis, settings: Settings, pods: list[HostilePod], nodes: list[str]
) -> None:
    """Hostile names stored as they are, under keys that read back; every key reads."""
    for pod in pods:
        stored = client.hgetall(KEYS_OF.pod(pod.uid))
        assert stored[b"namespace"] == pod.namespace.encode(), pod.uid
        assert stored[b"pod"] == pod.name.encode(), pod.uid
        assert json.loads(stored[b"labels"])["team"] == pod.team
    for i, node in enumerate(nodes):
        stored = client.hgetall(KEYS_OF.gpu(gpu_uuid(i)))
        assert stored[b"node"] == node.encode()
    readers: dict[bytes, Callable[[bytes], Any]] = {
        b"hash": client.hgetall,
        b"zset": lambda k: client.zrange(k, 0, -1),
        b"stream": client.xrange,
    }
    kinds = {}
    for key in client.scan_iter(count=1000):
        kinds[key] = kind = client.type(key)
        readers[kind](key)  # a KeyError for a type the sink does not write
    # Each pod's keys are its own: as many as its records make, no two pods sharing one.
    changed = {c.uid for c in decoded(settings, POD_LIFECYCLE)}
    charged = {a.uid for a in decoded(settings, ATTRIBUTION)}
    want = {KEYS_OF.pod(u) for u in changed | charged} | {KEYS_OF.pod_windows(u) for u in charged}
    want |= {k for u in changed for k in (KEYS_OF.timeline(u), KEYS_OF.timeline_seen(u))}
    per_pod = (KEYS_OF.pod(""), KEYS_OF.timeline(""))
    assert {k.decode() for k in kinds if k.decode().startswith(per_pod)} == want
    assert {p.uid for p in pods} <= changed


def check_metrics(text: str, pods: list[HostilePod], nodes: list[str]) -> None:
    """/metrics parses, has no series twice, and shows the hostile names cleaned and escaped."""
    samples = metric_samples(text)
    series = [(n, tuple(sorted(labels.items()))) for n, labels, _ in samples]
    assert len(series) == len(set(series)), "a series twice"
    for name, labels, _ in samples:
        for value in labels.values():
            assert len(value) <= MAX_LABEL, (name, value[:40])
            assert value.isprintable(), (name, value)
    queued = [
        labels
        for n, labels, v in samples
        if n == "gpuwatch_pod_state" and labels["state"] == "queued" and v == 1.0
    ]
    for pod in (p for p in pods if p.node is None):
        ns, name, team = pod.shown
        if ns is None:  # the 10 kB names: cut to 253 characters, kept apart by a hash
            (found,) = [q for q in queued if q["namespace"].startswith(pod.namespace[:200])]
            assert found["pod"].startswith(pod.name[:200])
        else:
            shown = {"namespace": ns, "pod": name, "team": team, "node": "", "state": "queued"}
            assert shown in queued, pod.uid
    assert 'pod="p0-q\\"uo\\"te"' in text  # quotes and backslashes escaped in the text
    assert 'pod="p1-back\\\\slash\\\\"' in text
    for node in nodes:
        shown_node = node.replace("\x00", "")
        util = [
            labels
            for n, labels, _ in samples
            if n == "gpuwatch_gpu_utilization_ratio" and labels["node"] == shown_node
        ]
        assert len(util) == 1, (node, util)


def test_ten_thousand_hostile_messages_are_dead_lettered_and_valid_traffic_is_unaffected(
    new_scope: NewScope, start_worker: StartWorker, private_redis: StartRedis
) -> None:
    figures: dict[str, Any] = {}
    t0 = aligned_t0()
    reference, hostile = new_scope(), new_scope()
    case = scenario(hostile, t0)
    began = time.monotonic()
    plan, pods, nodes = build(hostile, case)
    figures["generate_s"] = round(time.monotonic() - began, 1)
    began = time.monotonic()
    sent = produce_all(hostile, plan)
    figures["produce_s"] = round(time.monotonic() - began, 1)
    figures["messages"] = len(plan)
    figures["bytes"] = sum(len(o.value or b"") for o in plan)
    old, new = hostile.kafka.topic_prefix, reference.kafka.topic_prefix
    produce_all(
        reference,
        [Out("valid", new + t.removeprefix(old), k, v, p) for t, k, v, p in case.messages],
    )
    store, port = private_redis(), free_port()
    env = {
        "GPUWATCH_WORKER_SINKS": "true",
        "GPUWATCH_REDIS_URL": store.url,
        "GPUWATCH_METRICS_PORT": str(port),
        "GPUWATCH_SINK_METRICS_PORT": str(free_port()),
        "GPUWATCH_SINK_EXPORTER_PORT": str(exporter_port := free_port()),
    }
    began = time.monotonic()
    alone = start_worker(reference, "reference")
    worker = start_worker(hostile, "hostile", env=env)
    sink = start_worker(hostile, "sink", env=env, sink="redis")
    exporter = start_worker(hostile, "exporter", env=env, sink="metrics")

    # The valid traffic alone: every window and alert of the scenario (as the recovery test).
    assert holds_within(
        lambda: (
            (ids := identities(reference))
            and len(ids["attribution"]) >= 3
            and len(ids["gpu.windows"]) >= 2
            and len({k[0] for k in ids["alerts"]}) >= 3
        ),
        timeout_s=DONE_WITHIN_S,
        interval_s=0.5,
    ), alone.stop()
    want = identities(reference)
    all_in = holds_within(
        lambda: dead_total(port) >= TOTAL and not differences(identities(hostile), want),
        timeout_s=DONE_WITHIN_S,
        interval_s=0.5,
    )
    figures["all_processed_s"] = round(time.monotonic() - began, 1)
    assert worker.process.poll() is None, worker.stop()
    got = identities(hostile)
    assert differences(got, want) == []
    assert all_in, f"dead letters on /metrics: {dead_total(port)}"

    invalid = [(o, p, off) for o, p, off in sent if o.role == "invalid"]
    figures["dead_letters_cut"] = check_dead_letters(hostile, invalid)
    check_subjects(got, want, case, pods, nodes)

    client = redis.Redis(port=store.port, decode_responses=False)
    try:
        began = time.monotonic()
        converged = holds_within(
            lambda: not redis_mismatches(client, hostile), timeout_s=DONE_WITHIN_S, interval_s=0.5
        )
        figures["redis_converged_s"] = round(time.monotonic() - began, 1)
        assert converged, redis_mismatches(client, hostile)[:10]
        check_redis(client, hostile, pods, nodes)
    finally:
        client.close()

    def metrics_shown() -> bool:
        try:
            check_metrics(metrics_text(exporter_port), pods, nodes)
        except AssertionError:
            return False
        return True

    if not holds_within(metrics_shown, timeout_s=DONE_WITHIN_S, interval_s=0.5):
        check_metrics(metrics_text(exporter_port), pods, nodes)  # fails, saying what is missing
    text = metrics_text(port)  # the worker's own: the pipeline's counters
    counted = {
        labels["topic"].removeprefix(old): v
        for n, labels, v in metric_samples(text)
        if n == "gpuwatch_events_total"
    }
    for topic in (SAMPLES, PODS, NODES):
        assert counted.get(topic) == sum(o.topic == old + topic for o in plan), topic

    worker.stop()
    sink.stop()
    exporter.stop()
    assert exporter.process.returncode == 0, exporter.log[-3000:]
    assert worker.process.returncode == 0, worker.log[-3000:]
    assert worker.counters()["deadletter"] == TOTAL
    assert sink.process.returncode == 0, sink.log[-3000:]
    assert "rejected=0" in sink.log, sink.log[-3000:]
    alone.stop()
    assert alone.process.returncode == 0, alone.log[-3000:]
    figures["late"] = worker.counters()["late"]
    print("FIGURES hostile", json.dumps(figures))
