"""Our api.proto stays wire-compatible with the kubelet's podresources/v1 api.proto."""

from __future__ import annotations

import pytest

from producers.podresources import proto
from producers.podresources.proto import GeneratedCodeMissingError, api_pb2, method_path

# Field numbers of upstream k8s.io/kubelet/pkg/apis/podresources/v1/api.proto.
UPSTREAM_FIELDS = {
    "ListPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3},
    "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "dynamic_resources": 5},
    "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2},
    "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
    "ClaimResource": {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4},
    "CDIDevice": {"name": 1},
    "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
    "GetPodResourcesResponse": {"pod_resources": 1},
}


@pytest.mark.parametrize(("message", "fields"), UPSTREAM_FIELDS.items())
def test_field_numbers_match_upstream(message: str, fields: dict[str, int]) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields
    assert descriptor.full_name == f"v1.{message}"


def test_method_paths_are_the_kubelets() -> None:
    assert method_path("List") == "/v1.PodResourcesLister/List"
    assert (
        method_path("GetAllocatableResources") == "/v1.PodResourcesLister/GetAllocatableResources"
    )
    assert method_path("Get") == "/v1.PodResourcesLister/Get"


def varint(value: int) -> bytes:
    """Protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def length_delimited(field: int, payload: bytes) -> bytes:
    """A wire-type-2 field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def test_fields_of_newer_kubelets_we_do_not_declare_are_skipped() -> None:
    # ContainerResources.memory (4) = ContainerMemory{memory_type: "hugepages-2Mi", size: 2Mi}
    memory = length_delimited(1, b"hugepages-2Mi") + varint(2 << 3) + varint(2 * 1024 * 1024)
    container = api_pb2.ContainerResources(
        name="trainer",
        devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["G"])],
    ).SerializeToString() + length_delimited(4, memory)
    # PodResources.cpu_ids (4, packed) from Kubernetes 1.3x
    pod = length_delimited(1, b"train-0") + length_delimited(3, container)
    pod += length_delimited(4, varint(2) + varint(3))
    response = api_pb2.ListPodResourcesResponse.FromString(length_delimited(1, pod))
    (parsed,) = response.pod_resources
    assert parsed.name == "train-0"
    assert parsed.containers[0].name == "trainer"
    assert list(parsed.containers[0].devices[0].device_ids) == ["G"]


def test_missing_generated_module_names_the_fix() -> None:
    with pytest.raises(GeneratedCodeMissingError, match="make install"):
        proto._load("api_pb2_never_generated")


def test_other_import_errors_are_not_disguised() -> None:
    with pytest.raises(ModuleNotFoundError) as info:
        proto._load("codegen_helper_that_is_absent.sub")
    assert not isinstance(info.value, GeneratedCodeMissingError)
