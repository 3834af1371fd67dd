"""The Redis sink's pure planning: keys, script calls and their arguments, without Redis."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.harness.examples import GPU_0, GPU_1, POD_UID, POD_UID_2, example
from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.capacity import Capacity
from schemas.gpu_window import GpuWindow
from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from sinks.redis.keys import RedisKeys
from sinks.redis.plan import (
    GPU_LIVE_CHUNK,
    Command,
    GpuLive,
    PlanOptions,
    gpu_live_states,
    plan,
)

OPTS = PlanOptions(keys=RedisKeys("t:"), finished_ttl_s=600, timeline_maxlen=50)


T = TypeVar("T")


def _record(schema: str, cls: type[T], **changes: Any) -> T:
    return msgspec.convert({**example(schema), **changes}, cls)


def lifecycle(**changes: Any) -> PodLifecycle:
    return _record("gpuwatch.pod.lifecycle/v1", PodLifecycle, **changes)


def attribution(**changes: Any) -> Attribution:
    return _record("gpuwatch.attribution/v1", Attribution, **changes)


def alert(**changes: Any) -> Alert:
    return _record("gpuwatch.alert/v1", Alert, **changes)


def gpu(uuid: str = GPU_0, ts: int = 1000, **changes: Any) -> GpuLive:
    fields: dict[str, Any] = {
        "uuid": uuid,
        "node": "gpu-node-17",
        "model": "H100",
        "sharing": "exclusive",
        "parent_uuid": None,
        "ts": ts,
        "util_pct": 3.0,
        "mem_used_bytes": 10,
        "mem_total_bytes": 80,
        "pods": (POD_UID,),
        "idle_since": 500,
    }
    return GpuLive(**{**fields, **changes})


def args_of(command: Command) -> dict[str, str]:
    """The field/value tail of an XADD or HSET-like call, from its first field name on."""
    start = {"timeline_add": 4, "hset_if_newer": 5}.get(command.script, 3)
    tail = command.args[start:]
    return dict(zip(tail[::2], tail[1::2], strict=True))


def test_keys_follow_design_section_5() -> None:
    keys = RedisKeys()
    assert keys.pod("u1") == "gpuwatch:pod:u1"
    assert keys.gpu("GPU-1") == "gpuwatch:gpu:GPU-1"
    assert keys.states() == tuple(
        f"gpuwatch:state:{s}" for s in ("queued", "running", "stalled", "finished")
    )
    assert (keys.waste_pods(), keys.waste_namespaces()) == (
        "gpuwatch:waste:pods",
        "gpuwatch:waste:namespaces",
    )
    assert keys.timeline("u1") == "gpuwatch:timeline:u1"
    assert (keys.alerts(), keys.alerts_firing()) == ("gpuwatch:alerts", "gpuwatch:alerts:firing")
    assert keys.pod_keys("u1") == (
        "gpuwatch:pod:u1",
        "gpuwatch:pod:u1:windows",
        "gpuwatch:timeline:u1",
        "gpuwatch:timeline:u1:seen",
    )
    assert keys.waste_pods_window(60000) == "gpuwatch:waste:pods:60000"
    assert keys.capacity() == "gpuwatch:capacity"


def test_key_prefix_is_validated_and_escaped_for_scan() -> None:
    with pytest.raises(ValueError, match="key prefix"):
        RedisKeys("bad prefix*")
    assert RedisKeys("gwtest-{ab}:").pattern() == "gwtest-{ab}:*"
    assert RedisKeys("a.b:").pattern() == "a.b:*"


def test_lifecycle_plans_timeline_entry_then_transition() -> None:
    record = lifecycle(to_state="finished", from_state="running", reason="Completed", ts=5000)
    entry, transition = plan([record], OPTS)
    assert entry.script == "timeline_add"
    assert entry.keys == ("t:timeline:" + POD_UID, f"t:timeline:{POD_UID}:seen", "t:pod:" + POD_UID)
    assert entry.args[:4] == ("transition:5000:running:finished", "5000", "50", "600")
    assert args_of(entry)["to_state"] == "finished"
    assert args_of(entry)["reason"] == "Completed"
    assert transition.script == "pod_transition"
    assert transition.keys[4:] == tuple(
        f"t:state:{s}" for s in ("queued", "running", "stalled", "finished")
    )
    labels = '{"project":"llm-pretrain","team":"vision"}'
    assert transition.args == (
        POD_UID,
        "5000",
        "finished",
        "Completed",
        "ml",
        "train-0",
        "gpu-node-17",
        labels,
        "600",
        "",  # the cluster: none named
    )


def test_lifecycle_nulls_are_empty_strings_and_labels_sorted() -> None:
    record = lifecycle(from_state=None, reason=None, node=None, labels={"z": "1", "a": "2"})
    entry, transition = plan([record], OPTS)
    assert args_of(entry)["from_state"] == ""
    assert transition.args[3] == ""  # reason
    assert transition.args[6] == ""  # node
    assert transition.args[7] == '{"a":"2","z":"1"}'


def test_attribution_plans_exact_nano_dollars_and_window_keys() -> None:
    (command,) = plan([attribution(cost_usd=0.0658, waste_usd=0.0033)], OPTS)
    assert command.script == "pod_window"
    ws = 1764412320000
    assert command.keys[4:] == (
        f"t:waste:pods:{ws}",
        f"t:waste:namespaces:{ws}",
        "t:waste:pods",
        "t:waste:namespaces",
        "t:waste:windows",
    )
    uid, ns, pod, node, _labels, start, end, cost, waste = command.args[:9]
    assert (uid, ns, pod, node) == (POD_UID, "ml", "train-0", "gpu-node-17")
    assert (start, end) == (str(ws), "1764412380000")
    assert (cost, waste) == ("65800000", "3300000")
    vram, share, gpus, state, ttl, hour = command.args[9:15]
    assert vram == "61203283968"
    assert float(share) == pytest.approx(51.6 / 60)
    assert msgspec.json.decode(gpus)[0]["uuid"] == GPU_0
    assert (state, ttl, hour) == ("running", "600", "3600000")
    assert command.args[15:18] == ("t:waste:pods:", "t:waste:namespaces:", "")
    # The example pod reports its steps: the window's units, as JSON; then the revision.
    assert command.args[18:] == ('{"steps":600.0}', "0")


def test_a_pod_without_units_of_work_plans_none() -> None:
    (command,) = plan([attribution(work_units={}, cost_per_unit={})], OPTS)
    assert command.args[18:] == ("", "0")


def test_attribution_share_is_unknown_without_a_reading() -> None:
    (command,) = plan([attribution(method="unknown")], OPTS)
    assert command.args[10] == ""
    (command,) = plan([attribution(allocated_gpu_seconds=0.0, used_gpu_seconds=0.0)], OPTS)
    assert command.args[10] == ""


def test_alert_on_a_pod_goes_to_firing_set_stream_and_pod_timeline() -> None:
    subject = {"kind": "pod", "uid": POD_UID_2, "uuid": None, "node": "gpu-node-17"}
    record = alert(name="PodStalled", subject=subject)
    state, stream, timeline = plan([record], OPTS)
    assert state.script == "alert_state"
    assert state.keys == ("t:alerts:firing", "t:alerts:last")
    assert state.args[:3] == ("b1946ac92492d234", "firing", "1764412380000")
    assert msgspec.json.decode(state.args[3], type=Alert) == record
    assert state.args[4] == "600000"
    assert stream.keys == ("t:alerts", "t:alerts:seen")
    assert stream.args[:4] == (
        "alert:b1946ac92492d234:firing:1764412380000",
        "1764412380000",
        "10000",
        "0",
    )
    assert timeline.keys[0] == f"t:timeline:{POD_UID_2}"
    assert args_of(timeline)["name"] == "PodStalled"
    assert args_of(timeline) == args_of(stream)


def test_alert_on_a_gpu_naming_no_pod_uid_has_no_pod_timeline() -> None:
    commands = plan([alert()], OPTS)
    assert [c.script for c in commands] == ["alert_state", "timeline_add"]


def test_a_gpu_fault_goes_to_the_timeline_of_every_pod_it_names() -> None:
    subject = {"kind": "gpu", "uid": None, "uuid": GPU_0, "node": "gpu-node-17"}
    shared = {"gpu": GPU_0, "node": "gpu-node-17", "pods": "ml/a,ml/b"}
    shared |= {"pod_uids": f"{POD_UID},{POD_UID_2}"}
    record = alert(name="GpuXidError", subject=subject, labels=shared)
    _, stream, first, second = plan([record], OPTS)
    assert (first.keys[0], second.keys[0]) == (f"t:timeline:{POD_UID}", f"t:timeline:{POD_UID_2}")
    assert args_of(first) == args_of(second) == args_of(stream)
    one = alert(name="GpuThrottled", subject=subject, labels={"gpu": GPU_0, "pod_uid": POD_UID})
    _, _, timeline = plan([one], OPTS)
    assert timeline.keys[0] == f"t:timeline:{POD_UID}"


def capacity(**changes: Any) -> Capacity:
    return _record("gpuwatch.capacity/v1", Capacity, **changes)


def test_capacity_goes_to_its_field_of_the_capacity_hash_as_the_records_json() -> None:
    (command,) = plan([capacity()], OPTS)
    assert command.script == "field_if_newer"
    assert command.keys == ("t:capacity",)
    assert command.args[:2] == ("NVIDIA-H100-80GB-HBM3/nvidia.com/gpu", "1764412380000")
    assert msgspec.json.decode(command.args[2], type=Capacity) == capacity()
    assert msgspec.json.decode(command.args[2]) == example("gpuwatch.capacity/v1")
    assert '"cluster"' not in command.args[2]  # the default cluster's, as its record


def test_a_named_clusters_capacity_has_a_field_of_its_own_and_says_its_cluster() -> None:
    (east,) = plan([capacity(cluster="east", free=0, free_by_node={})], OPTS)
    assert east.args[0] == "east/NVIDIA-H100-80GB-HBM3/nvidia.com/gpu"
    assert msgspec.json.decode(east.args[2])["cluster"] == "east"
    (mig,) = plan([capacity(resource="nvidia.com/mig-1g.10gb")], OPTS)
    assert mig.args[0] == "NVIDIA-H100-80GB-HBM3/nvidia.com/mig-1g.10gb"


def test_equal_capacity_records_are_equal_strings_and_planned_once() -> None:
    shuffled = dict(reversed(list(example("gpuwatch.capacity/v1").items())))
    same = msgspec.convert(shuffled, Capacity)
    assert plan([capacity(), same], OPTS) == plan([capacity()], OPTS)


@given(st.permutations([(0, 2), (5, 1), (5, 3), (2, 9)]))
def test_a_batch_plans_the_capacity_record_the_hash_would_keep_in_any_order(
    order: list[tuple[int, int]],
) -> None:
    """The latest ts, then the greater JSON, as field_if_newer.lua decides."""
    batch = [capacity(ts=1000 + ts, free=n, free_by_node={"n1": n}) for ts, n in order]
    batch.append(capacity(cluster="east"))
    default, east = sorted(plan(batch, OPTS), key=lambda c: c.args[0])  # "N" < "e"
    assert east.args[0].startswith("east/")
    assert default.args[1] == "1005"
    assert msgspec.json.decode(default.args[2])["free"] == 3  # '"free":3' > '"free":1'


def test_pod_blocked_by_fragmentation_goes_to_firing_set_stream_and_pod_timeline() -> None:
    subject = {"kind": "pod", "uid": POD_UID, "uuid": None, "node": None}
    labels = {
        "namespace": "ml", "pod": "big-train-0", "resource": "nvidia.com/gpu", "models": "any",
        "wanted": "4", "best_node": "h100-2", "best_free": "2", "fleet_free": "6",
    }  # fmt: skip
    record = alert(
        name="PodBlockedByFragmentation", subject=subject, labels=labels, value=4.0,
        summary="ml/big-train-0 wants 4 nvidia.com/gpu: best node h100-2 has 2 free, "
        "6 free over the nodes it could use",
    )  # fmt: skip
    state, stream, timeline = plan([record], OPTS)
    assert (state.script, state.args[1]) == ("alert_state", "firing")
    assert msgspec.json.decode(state.args[3], type=Alert) == record
    assert stream.keys == ("t:alerts", "t:alerts:seen")
    assert timeline.keys == (
        f"t:timeline:{POD_UID}", f"t:timeline:{POD_UID}:seen", f"t:pod:{POD_UID}"
    )  # fmt: skip
    fields = args_of(timeline)
    assert fields == args_of(stream)
    assert (fields["name"], fields["value"]) == ("PodBlockedByFragmentation", "4.0")
    assert msgspec.json.decode(fields["labels"]) == labels
    resolved = plan([msgspec.structs.replace(record, status="resolved")], OPTS)
    assert [c.script for c in resolved] == ["alert_state", "timeline_add", "timeline_add"]


def test_gpu_live_is_coalesced_to_the_newest_reading_per_gpu_in_batch_order() -> None:
    batch = [gpu(GPU_0, 1000), gpu(GPU_1, 900), gpu(GPU_0, 3000, util_pct=None), gpu(GPU_0, 2000)]
    (command,) = plan(batch, OPTS)
    assert command.script == "gpu_live"
    assert command.keys == ("t:gpus", "t:gpu:" + GPU_1, "t:gpu:" + GPU_0)
    first, second = msgspec.json.decode(command.args[0])
    assert first[:2] == [GPU_1, "900"]
    assert second[:2] == [GPU_0, "3000"]
    fields = dict(zip(second[2::2], second[3::2], strict=True))
    assert fields == {
        "node": "gpu-node-17",
        "model": "H100",
        "sharing": "exclusive",
        "parent_uuid": "",
        "util_pct": "",
        "mem_used_bytes": "10",
        "mem_total_bytes": "80",
        "pods": f'["{POD_UID}"]',
        "idle_since": "500",
    }


def test_gpu_live_goes_out_in_calls_of_a_bounded_number_of_gpus() -> None:
    gpus = [gpu(f"GPU-{n:04d}", 1000) for n in range(GPU_LIVE_CHUNK + 1)]
    commands = plan([lifecycle(), *gpus], OPTS)
    assert [c.script for c in commands] == ["timeline_add", "pod_transition", *["gpu_live"] * 2]
    assert [len(c.keys) - 1 for c in commands[2:]] == [GPU_LIVE_CHUNK, 1]
    assert [len(msgspec.json.decode(c.args[0])) for c in commands[2:]] == [GPU_LIVE_CHUNK, 1]
    assert commands[3].keys[1] == f"t:gpu:GPU-{GPU_LIVE_CHUNK:04d}"


def test_gpu_window_writes_window_fields_only() -> None:
    window = _record("gpuwatch.gpu.window/v1", GpuWindow)
    (command,) = plan([window], OPTS)
    assert command.keys == ("t:gpu:" + GPU_1,)
    assert command.args[:5] == ("window_start", "1764412320000", "window_revision", "0", GPU_1)
    fields = args_of(command)
    assert fields["window_idle_seconds"] == "36.0"
    assert fields["window_unattributed_ratio"] == "0.08"
    assert "updated_at" not in fields


def test_a_record_repeated_in_a_batch_is_planned_once() -> None:
    once = plan([lifecycle(), attribution(), alert()], OPTS)
    twice = plan([lifecycle(), attribution(), lifecycle(), alert(), attribution(), alert()], OPTS)
    assert twice == once


def test_a_window_repeated_in_a_batch_is_planned_as_its_highest_revision() -> None:
    first, revised = attribution(), attribution(cost_usd=0.0758, revision=1)
    commands = plan([first, lifecycle(), revised, first], OPTS)
    assert commands == plan([revised, lifecycle()], OPTS)
    assert commands[0].args[7:9] == ("75800000", "3300000")
    assert commands[0].args[-1] == "1"
    window = _record("gpuwatch.gpu.window/v1", GpuWindow)
    later = msgspec.structs.replace(window, revision=2, idle_seconds=40.0)
    for batch in ([window, later, window], [later, window]):
        (command,) = plan(batch, OPTS)
        assert command.args[3] == "2"
        assert args_of(command)["window_idle_seconds"] == "40.0"


def test_gpu_live_states_from_a_node_sample() -> None:
    sample = msgspec.convert(example("gpuwatch.nvml.sample/v1"), NvmlSample)
    (live,) = gpu_live_states(sample, {GpuUuid(GPU_0): 1764412000000})
    assert live.uuid == GPU_0
    assert live.ts == sample.ts + sample.interval_ms
    assert live.pods == (POD_UID,)
    assert live.idle_since == 1764412000000
    assert live.util_pct == 87.0
    (unknown,) = gpu_live_states(sample, {})
    assert unknown.idle_since is None


def test_gpu_live_pods_include_unallocated_processes() -> None:
    raw = example("gpuwatch.nvml.sample/v1")
    raw["gpus"][0]["processes"][0]["pod_uid"] = POD_UID_2  # a leak: runs without allocation
    sample = msgspec.convert(raw, NvmlSample)
    (live,) = gpu_live_states(sample, {})
    assert live.pods == tuple(sorted((PodUid(POD_UID), PodUid(POD_UID_2))))


def test_options_reject_non_positive_limits() -> None:
    with pytest.raises(ValueError, match="timeline_maxlen"):
        PlanOptions(timeline_maxlen=0)


@given(
    st.lists(
        st.tuples(st.sampled_from([GPU_0, GPU_1]), st.integers(0, 10**6)), min_size=1, max_size=20
    )
)
def test_plan_is_deterministic_and_keeps_one_newest_reading_per_gpu(
    readings: list[tuple[str, int]],
) -> None:
    batch = [gpu(uuid, ts) for uuid, ts in readings]
    commands = plan(batch, OPTS)
    assert commands == plan(list(batch), OPTS)
    newest = {uuid: max(ts for u, ts in readings if u == uuid) for uuid, _ in readings}
    (command,) = commands
    rows = msgspec.json.decode(command.args[0])
    assert {row[0]: int(row[1]) for row in rows} == newest
    assert len(rows) == len(newest)
