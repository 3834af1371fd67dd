"""Many clusters, one pipeline: same-named nodes of two clusters never share state.

Two clusters run the same history (the same node names, the same pod names, the same
times): the default one as it is, `east` with pod uids and GPU uuids of its own (those are
unique across clusters) and `"cluster": "east"` on every message. Through the worker's
stream logic (`pipeline_model`: agent loops, partitions, ticks; no Kafka) each cluster's
records together must be those of the same cluster run alone, and `east`'s must be the
default's but for the ids and what names the cluster. A node's state shared between the
clusters would drop the second cluster's samples as redeliveries, mix their windows and
usage, and fire one NodeTelemetryMissing for two nodes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import msgspec
import pytest
from histories import History, Input, NodePlan, PodPlan, pod_uid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_model import NODES, Pipeline, run_backlog, run_live
from test_backlog_properties import histories

from schemas import K8S_PODS, NVML_SAMPLES, NvmlSample
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import NodeName
from schemas.prices import BUILTIN_PRICES, PriceOverride, PriceTable
from schemas.settings import RuleSettings, WindowSettings
from streams.core.alert_identity import fingerprint
from streams.core.integrals import PriceBook, integrate_sample
from streams.core.node.gpu_alerts import NodeAlertState, on_watermark
from streams.core.node.node_doc import node_key
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Source

S = 1000
T0 = 1_764_400_000_000  # a multiple of every window length used here
WINDOWS = WindowSettings(window_s=10, allowed_lateness_s=2)
RULES = RuleSettings(stall_after_s=30, queued_alert_after_s=20, idle_alert_after_s=15)
EAST = "east"
PREFIX = "mc."


def _history() -> History:
    """Two nodes, one silent for a spell (NodeTelemetryMissing); pods that run, idle (a
    stall and GpuIdleAllocated), finish, and one queued past its alert."""
    nodes = (
        NodePlan("gpu-node-1", 2, 1_000),
        NodePlan("gpu-node-2", 1, 2_000, phase_ms=500, silent=((60 * S, 110 * S),)),
    )
    pods = (
        PodPlan(pod_uid(3, 0), "gpu-node-1", 0, 0, 5 * S, 150 * S, idle=((40 * S, 100 * S),)),
        PodPlan(pod_uid(3, 1), "gpu-node-1", 1, 10 * S, 12 * S, 70 * S, finish="Failed"),
        PodPlan(pod_uid(3, 2), "gpu-node-2", 0, 0, 3 * S, 170 * S),
        PodPlan(pod_uid(3, 3), "gpu-node-1", 1, 20 * S, 90 * S, 140 * S, finish="Deleted"),
    )
    return History(T0, 180 * S, nodes, pods, relists_ms=(100 * S,))


def _uid(uid: str) -> str:
    """A pod uid of `east`: unique across clusters, as Kubernetes makes them."""
    return "e" + uid[1:]


def _uuid(uuid: str) -> str:
    """A GPU uuid of `east`."""
    return uuid.replace("-0000-4000-", "-0e00-4000-")


def _in_cluster(inputs: list[Input], cluster: str | None) -> list[Input]:
    """The inputs as `east`'s (ids of its own, the field set) or with `cluster` set alone."""
    out = []
    for m in inputs:
        value = json.loads(m.value)
        key = m.key
        if cluster == EAST:
            if m.spec is K8S_PODS:
                value["uid"] = _uid(value["uid"])
                key = value["uid"].encode()
            else:
                for gpu in value["gpus"]:
                    gpu["uuid"] = _uuid(gpu["uuid"])
                    for proc in gpu["processes"]:
                        proc["pod_uid"] = _uid(proc["pod_uid"])
                for alloc in value["allocations"]:
                    alloc["pod_uid"] = _uid(alloc["pod_uid"])
                    alloc["device_ids"] = [_uuid(d) for d in alloc["device_ids"]]
        if cluster is not None:
            value["cluster"] = cluster
        out.append(Input(m.spec, key, json.dumps(value).encode(), m.ts))
    return out


def _merged(*streams: list[Input]) -> list[Input]:
    """Several clusters' inputs as they reach one pipeline: in event-time order."""
    return sorted((m for s in streams for m in s), key=lambda m: m.ts)


def _run(
    inputs: list[Input],
    order: str,
    partitions: int,
    rules: RuleSettings = RULES,
) -> dict[str, list[Any]]:
    kw: dict[str, Any] = {
        "partitions": partitions,
        "rules": rules,
        "windows": WINDOWS,
        "idle_after_ms": 20_000,
    }
    pipe = run_live(inputs, **kw) if order == "live" else run_backlog(inputs, order, **kw)
    assert pipe.counters.deadletter == 0
    return pipe.records()


def _of(records: dict[str, list[Any]], cluster: str) -> dict[str, list[Any]]:
    """The records of one cluster (a record without the field is the default cluster's)."""
    out: dict[str, list[Any]] = {}
    for topic, values in records.items():
        mine = [v for v in values if v.get("cluster", DEFAULT_CLUSTER) == cluster]
        if mine:
            out[topic] = mine
    return out


def _as_default(records: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """`east`'s records with the default cluster's ids, less what names the cluster."""
    text = json.dumps(records)
    for uid in {p.uid for p in _history().pods}:
        text = text.replace(_uid(uid), uid)
    text = text.replace("-0e00-4000-", "-0000-4000-").replace(f"[cluster {EAST}] ", "")
    out: dict[str, list[Any]] = json.loads(text)
    for values in out.values():
        for v in values:
            assert v.pop("cluster") == EAST
            if "fingerprint" in v:
                assert v["labels"].pop("cluster") == EAST
                del v["fingerprint"]
        values.sort(key=lambda v: json.dumps(v, sort_keys=True))
    return out


def _without_fingerprints(records: dict[str, list[Any]]) -> dict[str, list[Any]]:
    out = {
        t: [{k: x for k, x in v.items() if k != "fingerprint"} for v in vs]
        for t, vs in records.items()
    }
    for values in out.values():
        values.sort(key=lambda v: json.dumps(v, sort_keys=True))
    return out


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("order", ["live", "pod events first", "samples first"])
def test_each_cluster_gets_the_records_it_gets_alone(order: str, partitions: int) -> None:
    base = _history().inputs()
    default, east = _in_cluster(base, None), _in_cluster(base, EAST)
    alone_default = _run(default, order, partitions)
    alone_east = _run(east, order, partitions)
    together = _run(_merged(default, east), order, partitions)

    # The history makes every kind of record, node alerts among them.
    assert set(alone_default) == {"pod.lifecycle", "attribution", "gpu.windows", "alerts"}
    names = {a["name"] for a in alone_default["alerts"]}
    assert {"NodeTelemetryMissing", "GpuIdleAllocated", "PodStalled"} <= names

    assert _of(together, DEFAULT_CLUSTER) == alone_default
    assert _of(together, EAST) == alone_east
    assert sum(map(len, together.values())) == sum(
        len(alone_default[t]) + len(alone_east[t]) for t in alone_default
    )
    # East's records are the default cluster's but for the ids and the cluster's name...
    assert _as_default(alone_east) == _without_fingerprints(alone_default)
    # ... and its alerts are alerts of their own.
    east_prints = {a["fingerprint"] for a in alone_east["alerts"]}
    assert east_prints.isdisjoint(a["fingerprint"] for a in alone_default["alerts"])


# East's own thresholds: it stalls sooner, alerts on queued and idle later, and calls a
# node silent sooner; every one of them changes east's records.
EAST_RULES = {
    "stall_after_s": 10,
    "queued_alert_after_s": 60,
    "idle_alert_after_s": 40,
    "telemetry_missing_after_s": 12,
}


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("order", ["live", "pod events first", "samples first"])
def test_each_cluster_runs_by_its_own_rules(order: str, partitions: int) -> None:
    base = _history().inputs()
    default, east = _in_cluster(base, None), _in_cluster(base, EAST)
    own = RULES.model_copy(update=EAST_RULES)
    both = RuleSettings.model_validate(RULES.model_dump() | {"clusters": {EAST: EAST_RULES}})
    assert both.of(EAST) == own
    assert both.of(DEFAULT_CLUSTER) is both

    alone_default = _run(default, order, partitions)
    alone_east = _run(east, order, partitions, own)
    together = _run(_merged(default, east), order, partitions, both)

    assert _of(together, DEFAULT_CLUSTER) == alone_default
    assert _of(together, EAST) == alone_east
    # The thresholds changed what east publishes: the lifecycle, the alerts' times.
    as_default = _as_default(alone_east)
    theirs = _without_fingerprints(alone_default)
    for topic in ("pod.lifecycle", "alerts"):
        assert as_default[topic] != theirs[topic], topic

    def fired(alerts: list[Any], name: str) -> list[int]:
        return sorted(a["ts"] - T0 for a in alerts if a["name"] == name and a["status"] == "firing")

    assert fired(as_default["alerts"], "PodQueuedTooLong") == [
        t + 40 * S for t in fired(theirs["alerts"], "PodQueuedTooLong")
    ]
    for name in ("PodStalled", "GpuIdleAllocated", "NodeTelemetryMissing"):
        assert fired(as_default["alerts"], name) != fired(theirs["alerts"], name), name

    # The windows count the same usage: no threshold of these moves it (the state each
    # window ends in does move: east's pod stalls sooner).
    def usage(records: list[Any]) -> list[Any]:
        return [{k: x for k, x in r.items() if k != "state"} for r in records]

    assert usage(as_default["attribution"]) == usage(theirs["attribution"])
    assert as_default["attribution"] != theirs["attribution"]


def _ending_at(inputs: list[Input], end_ms: int) -> list[Input]:
    """`inputs` and a last sample, at `end_ms`, of a node with no GPU (`gwprop-end`): every
    run's stream time ends there, so no cluster's last windows stay open in one run and
    closed in another (alone, a cluster whose history ends first would keep them open;
    together, the other cluster's time moves on and closes them)."""
    last = next(m for m in reversed(inputs) if m.spec is NVML_SAMPLES)
    value = json.loads(last.value) | {"node": "gwprop-end", "ts": end_ms, "seq": 0}
    value |= {"gpus": [], "allocations": []}
    return [*inputs, Input(NVML_SAMPLES, b"gwprop-end", json.dumps(value).encode(), end_ms)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    histories(intervals=(100, 500, 1_000, 2_000)),
    histories(intervals=(100, 500, 1_000, 2_000)),
    st.sampled_from(["live", "pod events first", "samples first"]),
    st.integers(1, 4),
)
def test_generated_clusters_together_get_what_each_gets_alone(
    first: History, second: History, order: str, partitions: int
) -> None:
    """Two generated histories as two clusters: node names `gwprop-n0`... repeat, each
    cluster has its own pods, times and thresholds; one pipeline gives each cluster the
    records it gets alone. Samples are no longer than the allowed lateness: with longer
    ones a cluster's records can be late or not by how far the other's data moved the
    shared partitions' watermark, as with two nodes of one cluster."""
    end = T0 + max(first.duration_ms, second.duration_ms) + 60 * S
    default = _ending_at(_in_cluster(first.inputs(), None), end)
    east = _ending_at(_in_cluster(second.inputs(), EAST), end)
    own = RULES.model_copy(update=EAST_RULES)
    both = RuleSettings.model_validate(RULES.model_dump() | {"clusters": {EAST: EAST_RULES}})
    alone_default = _run(default, order, partitions)
    alone_east = _run(east, order, partitions, own)
    together = _run(_merged(default, east), order, partitions, both)
    assert _of(together, DEFAULT_CLUSTER) == alone_default
    assert _of(together, EAST) == alone_east


def test_a_message_without_the_field_is_of_the_default_cluster() -> None:
    base = _history().inputs()
    named = _run(_in_cluster(base, DEFAULT_CLUSTER), "live", 2)
    unnamed = _run(_in_cluster(base, None), "live", 2)
    assert named == unnamed
    every = [v for values in unnamed.values() for v in values]
    assert every
    assert all("cluster" not in v for v in every)
    assert all("cluster" not in a["labels"] for a in unnamed["alerts"])


def test_node_alerts_of_a_named_cluster_name_it() -> None:
    node = NodeName("gpu-node-1")
    default = NodeAlertState(node=node, seen_until=T0)
    east = NodeAlertState(node=node, cluster=EAST, seen_until=T0)
    (_, [d]), (_, [e]) = (on_watermark(s, T0 + 60 * S, RULES) for s in (default, east))
    # The default cluster's alert is the one sent before clusters existed.
    digest = hashlib.sha1(b"NodeTelemetryMissing|node|gpu-node-1", usedforsecurity=False)
    assert d.fingerprint == digest.hexdigest()[:16]
    assert d.labels == {"node": "gpu-node-1"}
    assert d.summary == "no NVML samples from gpu-node-1 for 30 s"
    assert "cluster" not in msgspec.json.encode(d).decode()
    assert e.fingerprint == fingerprint("NodeTelemetryMissing", "node", "east/gpu-node-1")
    assert e.fingerprint != d.fingerprint
    assert e.labels == {"node": "gpu-node-1", "cluster": EAST}
    assert e.summary == "[cluster east] no NVML samples from gpu-node-1 for 30 s"
    assert e.cluster == EAST


def _first_sample(cluster: str | None) -> bytes:
    for m in _in_cluster(_history().inputs(), cluster):
        if m.spec is NVML_SAMPLES and json.loads(m.value)["allocations"]:
            return m.value
    raise AssertionError("the history has a sample with a pod")


def _usd_per_hour(prices: PriceBook, raw: bytes) -> float:
    """The price per GPU-hour the pods of a sample are charged."""
    sample = msgspec.json.decode(raw, type=NvmlSample)
    integrals = integrate_sample(sample, 5.0, prices)
    pods = [p for _gpu, g in integrals.gpus for p in g.pods]
    seconds = sum(p.allocated_seconds for p in pods)
    assert seconds > 0
    return sum(p.cost_usd for p in pods) / seconds * 3600


def test_a_price_of_a_cluster_applies_to_its_cluster_alone() -> None:
    table = PriceTable(
        models={"H100": 4.0},
        overrides=(
            PriceOverride(cluster=EAST, label="pool", value="spot", models={"H100": 1.0}),
            PriceOverride(cluster=EAST, models={"H100": 3.0}),
        ),
    )
    book = PriceBook(table)
    default, east = _first_sample(None), _first_sample(EAST)
    assert json.loads(default)["node"] == json.loads(east)["node"]
    assert _usd_per_hour(book, default) == pytest.approx(4.0)
    assert _usd_per_hour(book, east) == pytest.approx(3.0)
    # A spot label on east's node prices that node alone, not the default's same-named one.
    book.set_node_labels(json.loads(east)["node"], {"pool": "spot"}, EAST)
    assert _usd_per_hour(book, east) == pytest.approx(1.0)
    assert _usd_per_hour(book, default) == pytest.approx(4.0)
    assert table.usd_per_gpu_hour("NVIDIA H100", {"pool": "spot"}) == 4.0


def test_the_prices_file_keeps_its_form() -> None:
    old = {"models": {"H100": 4.0}, "overrides": [{"label": "pool", "value": "spot"}]}
    table = PriceTable.model_validate(old)
    assert table.overrides[0].cluster is None
    assert table.usd_per_gpu_hour("H100", {"pool": "spot"}, EAST) == 4.0
    spot = {"label": "pool", "value": "spot", "default_usd_per_gpu_hour": 0.5}
    table = PriceTable.model_validate({**old, "overrides": [spot]})
    assert table.usd_per_gpu_hour("L4", {"pool": "spot"}, EAST) == 0.5  # every cluster's
    with pytest.raises(ValueError, match="names a cluster"):
        PriceOverride()
    with pytest.raises(ValueError, match="together"):
        PriceOverride(label="pool")
    assert BUILTIN_PRICES.usd_per_gpu_hour("H100", {}, EAST) == 4.0


def _node_partition(stored: Iterable[tuple[bytes, bytes]] = ()) -> NodePartition:
    config = NodeConfig(
        prefix=PREFIX,
        window_ms=WINDOWS.window_s * S,
        lateness_ms=WINDOWS.allowed_lateness_s * S,
        rules=RULES,
        prices=PriceBook(BUILTIN_PRICES),
    )
    return NodePartition(0, config, Counters(), stored)


def test_state_keys_keep_the_default_form_and_reload_per_cluster() -> None:
    samples = NVML_SAMPLES.full_name(PREFIX)
    part = _node_partition()
    out = Outputs(PREFIX, part.counters, now_ms=lambda: 0)
    raws = [_first_sample(None), _first_sample(EAST)]
    node = json.loads(raws[0])["node"]
    key = node.encode()
    for offset, raw in enumerate(raws):
        assert part.handle(Source(samples, 0, offset, key), raw, out) is not None
    writes = dict([*part.take_writes(), part.checkpoint()])
    assert node_key(EAST, node) == f"east/{node}"
    assert set(writes) == {b"", key, b"east/" + key}
    assert b"cluster" not in writes[key]
    again = _node_partition([(k, v) for k, v in writes.items() if v is not None])
    assert again.nodes[node].cluster == DEFAULT_CLUSTER
    assert again.nodes[f"east/{node}"].cluster == EAST
    # Both samples are redeliveries now, each of its own node's state.
    out = Outputs(PREFIX, again.counters, now_ms=lambda: 0)
    for offset, raw in enumerate(raws):
        again.handle(Source(samples, 0, offset, key), raw, out)
    assert again.counters.duplicates == 2


def test_node_events_of_two_clusters_keep_their_labels_apart() -> None:
    event = {
        "schema": "gpuwatch.k8s.node/v1",
        "type": "ADDED",
        "node": "gpu-node-1",
        "ts": T0,
        "gpu_capacity": {"nvidia.com/gpu": 2},
        "gpu_allocatable": {"nvidia.com/gpu": 2},
        "gpu_product": "NVIDIA H100 80GB HBM3",
        "labels": {"pool": "spot"},
        "ready": True,
        "unschedulable": False,
        "cluster": EAST,
    }
    pipe = Pipeline(partitions=1, rules=RULES, windows=WINDOWS)
    pipe.append(NODES, b"gpu-node-1", json.dumps(event).encode())
    pipe.produce(_merged(_in_cluster(_history().inputs(), None)[:3]))
    pipe.drain([("node", NODES)])
    pipe.close()
    nodes = pipe.node_table.data[0]
    assert json.loads(nodes[b"east/gpu-node-1"])["labels"] == {"pool": "spot"}
    assert "labels" not in json.loads(nodes[b"gpu-node-1"])
