"""The node agent names its cluster in every sample; the default cluster's samples are the
bytes the agent wrote before samples named a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from reading_fixtures import device

from producers.agent.loop import NodeAgent
from producers.base.ports import DeviceAllocation, PodRef, ProcessReading, ReadResult
from schemas import NVML_SAMPLES
from schemas.ids import GpuUuid, PodUid

GPU = GpuUuid("GPU-8f3c6a1e-58d2-8a34-1b2c-9d0e7f6a5b4c")
POD = PodUid("6f1c0e2a-1111-4a2b-9c3d-000000000001")

# The first sample of the agent below, as the agent encoded it before the cluster field
# existed (recorded from that version of the code).
BEFORE_CLUSTERS = (
    b'{"schema":"gpuwatch.nvml.sample/v1","node":"gpu-node-17","ts":1764412345000,'
    b'"interval_ms":1000,"seq":0,"gpus":[{"uuid":"GPU-8f3c6a1e-58d2-8a34-1b2c-9d0e7f6a5b4c",'
    b'"index":0,"model":"NVIDIA H100 80GB HBM3","parent_uuid":null,"mig_profile":null,'
    b'"sharing":"exclusive","util_pct":87.0,"mem_util_pct":41.0,"mem_used_bytes":64424509440,'
    b'"mem_total_bytes":85899345920,"power_w":512.3,"temp_c":61,"xid_errors":[],"ecc_dbe":0,'
    b'"processes":[{"pid":4242,"mem_bytes":1073741824,"sm_pct":90.0,'
    b'"pod_uid":"6f1c0e2a-1111-4a2b-9c3d-000000000001","container":"trainer"}]}],'
    b'"allocations":[{"pod_uid":"6f1c0e2a-1111-4a2b-9c3d-000000000001","namespace":"ml",'
    b'"pod":"train-0","container":"trainer","resource":"nvidia.com/gpu",'
    b'"device_ids":["GPU-8f3c6a1e-58d2-8a34-1b2c-9d0e7f6a5b4c"]}]}'
)


class Clock:
    def time(self) -> float:
        return 1_764_412_346.0

    def monotonic(self) -> float:
        return 100.0


class Reader:
    def read(self) -> ReadResult:
        reading = device(GPU, 0, processes=(ProcessReading(4242, 1 << 30, 90.0),))
        return ReadResult((reading,), ())

    def close(self) -> None:
        return None


class Pods:
    def resolve(self, pid: int) -> PodRef | None:
        return PodRef(POD, None) if pid == 4242 else None

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        return (DeviceAllocation(POD, "ml", "train-0", "trainer", "nvidia.com/gpu", (GPU,)),)


def first_message(cluster: str | None) -> tuple[bytes, bytes]:
    """The first tick's key and value; `cluster` None leaves the agent's default."""
    published: list[tuple[bytes, bytes]] = []
    pods = Pods()
    named: dict[str, Any] = {} if cluster is None else {"cluster": cluster}
    agent = NodeAgent(
        node="gpu-node-17",
        reader=Reader(),
        resolver=pods,
        allocations=pods,
        publish=lambda key, value: published.append((key, value)),
        interval_s=1.0,
        clock=Clock(),
        **named,
    )
    agent.tick()
    assert len(published) == 1
    return published[0]


def test_a_named_cluster_is_in_every_sample_and_the_key_stays_the_node() -> None:
    key, value = first_message("eu-west")

    assert key == b"gpu-node-17"
    message = json.loads(value)
    assert message["cluster"] == "eu-west"
    assert NVML_SAMPLES.decode(value).cluster == "eu-west"
    # Nothing else changes: the same sample, with the field.
    assert {k: v for k, v in message.items() if k != "cluster"} == json.loads(BEFORE_CLUSTERS)


@pytest.mark.parametrize("cluster", [None, "default"])
def test_the_default_clusters_sample_is_byte_identical_to_before(cluster: str | None) -> None:
    key, value = first_message(cluster)

    assert key == b"gpu-node-17"
    assert value == BEFORE_CLUSTERS
