"""What a node sample says is allocated on its node (`fleet.node_after_sample`): device
plugin ids each count, a ResourceClaim's device counts once however many pods share it."""

from __future__ import annotations

import msgspec
from support.metric_records import gpu, sample

from schemas.nvml_sample import NvmlSample
from streams.core.fleet.fleet_state import node_after_sample

T0 = 1_767_225_600_000
DRA = "gpu.nvidia.com/gpu"


def _with_claims(base: NvmlSample, claims: dict[str, str | None], resource: str) -> NvmlSample:
    allocations = tuple(
        msgspec.structs.replace(a, resource=resource, claim=claims[a.pod_uid])
        for a in base.allocations
    )
    return msgspec.structs.replace(base, allocations=allocations)


def test_two_pods_sharing_one_claim_hold_one_device() -> None:
    held = {"pod-a": ["GPU-0"], "pod-b": ["GPU-0"], "pod-c": ["GPU-1"]}
    base = sample("dra-0", T0, [gpu("GPU-0"), gpu("GPU-1")], held)
    claims: dict[str, str | None] = {
        "pod-a": "serving/chat",
        "pod-b": "serving/chat",
        "pod-c": "research/train-0",
    }
    use = node_after_sample(None, _with_claims(base, claims, DRA), (), T0)
    assert use is not None
    assert use.allocated == {DRA: 2}


def test_the_same_device_in_two_claims_counts_in_each() -> None:
    held = {"pod-a": ["GPU-0"], "pod-b": ["GPU-0"]}
    base = sample("dra-0", T0, [gpu("GPU-0")], held)
    claims: dict[str, str | None] = {"pod-a": "ns/one", "pod-b": "ns/two"}
    use = node_after_sample(None, _with_claims(base, claims, DRA), (), T0)
    assert use is not None
    assert use.allocated == {DRA: 2}  # not the driver's way; shown as the kubelet lists it


def test_time_slicing_replicas_of_one_gpu_each_count() -> None:
    held = {"pod-a": ["GPU-0"], "pod-b": ["GPU-0"]}  # replicas GPU-0::0 and ::1, stripped
    base = sample("ts-0", T0, [gpu("GPU-0")], held)
    use = node_after_sample(
        None, _with_claims(base, {"pod-a": None, "pod-b": None}, "nvidia.com/gpu"), (), T0
    )
    assert use is not None
    assert use.allocated == {"nvidia.com/gpu": 2}
