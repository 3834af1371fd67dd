"""Many clusters into one Redis: each record's keys are its own, its hashes say its cluster."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from gpuwatch.harness.examples import example
from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.gpu_window import GpuWindow
from schemas.nvml_sample import NvmlSample
from schemas.pod_lifecycle import PodLifecycle
from sinks.redis.keys import RedisKeys
from sinks.redis.plan import Command, GpuLive, PlanOptions, SinkRecord, gpu_live_states, plan

OPTS = PlanOptions(keys=RedisKeys("t:"), finished_ttl_s=600, timeline_maxlen=50)
NODE = "gpu-node-17"  # the same node name in every cluster
SHARED = {  # the indexes every cluster writes into, one member per pod or GPU
    "t:gpus",
    *OPTS.keys.states(),
    "t:waste:pods",
    "t:waste:namespaces",
    "t:waste:windows",
    "t:alerts",
    "t:alerts:seen",
    "t:alerts:firing",
    "t:alerts:last",
}

T = TypeVar("T")


def _record(schema: str, cls: type[T], **changes: Any) -> T:
    return msgspec.convert({**example(schema), **changes}, cls)


def records(cluster: str | None, uid: str, uuid: str) -> list[SinkRecord]:
    """A pod `uid` on GPU `uuid` (index 0) of node gpu-node-17 of `cluster`: its transition,
    window, GPU window, live GPU state and a GPU alert. None: a record that names no cluster."""
    named = {} if cluster is None else {"cluster": cluster}
    raw = example("gpuwatch.nvml.sample/v1") | named
    raw["gpus"] = [raw["gpus"][0] | {"uuid": uuid, "index": 0}]
    raw["gpus"][0]["processes"] = [raw["gpus"][0]["processes"][0] | {"pod_uid": uid}]
    raw["allocations"] = [raw["allocations"][0] | {"pod_uid": uid, "device_ids": [uuid]}]
    sample = msgspec.convert(raw, NvmlSample)
    subject = {"kind": "gpu", "uid": None, "uuid": uuid, "node": NODE}
    return [
        _record("gpuwatch.pod.lifecycle/v1", PodLifecycle, uid=uid, node=NODE, **named),
        _record("gpuwatch.attribution/v1", Attribution, uid=uid, node=NODE, **named),
        _record("gpuwatch.gpu.window/v1", GpuWindow, uuid=uuid, node=NODE, **named),
        _record("gpuwatch.alert/v1", Alert, fingerprint=f"fp-{uuid}", subject=subject, **named),
        *gpu_live_states(sample, {uuid: None}),
    ]


def own_keys(commands: list[Command]) -> set[str]:
    """Every key the commands write but the shared indexes and per-window leaderboards."""
    return {
        key
        for command in commands
        for key in command.keys
        if key not in SHARED and not key.startswith("t:waste:")
    }


def hash_fields(commands: list[Command], script: str) -> dict[str, str]:
    """The field/value pairs of the first `script` call (HSET-like or XADD arguments)."""
    (command, *_) = [c for c in commands if c.script == script]
    if script == "gpu_live":
        (row,) = msgspec.json.decode(command.args[0])
        return dict(zip(row[2::2], row[3::2], strict=True))
    tail = command.args[4:] if script == "timeline_add" else command.args[3:]
    return dict(zip(tail[::2], tail[1::2], strict=True))


def test_two_clusters_with_one_node_name_write_keys_of_their_own() -> None:
    east = plan(records("east", "uid-east", "GPU-east-0"), OPTS)
    west = plan(records("west", "uid-west", "GPU-west-0"), OPTS)
    assert own_keys(east) == {
        "t:pod:uid-east",
        "t:pod:uid-east:windows",
        "t:timeline:uid-east",
        "t:timeline:uid-east:seen",
        "t:gpu:GPU-east-0",
    }
    assert own_keys(east).isdisjoint(own_keys(west))
    every_key = [key for command in east + west for key in command.keys]
    assert not [key for key in every_key if NODE in key]  # no key is built from a node name


def test_each_hash_and_alert_entry_carries_its_records_cluster() -> None:
    for cluster in ("east", "west"):
        commands = plan(records(cluster, f"uid-{cluster}", f"GPU-{cluster}-0"), OPTS)
        (transition,) = [c for c in commands if c.script == "pod_transition"]
        (window,) = [c for c in commands if c.script == "pod_window"]
        assert transition.args[9] == cluster  # ARGV[10] of pod_transition.lua
        assert window.args[17] == cluster  # ARGV[18] of pod_window.lua
        assert hash_fields(commands, "gpu_live")["cluster"] == cluster
        assert hash_fields(commands, "hset_if_newer")["cluster"] == cluster
        (stream,) = [c for c in commands if c.keys[0] == "t:alerts"]
        assert hash_fields([stream], "timeline_add")["cluster"] == cluster
        (state,) = [c for c in commands if c.script == "alert_state"]
        assert msgspec.json.decode(state.args[3])["cluster"] == cluster


def test_records_that_name_no_cluster_write_no_cluster_field_and_keep_their_keys() -> None:
    # As their messages leave the field out: a single-cluster set-up writes the hashes it
    # wrote before clusters had names (readers take a missing field for the default).
    commands = plan(records(None, "uid-1", "GPU-1"), OPTS)
    (transition,) = [c for c in commands if c.script == "pod_transition"]
    (window,) = [c for c in commands if c.script == "pod_window"]
    assert (transition.args[9], window.args[17]) == ("", "")
    assert "cluster" not in hash_fields(commands, "gpu_live")
    assert "cluster" not in hash_fields(commands, "hset_if_newer")
    (state,) = [c for c in commands if c.script == "alert_state"]
    message = msgspec.json.decode(state.args[3])
    assert "cluster" not in message
    assert msgspec.convert(message, Alert).cluster == "default"  # still an alert message
    assert own_keys(commands) == {
        "t:pod:uid-1",
        "t:pod:uid-1:windows",
        "t:timeline:uid-1",
        "t:timeline:uid-1:seen",
        "t:gpu:GPU-1",
    }


def test_the_live_gpu_state_takes_the_samples_cluster() -> None:
    (state,) = [r for r in records("east", "u1", "GPU-1") if isinstance(r, GpuLive)]
    assert state.cluster == "east"
    (default,) = [r for r in records(None, "u1", "GPU-1") if isinstance(r, GpuLive)]
    assert default.cluster == "default"
