"""simple_node: a deterministic simulated node whose PIDs, pods and allocations agree."""

from __future__ import annotations

import uuid

import pytest

from gpuwatch.harness.simulate.gpus import GPU_MODELS
from gpuwatch.harness.simulate.node import DEFAULT_MIX, SimPods, sim_gpu_uuid, simple_node
from producers.agent.assemble import assemble_sample
from producers.base.ports import ReadResult

T0 = 1_764_374_400.0  # 2025-11-29 00:00 UTC


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def reads(node: str, seed: int, count: int = 30, gpus: int = 8) -> tuple[list[ReadResult], SimPods]:
    clock = Clock()
    reader, pods = simple_node(node, gpus, seed=seed, now=clock)
    results = []
    for _ in range(count):
        results.append(reader.read())
        clock.t += 1.0
    return results, pods


def test_the_same_seed_gives_the_same_node() -> None:
    first, pods_1 = reads("gpu-node-1", seed=3)
    second, pods_2 = reads("gpu-node-1", seed=3)

    assert first == second
    assert pods_1 == pods_2
    other, pods_3 = reads("gpu-node-1", seed=4)
    assert other != first
    assert set(pods_3.pods) != set(pods_1.pods)


def test_gpu_uuids_are_stable_per_node_and_distinct_across_nodes() -> None:
    one, _ = reads("gpu-node-1", seed=0, count=1)
    two, _ = reads("gpu-node-2", seed=0, count=1)

    uuids_1 = [d.uuid for d in one[0].devices]
    uuids_2 = [d.uuid for d in two[0].devices]
    assert uuids_1 == [sim_gpu_uuid("gpu-node-1", i) for i in range(8)]
    assert not set(uuids_1) & set(uuids_2)
    assert all(u.startswith("GPU-") and uuid.UUID(u[4:]) for u in uuids_1)


def test_one_single_gpu_pod_per_gpu_with_the_mix_kinds() -> None:
    results, pods = reads("gpu-node-1", seed=0, count=1, gpus=10)
    devices = results[0].devices

    allocations = pods.list_allocations()
    assert allocations is not None
    assert len(pods.pods) == len(devices) == len(allocations) == 10
    assert sorted(d for a in allocations for d in a.device_ids) == sorted(d.uuid for d in devices)
    assert all(len(a.device_ids) == 1 for a in allocations)
    assert {a.resource for a in allocations} == {"nvidia.com/gpu"}
    by_device = {a.device_ids[0]: a for a in allocations}
    kinds = [by_device[d.uuid].container for d in devices]
    assert kinds == [DEFAULT_MIX[i % len(DEFAULT_MIX)] for i in range(10)]
    assert [by_device[d.uuid].pod for d in devices] == [
        f"{kind}-gpu-node-1-{i}" for i, kind in enumerate(kinds)
    ]
    assert {d.mem_total_bytes for d in devices} == {GPU_MODELS["h100"].mem_total_bytes}


def test_every_gpu_process_resolves_to_the_pod_allocated_that_gpu() -> None:
    results, pods = reads("gpu-node-1", seed=5, count=60)
    allocations = pods.list_allocations()
    assert allocations is not None
    holder = {a.device_ids[0]: a for a in allocations}

    checked = 0
    for result in results:
        for device in result.devices:
            for process in device.processes:
                ref = pods.resolve(process.pid)
                assert ref is not None, f"pid {process.pid} on {device.uuid} has no pod"
                assert ref.pod_uid == holder[device.uuid].pod_uid
                assert ref.container == holder[device.uuid].container
                checked += 1
    assert checked == 60 * 8  # the default mix has no crashloop: every process runs every read
    assert pods.resolve(1) is None


def test_an_assembled_sim_sample_names_every_process() -> None:
    results, pods = reads("gpu-node-1", seed=0, count=1)

    sample = assemble_sample(
        node="gpu-node-1",
        ts_ms=int(T0 * 1000),
        interval_ms=1000,
        seq=0,
        read=results[0],
        resolve=pods.resolve,
        allocations=pods.list_allocations(),
    )

    processes = [p for g in sample.gpus for p in g.processes]
    assert len(processes) == 8
    assert all(p.pod_uid in pods.pods and p.container is not None for p in processes)
    assert {g.sharing for g in sample.gpus} == {"exclusive"}
    assert len(sample.allocations) == 8


def test_a_removed_pod_loses_its_allocation_and_pids() -> None:
    _, pods = reads("gpu-node-1", seed=0, count=1, gpus=2)
    first = next(iter(pods.pods.values()))
    pid = next(p for p, uid in pods.pids.items() if uid == first.uid)

    pods.remove(first.uid)

    allocations = pods.list_allocations()
    assert allocations is not None
    assert [a.pod_uid for a in allocations] == [uid for uid in pods.pods]
    assert first.uid not in {a.pod_uid for a in allocations}
    assert len(allocations) == 1
    assert pods.resolve(pid) is None


def test_an_unknown_model_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU model 'a100' \(known: h100, h200, l40s\)"):
        simple_node("gpu-node-1", model="a100")
