"""The Redis sink against the local stack's Redis: keys and values, idempotence, ordering."""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.harness.examples import GPU_0, GPU_1, POD_UID, POD_UID_2, example
from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.capacity import Capacity
from schemas.gpu_window import GpuWindow
from schemas.k8s_workload import K8sWorkload
from schemas.pod_lifecycle import PodLifecycle
from schemas.settings import RedisSettings, Settings
from sinks.redis.plan import GpuLive, SinkRecord
from sinks.redis.sink import RedisSink, SinkRejected

pytestmark = pytest.mark.integration

T = TypeVar("T")
MIN = 60_000
HOUR = 3_600_000


def _record(schema: str, cls: type[T], **changes: Any) -> T:
    return msgspec.convert({**example(schema), **changes}, cls)


def move(
    uid: str, ts: int, to: str, frm: str | None = None, reason: str | None = None, **kw: Any
) -> PodLifecycle:
    fields = {"uid": uid, "ts": ts, "to_state": to, "from_state": frm, "reason": reason, **kw}
    return _record("gpuwatch.pod.lifecycle/v1", PodLifecycle, **fields)


def window(uid: str, ws: int, waste: float, cost: float = 0.0658, **kw: Any) -> Attribution:
    fields = {"uid": uid, "window_start": ws, "window_end": ws + MIN, "ts": ws + MIN, **kw}
    return _record("gpuwatch.attribution/v1", Attribution, cost_usd=cost, waste_usd=waste, **fields)


def alert(fp: str, status: str, ts: int, uid: str | None = None, name: str = "PodStalled") -> Alert:
    subject = {
        "kind": "pod" if uid else "gpu",
        "uid": uid,
        "uuid": None if uid else GPU_1,
        "node": "n1",
    }
    return _record(
        "gpuwatch.alert/v1", Alert, fingerprint=fp, status=status, ts=ts, subject=subject, name=name
    )


def capacity(ts: int, free: dict[str, int], **kw: Any) -> Capacity:
    """The example H100 picture as of `ts`, free on the nodes of `free`."""
    fields = {"ts": ts, "free_by_node": free, "free": sum(free.values()), **kw}
    return _record("gpuwatch.capacity/v1", Capacity, **fields)


def live(uuid_: str, ts: int, util: float | None, idle_since: int | None) -> GpuLive:
    fields = {"uuid": uuid_, "node": "gpu-node-17", "model": "H100", "sharing": "exclusive"}
    fields |= {"parent_uuid": None, "ts": ts, "util_pct": util, "mem_used_bytes": 7}
    fields |= {"mem_total_bytes": 80, "pods": [POD_UID], "idle_since": idle_since}
    return msgspec.convert(fields, GpuLive)


def scenario() -> list[SinkRecord]:
    """Two pods: train-0 queues, runs, stalls and is alerted; notebook-ana-0 runs."""
    return [
        move(POD_UID, 1000, "queued", reason="Unschedulable", node=None),
        move(POD_UID_2, 1500, "queued", namespace="research", pod="notebook-ana-0"),
        move(POD_UID, 2000, "running", "queued"),
        move(POD_UID_2, 3000, "running", "queued", namespace="research", pod="notebook-ana-0"),
        window(POD_UID, 0, 0.0033),
        window(POD_UID, MIN, 0.0033),
        window(POD_UID_2, MIN, 0.02, namespace="research", pod="notebook-ana-0"),
        window(POD_UID, 2 * MIN, 0.01),
        move(POD_UID, 400_000, "stalled", "running", "Idle"),
        alert("fp-stall", "firing", 400_000, POD_UID),
        alert("fp-idle", "firing", 410_000, name="GpuIdleAllocated"),
        alert("fp-stall", "resolved", 500_000, POD_UID),
        live(GPU_0, 420_000, 2.0, 300_000),
        _record("gpuwatch.gpu.window/v1", GpuWindow),
    ]


def _drop(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def make_sink(stack: Settings, prefix: str, ttl: int = 86_400, **kw: Any) -> RedisSink:
    url = stack.redis.url
    return RedisSink(RedisSettings(url=url, finished_ttl_s=ttl), key_prefix=prefix, **kw)


def snapshot(client: redis.Redis, prefix: str, stream_ids: bool = True) -> dict[str, Any]:
    """Every key under `prefix`: type, value, whether it expires. Streams without ids on request."""
    out: dict[str, Any] = {}
    for key in client.scan_iter(f"{prefix}*", count=1000):
        kind = client.type(key)
        value: Any
        if kind == "hash":
            value = client.hgetall(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            entries = client.xrange(key)
            value = (
                entries
                if stream_ids
                else sorted(msgspec.json.encode(e[1], order="sorted") for e in entries)
            )
        else:
            value = client.get(key)
        out[key.removeprefix(prefix)] = (kind, value, client.ttl(key) > 0)
    return out


def test_scenario_writes_design_keys_and_values(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    with make_sink(stack, prefix) as sink:
        sink.apply(scenario())
    pod = client.hgetall(f"{prefix}pod:{POD_UID}")
    gpus = msgspec.json.decode(pod.pop("gpus"))
    # The example pod reports 600 steps a window: over its 3 windows, 1,800 steps for
    # $0.1974, a step $0.000109667.
    assert msgspec.json.decode(pod.pop("work_units")) == {"steps": 1800}
    per_unit = msgspec.json.decode(pod.pop("cost_per_unit"))
    assert per_unit["steps"] == pytest.approx(0.1974 / 1800, rel=1e-12)
    assert gpus[0]["uuid"] == GPU_0
    assert gpus[0]["share"] == pytest.approx(0.86)
    assert pod == {
        "namespace": "ml", "pod": "train-0", "node": "gpu-node-17",
        "labels": '{"project":"llm-pretrain","team":"vision"}',
        "state": "stalled", "state_since": "400000", "reason": "Idle",
        "vram_bytes": "61203283968", "share": "0.86",
        "cost_usd": "0.197400000", "waste_usd": "0.016600000",
        "window_start": str(2 * MIN), "updated_at": "400000",
    }  # fmt: skip
    assert client.hget(f"{prefix}pod:{POD_UID_2}", "state") == "running"
    assert client.zrange(f"{prefix}state:stalled", 0, -1, withscores=True) == [(POD_UID, 400000.0)]
    assert client.zrange(f"{prefix}state:running", 0, -1, withscores=True) == [(POD_UID_2, 3000.0)]
    assert client.zcard(f"{prefix}state:queued") == 0
    assert client.zrevrange(f"{prefix}waste:pods", 0, -1, withscores=True) == [
        (POD_UID_2, 0.02),
        (POD_UID, 0.0166),
    ]
    ns = client.zrevrange(f"{prefix}waste:namespaces", 0, -1, withscores=True)
    assert ns == [("research", 0.02), ("ml", 0.0166)]
    timeline = client.xrange(f"{prefix}timeline:{POD_UID}")
    assert [entry_id for entry_id, _ in timeline] == [
        "1000-0",
        "2000-0",
        "400000-0",
        "400000-1",
        "500000-0",
    ]
    assert [e.get("to_state") or e["status"] for _, e in timeline] == [
        "queued",
        "running",
        "stalled",
        "firing",
        "resolved",
    ]
    assert timeline[0][1]["reason"] == "Unschedulable"
    assert [e["fingerprint"] for _, e in client.xrange(f"{prefix}alerts")] == [
        "fp-stall",
        "fp-idle",
        "fp-stall",
    ]
    firing = client.hgetall(f"{prefix}alerts:firing")
    assert list(firing) == ["fp-idle"]
    assert msgspec.json.decode(firing["fp-idle"], type=Alert).name == "GpuIdleAllocated"
    gpu = client.hgetall(f"{prefix}gpu:{GPU_0}")
    shown = ("node", "util_pct", "mem_used_bytes", "pods", "idle_since", "updated_at")
    assert {k: gpu[k] for k in shown} == {
        "node": "gpu-node-17", "util_pct": "2.0", "mem_used_bytes": "7",
        "pods": f'["{POD_UID}"]', "idle_since": "300000", "updated_at": "420000",
    }  # fmt: skip
    assert client.zrange(f"{prefix}gpus", 0, -1) == [GPU_0]
    assert client.hget(f"{prefix}gpu:{GPU_1}", "window_idle_seconds") == "36.0"
    assert all(has_ttl is False for _, _, has_ttl in snapshot(client, prefix).values())


def test_same_records_applied_twice_leave_identical_state(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    records = scenario()
    with make_sink(stack, prefix) as sink:
        sink.apply(records)
        first = snapshot(client, prefix)
        sink.apply(records)
        for record in records:
            sink.apply([record])
        assert snapshot(client, prefix) == first
    assert len(first) > 20


def test_older_transition_does_not_overwrite_newer_state(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    with make_sink(stack, prefix) as sink:
        sink.apply([move(POD_UID, 2000, "running", "queued")])
        sink.apply([move(POD_UID, 1000, "queued", reason="Unschedulable")])
        assert client.hmget(f"{prefix}pod:{POD_UID}", "state", "state_since", "reason") == [
            "running",
            "2000",
            "",
        ]
        assert client.zrange(f"{prefix}state:running", 0, -1) == [POD_UID]
        assert client.zcard(f"{prefix}state:queued") == 0
        sink.apply([move(POD_UID, 9000, "finished", "running", "Completed")])
        sink.apply([move(POD_UID, 9500, "running", "queued")])  # finished is terminal
        assert client.hmget(f"{prefix}pod:{POD_UID}", "state", "state_since") == [
            "finished",
            "9000",
        ]
        assert [client.xlen(f"{prefix}timeline:{POD_UID}")] == [4]


def test_finished_pod_expires_and_leaves_the_other_state_sets(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    ttl = 600
    with make_sink(stack, prefix, ttl=ttl) as sink:
        sink.apply([move(POD_UID_2, 1000, "finished", "running", "Completed")])  # long before
        sink.apply([move(POD_UID, 1000, "running"), window(POD_UID, 0, 0.001)])
        sink.apply([move(POD_UID, ttl * 1000 + 5000, "finished", "running", "OOMKilled")])
        sink.apply([window(POD_UID, MIN, 0.002, state="finished")])  # the last window closes later
        sink.apply([alert("fp-late", "resolved", ttl * 1000 + 6000, POD_UID)])
        for key in (
            f"pod:{POD_UID}",
            f"pod:{POD_UID}:windows",
            f"timeline:{POD_UID}",
            f"timeline:{POD_UID}:seen",
        ):
            assert 0 < client.ttl(prefix + key) <= ttl, key
        assert client.ttl(f"{prefix}pod:{POD_UID_2}") > 0
        assert client.zrange(f"{prefix}state:finished", 0, -1) == [POD_UID]  # the old one trimmed
        assert client.zcard(f"{prefix}state:running") == 0
        assert client.hget(f"{prefix}pod:{POD_UID}", "waste_usd") == "0.003000000"
        assert client.xlen(f"{prefix}timeline:{POD_UID}") == 3


def test_waste_leaderboards_cover_the_last_hour(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    old, other, fresh = "pod-old", "pod-other", "pod-fresh"
    with make_sink(stack, prefix) as sink:
        sink.apply([window(old, 0, 0.5), window(other, 0, 0.25), window(other, 30 * MIN, 0.25)])
        assert client.zscore(f"{prefix}waste:namespaces", "ml") == 1.0
        sink.apply([window(fresh, HOUR + MIN, 0.125, namespace="team-b")])  # the hour moves past 0
        before = snapshot(client, prefix)
        sink.apply([window(old, 0, 0.5), window(other, 0, 0.25)])  # replayed, too old now
        assert snapshot(client, prefix) == before
    assert client.zrevrange(f"{prefix}waste:pods", 0, -1, withscores=True) == [
        (other, 0.25),
        (fresh, 0.125),
    ]
    assert client.zrevrange(f"{prefix}waste:namespaces", 0, -1, withscores=True) == [
        ("ml", 0.25),
        ("team-b", 0.125),
    ]
    assert client.exists(f"{prefix}waste:pods:0", f"{prefix}waste:namespaces:0") == 0
    assert client.zrange(f"{prefix}waste:windows", 0, -1) == [str(30 * MIN), str(HOUR + MIN)]
    assert client.hget(f"{prefix}pod:{old}", "waste_usd") == "0.500000000"  # lifetime total stays


def gpu_window(ws: int, idle: float, **kw: Any) -> GpuWindow:
    """The example GPU's window from `ws`, `idle` seconds of it idle."""
    fields = {"window_start": ws, "window_end": ws + MIN, "ts": ws + MIN, "idle_seconds": idle}
    return _record("gpuwatch.gpu.window/v1", GpuWindow, **fields, **kw)


def revised() -> tuple[list[SinkRecord], list[SinkRecord]]:
    """A pod's and a GPU's window as first emitted and as revised by late data (more cost,
    waste and units of work, more idle seconds), with the pod's next window."""
    units = {"work_units": {"steps": 600.0}}
    first: list[SinkRecord] = [window(POD_UID, MIN, 0.0033, **units), gpu_window(MIN, 30.0)]
    later: list[SinkRecord] = [window(POD_UID, 2 * MIN, 0.01)]
    again: list[SinkRecord] = [
        window(POD_UID, MIN, 0.0133, cost=0.0758, revision=1, work_units={"steps": 700.0}),
        gpu_window(MIN, 45.0, revision=1),
    ]
    return [*first, *later], [*again, *later]


def test_a_revised_window_moves_the_totals_by_its_difference_and_a_lower_one_not_at_all(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    history, alone = revised()
    first = history[:2]
    other = f"gwtest-{uuid.uuid4().hex[:10]}:"
    try:
        with make_sink(stack, prefix) as sink, make_sink(stack, other) as reference:
            sink.apply(history)
            sink.apply(alone[:2])  # revision 1
            sink.apply(first)  # revision 0 again, after 1
            sink.apply([*first, *alone[:2], *first])  # all in one batch
            reference.apply(alone)
        assert snapshot(client, prefix) == snapshot(client, other)
    finally:
        _drop(client, other)
    pod = client.hgetall(f"{prefix}pod:{POD_UID}")
    assert (pod["cost_usd"], pod["waste_usd"]) == ("0.141600000", "0.023300000")
    assert msgspec.json.decode(pod["work_units"]) == {"steps": 700 + 600}
    assert client.zscore(f"{prefix}waste:pods", POD_UID) == pytest.approx(0.0233)
    windows = client.hgetall(f"{prefix}pod:{POD_UID}:windows")
    assert (windows[f"rev:{MIN}"], windows[f"cost:{MIN}"]) == ("1", "75800000")
    gpu = client.hgetall(f"{prefix}gpu:{GPU_1}")
    assert (gpu["window_idle_seconds"], gpu["window_revision"]) == ("45.0", "1")


def test_a_later_gpu_window_of_revision_0_clears_the_revision_it_shows(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    with make_sink(stack, prefix) as sink:
        sink.apply([gpu_window(MIN, 30.0), gpu_window(MIN, 45.0, revision=2)])
        sink.apply([gpu_window(2 * MIN, 10.0)])
    gpu = client.hgetall(f"{prefix}gpu:{GPU_1}")
    assert (gpu["window_start"], gpu["window_idle_seconds"]) == (str(2 * MIN), "10.0")
    assert "window_revision" not in gpu


def test_a_named_clusters_pods_and_namespaces_are_written_as_its_own(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    # The same namespace in the default cluster and in `east`: two leaderboard members;
    # the default cluster's hash has no cluster field, east's has one.
    with make_sink(stack, prefix) as sink:
        sink.apply([move("pod-d", 1000, "running"), move("pod-e", 1000, "running", cluster="east")])
        sink.apply([window("pod-d", 0, 0.5), window("pod-e", 0, 0.25, cluster="east")])
    assert client.zrevrange(f"{prefix}waste:namespaces", 0, -1, withscores=True) == [
        ("ml", 0.5),
        ("east/ml", 0.25),
    ]
    assert "cluster" not in client.hgetall(f"{prefix}pod:pod-d")
    assert client.hget(f"{prefix}pod:pod-e", "cluster") == "east"
    assert client.hget(f"{prefix}pod:pod-e", "waste_usd") == "0.250000000"


def test_timeline_is_capped_and_deduplicates_past_the_cap(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    moves = [move(POD_UID, 1000 + i, "stalled" if i % 2 else "running") for i in range(350)]
    with make_sink(stack, prefix, timeline_maxlen=100) as sink:
        sink.apply(moves)
        length, last = (
            client.xlen(f"{prefix}timeline:{POD_UID}"),
            client.xrevrange(f"{prefix}timeline:{POD_UID}", count=1),
        )
        sink.apply(moves)
        assert client.xlen(f"{prefix}timeline:{POD_UID}") == length
        assert client.xrevrange(f"{prefix}timeline:{POD_UID}", count=1) == last
    assert 100 <= length < 350  # MAXLEN ~ trims whole radix-tree nodes
    assert last[0][0] == "1349-0"
    assert client.zcard(f"{prefix}timeline:{POD_UID}:seen") == 100


def test_late_timeline_entry_keeps_ids_increasing(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    with make_sink(stack, prefix) as sink:
        sink.apply([move(POD_UID, 5000, "running")])
        sink.apply([alert("fp", "firing", 4000, POD_UID)])
    entries = client.xrange(f"{prefix}timeline:{POD_UID}")
    assert [(i, e["ts"]) for i, e in entries] == [("5000-0", "5000"), ("5000-1", "4000")]


def test_resolution_is_not_undone_by_an_older_firing(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    with make_sink(stack, prefix) as sink:
        sink.apply([alert("fp", "resolved", 200)])
        sink.apply([alert("fp", "firing", 100)])
        assert client.hlen(f"{prefix}alerts:firing") == 0
        sink.apply([alert("fp", "firing", 300)])
        assert client.hkeys(f"{prefix}alerts:firing") == ["fp"]
        assert client.xlen(f"{prefix}alerts") == 3


def test_older_gpu_sample_does_not_overwrite_newer(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    with make_sink(stack, prefix) as sink:
        sink.apply([live(GPU_0, 2000, 90.0, None)])
        sink.apply([live(GPU_0, 1000, 1.0, 500)])
    assert client.hmget(f"{prefix}gpu:{GPU_0}", "util_pct", "idle_since", "updated_at") == [
        "90.0",
        "",
        "2000",
    ]


H100 = "NVIDIA-H100-80GB-HBM3/nvidia.com/gpu"  # keyed by the nodes' gpu.product label


def test_capacity_keeps_the_latest_picture_of_each_key(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    newest = capacity(3000, {"n2": 1})
    east = capacity(1000, {"n9": 4}, cluster="east")
    with make_sink(stack, prefix) as sink:
        sink.apply([capacity(2000, {"n1": 2}), east])
        sink.apply([newest, capacity(1000, {"n1": 8})])  # the older one comes late
        sink.apply([capacity(2000, {"n1": 2})])  # read again
    stored = client.hgetall(f"{prefix}capacity")
    assert set(stored) == {H100, f"east/{H100}"}
    assert msgspec.json.decode(stored[H100], type=Capacity) == newest
    assert msgspec.json.decode(stored[f"east/{H100}"], type=Capacity) == east
    assert client.ttl(f"{prefix}capacity") == -1  # the picture now: it does not expire


def test_capacity_records_of_one_ts_settle_on_one_whatever_the_order(
    stack: Settings, client: redis.Redis
) -> None:
    one, other = capacity(5000, {"n1": 2}), capacity(5000, {"n1": 1, "n2": 1})
    seen = []
    for order in ([one, other], [other, one]):
        prefix = f"gwtest-{uuid.uuid4().hex[:10]}:"
        try:
            with make_sink(stack, prefix) as sink:
                for record in order:
                    sink.apply([record])
            seen.append(client.hget(f"{prefix}capacity", H100))
        finally:
            _drop(client, prefix)
    assert seen[0] == seen[1]
    assert seen[0] is not None


def kueue(uid: str, ts: int, type_: str = "MODIFIED", **kw: Any) -> K8sWorkload:
    return _record("gpuwatch.k8s.workload/v1", K8sWorkload, uid=uid, ts=ts, type=type_, **kw)


def test_kueue_workloads_keep_their_latest_record_until_deleted(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    waiting, admitted = kueue("w1", 1000), kueue("w1", 2000, cluster_queue="research")
    other = kueue("w2", 1500)
    with make_sink(stack, prefix) as sink:
        sink.apply([waiting, other])
        sink.apply([admitted, kueue("w1", 500)])  # an older one comes late: kept out
        sink.apply([waiting])  # read again
        stored = client.hgetall(f"{prefix}workloads")
        assert set(stored) == {"w1", "w2"}
        assert msgspec.json.decode(stored["w1"], type=K8sWorkload) == admitted
        # Deleted, even at the ts of the record it follows; an older replay stays out.
        sink.apply([kueue("w2", 1500, "DELETED"), kueue("w1", 3000, "DELETED")])
        sink.apply([kueue("w1", 2500)])
    assert client.hgetall(f"{prefix}workloads") == {}
    assert client.zrange(f"{prefix}workloads:deleted", 0, -1, withscores=True) == [
        ("w2", 1500.0), ("w1", 3000.0)
    ]  # fmt: skip


def test_a_workloads_writes_of_one_time_settle_on_the_later_version(
    stack: Settings, client: redis.Redis
) -> None:
    """Kueue creates a workload and admits it in the same second: the later resource
    version is the workload now, whatever order the records come in."""
    created = kueue("w1", 1000, resource_version="41")
    admitted = kueue("w1", 1000, resource_version="42", cluster_queue="research")
    for order in ([created, admitted], [admitted, created], [[created, admitted]]):
        prefix = f"gwtest-{uuid.uuid4().hex[:10]}:"
        try:
            with make_sink(stack, prefix) as sink:
                for batch in order:
                    sink.apply(batch if isinstance(batch, list) else [batch])
            stored = client.hget(f"{prefix}workloads", "w1")
            assert stored is not None
            assert msgspec.json.decode(stored, type=K8sWorkload) == admitted, order
        finally:
            _drop(client, prefix)


def test_a_fragmentation_block_is_a_pod_alert_until_resolved(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    labels = {"namespace": "ml", "pod": "big-train-0", "resource": "nvidia.com/gpu",
              "models": "any", "wanted": "4", "best_node": "h100-2", "best_free": "2",
              "fleet_free": "6"}  # fmt: skip
    subject = {"kind": "pod", "uid": POD_UID, "uuid": None, "node": None}
    fields = {"name": "PodBlockedByFragmentation", "fingerprint": "fp-frag", "since": 1000}
    fields |= {"subject": subject, "labels": labels, "value": 4.0, "severity": "warning"}
    firing = _record("gpuwatch.alert/v1", Alert, status="firing", ts=1000, **fields)
    with make_sink(stack, prefix) as sink:
        sink.apply([move(POD_UID, 500, "queued", reason="Unschedulable", node=None), firing])
        shown = client.hget(f"{prefix}alerts:firing", "fp-frag")
        assert shown is not None
        assert msgspec.json.decode(shown, type=Alert) == firing
        sink.apply([msgspec.structs.replace(firing, status="resolved", ts=9000)])
    assert client.hgetall(f"{prefix}alerts:firing") == {}
    timeline = [entry for _, entry in client.xrange(f"{prefix}timeline:{POD_UID}")]
    assert [e.get("name") or e["to_state"] for e in timeline] == [
        "queued", "PodBlockedByFragmentation", "PodBlockedByFragmentation"
    ]  # fmt: skip
    assert [e.get("status") for e in timeline[1:]] == ["firing", "resolved"]
    assert msgspec.json.decode(timeline[1]["labels"]) == labels
    assert [e["name"] for _, e in client.xrange(f"{prefix}alerts")] == [
        "PodBlockedByFragmentation"
    ] * 2


def test_wrong_key_type_is_rejected_for_good(
    stack: Settings, client: redis.Redis, prefix: str
) -> None:
    client.set(f"{prefix}pod:{POD_UID}", "not a hash")
    with make_sink(stack, prefix) as sink, pytest.raises(SinkRejected, match="WRONGTYPE"):
        sink.apply([move(POD_UID, 1000, "running")])


def _batches(records: Sequence[SinkRecord], cuts: list[int]) -> list[list[SinkRecord]]:
    edges = [0, *sorted({c % (len(records) + 1) for c in cuts}), len(records)]
    return [list(records[a:b]) for a, b in itertools.pairwise(edges) if b > a]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), cuts=st.lists(st.integers(0, 100), max_size=4))
def test_any_arrival_order_converges_to_the_same_state(
    stack: Settings, client: redis.Redis, seed: int, cuts: list[int]
) -> None:
    records = [
        *scenario(),
        window(POD_UID, HOUR + 5 * MIN, 0.07),
        move(POD_UID, 900_000, "finished", "stalled", "Deleted"),
        capacity(1000, {"n1": 2}),
        capacity(2000, {"n2": 1}),
        capacity(2000, {"n1": 1}),  # the same ts: one of the two, whatever the order
        capacity(1500, {"n3": 3}, cluster="east"),
        window(POD_UID, MIN, 0.0133, cost=0.0758, revision=1),  # late data revised it
        _record("gpuwatch.gpu.window/v1", GpuWindow, idle_seconds=40.0, revision=1),
    ]
    shuffled = records[:]
    random.Random(seed).shuffle(shuffled)
    ordered, mixed = f"gwtest-{uuid.uuid4().hex[:10]}:", f"gwtest-{uuid.uuid4().hex[:10]}:"
    try:
        with make_sink(stack, ordered) as a, make_sink(stack, mixed) as b:
            a.apply(records)
            for batch in _batches(shuffled, cuts):
                b.apply(batch)
        assert snapshot(client, mixed, stream_ids=False) == snapshot(
            client, ordered, stream_ids=False
        )
    finally:
        _drop(client, ordered)
        _drop(client, mixed)
