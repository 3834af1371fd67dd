"""assemble_sample: sharing modes, allocations folded, PIDs named, and a valid v1 message."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator
from reading_fixtures import GIB, GPU_X, device

from producers.agent.assemble import (
    SharingConfig,
    assemble_sample,
    normalise_allocations,
    sharing_mode,
)
from producers.base.ports import (
    DeviceAllocation,
    DeviceReading,
    PodRef,
    ProcessReading,
    ReadResult,
)
from schemas import NVML_SAMPLES
from schemas.export import JSON_DIR
from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import NvmlSample

GPU_Y = GpuUuid("GPU-1c2d3e4f-5a6b-7c8d-9e0f-a1b2c3d4e5f6")
MIG_1 = GpuUuid("MIG-4f0c2d9a-7b61-5e3a-9c8d-2b1a0f9e8d7c")
POD_A = PodUid("6f1c0e2a-1111-4a2b-9c3d-000000000001")
POD_B = PodUid("6f1c0e2a-2222-4a2b-9c3d-000000000002")
NONE: set[GpuUuid] = set()


def mig_instance() -> DeviceReading:
    return device(
        MIG_1,
        1,
        parent_uuid=GPU_X,
        mig_profile="1g.10gb",
        mig_enabled=True,
        util_pct=None,
        mem_util_pct=None,
        power_w=None,
        temp_c=None,
        ecc_dbe=None,
        processes=(ProcessReading(77, None, None),),
    )


def alloc(pod: PodUid, container: str, *device_ids: str) -> DeviceAllocation:
    return DeviceAllocation(
        pod_uid=pod,
        namespace="ml",
        pod=f"pod-{pod[-1]}",
        container=container,
        resource="nvidia.com/gpu",
        device_ids=device_ids,
    )


class Resolver:
    """PID -> pod from a table; what the cgroup resolver would find."""

    def __init__(self, table: dict[int, PodRef]) -> None:
        self.table = table

    def __call__(self, pid: int) -> PodRef | None:
        return self.table.get(pid)


def sample(
    devices: list[DeviceReading],
    allocations: tuple[DeviceAllocation, ...] | None,
    resolve: dict[int, PodRef] | None = None,
    sharing: SharingConfig | None = None,
) -> NvmlSample:
    return assemble_sample(
        node="gpu-node-17",
        ts_ms=1_764_412_345_000,
        interval_ms=1000,
        seq=81234,
        read=ReadResult(tuple(devices)),
        resolve=Resolver(resolve or {}),
        allocations=allocations,
        sharing=sharing,
    )


# --- sharing_mode ------------------------------------------------------------------------


def test_a_mig_instance_is_mig_whatever_else_is_declared() -> None:
    config = SharingConfig(by_uuid={MIG_1: "time-slicing"}, default="mps")
    assert sharing_mode(mig_instance(), {MIG_1}, config) == "mig"


def test_a_parent_gpu_in_mig_mode_is_mig() -> None:
    parent = device(mig_enabled=True, util_pct=None)
    assert sharing_mode(parent, {GPU_X}, SharingConfig(default="time-slicing")) == "mig"


def test_the_configured_mode_of_a_gpu_wins_over_replicas_and_mps() -> None:
    config = SharingConfig(by_uuid={GPU_X: "mps"}, default="time-slicing")
    assert sharing_mode(device(), {GPU_X}, config) == "mps"
    # Not named: the default applies, even over an MPS reading.
    assert sharing_mode(device(GPU_Y, mps=True), NONE, config) == "time-slicing"


def test_replicated_device_ids_make_a_gpu_time_slicing() -> None:
    assert sharing_mode(device(), {GPU_X}, SharingConfig()) == "time-slicing"
    assert sharing_mode(device(GPU_Y), {GPU_X}, SharingConfig()) == "exclusive"


def test_mps_clients_make_a_gpu_mps() -> None:
    assert sharing_mode(device(mps=True), NONE, SharingConfig()) == "mps"


def test_a_plain_gpu_is_exclusive() -> None:
    assert sharing_mode(device(), NONE, SharingConfig()) == "exclusive"


# --- allocations -------------------------------------------------------------------------


def test_replicas_of_one_gpu_fold_to_its_uuid_and_make_it_time_slicing() -> None:
    allocations = (alloc(POD_A, "trainer", f"{GPU_X}::1", f"{GPU_X}::2"),)

    got = sample([device(GPU_X, 0), device(GPU_Y, 1)], allocations)

    assert [a.device_ids for a in got.allocations] == [(GPU_X,)]
    assert {g.uuid: g.sharing for g in got.gpus} == {GPU_X: "time-slicing", GPU_Y: "exclusive"}


def test_normalised_allocations_keep_order_fields_and_distinct_devices() -> None:
    raw = (
        alloc(POD_B, "b", GPU_Y, f"{GPU_X}::3", GPU_X),
        alloc(POD_A, "a", MIG_1),
    )

    out = normalise_allocations(raw)

    assert [(a.pod_uid, a.container, a.device_ids) for a in out] == [
        (POD_B, "b", (GPU_Y, GPU_X)),
        (POD_A, "a", (MIG_1,)),
    ]
    assert (out[0].namespace, out[0].pod, out[0].resource) == ("ml", "pod-2", "nvidia.com/gpu")


def test_no_allocations_this_tick_publishes_an_empty_list() -> None:
    got = sample([device(GPU_X, 0, 42)], None, {42: PodRef(POD_A, "cid")})

    assert got.allocations == ()
    assert got.gpus[0].sharing == "exclusive"
    assert got.gpus[0].processes[0].pod_uid == POD_A
    assert got.gpus[0].processes[0].container is None  # nothing names it


# --- processes ---------------------------------------------------------------------------


def test_a_process_of_a_pod_with_one_container_on_the_gpu_gets_its_name() -> None:
    allocations = (
        alloc(POD_A, "trainer", GPU_X),
        alloc(POD_A, "sidecar", GPU_Y),  # same pod, another GPU: not a candidate on GPU_X
    )
    resolve = {42: PodRef(POD_A, "containerd://abc")}

    got = sample([device(GPU_X, 0, 42), device(GPU_Y, 1, 42)], allocations, resolve)

    assert [(p.pid, p.pod_uid, p.container) for p in got.gpus[0].processes] == [
        (42, POD_A, "trainer")
    ]
    assert [p.container for p in got.gpus[1].processes] == ["sidecar"]


def test_two_containers_of_the_pod_on_the_gpu_leave_the_container_unknown() -> None:
    allocations = (
        alloc(POD_A, "worker-0", f"{GPU_X}::1"),
        alloc(POD_A, "worker-1", f"{GPU_X}::2"),
        alloc(POD_B, "other", f"{GPU_X}::3"),
    )
    resolve = {42: PodRef(POD_A, None), 43: PodRef(POD_B, None)}

    got = sample([device(GPU_X, 0, 42, 43)], allocations, resolve)

    assert [(p.pid, p.pod_uid, p.container) for p in got.gpus[0].processes] == [
        (42, POD_A, None),
        (43, POD_B, "other"),
    ]


def test_a_container_name_the_resolver_knows_is_kept() -> None:
    allocations = (alloc(POD_A, "worker-0", GPU_X), alloc(POD_A, "worker-1", GPU_X))
    resolve = {42: PodRef(POD_A, None, container="worker-1")}

    got = sample([device(GPU_X, 0, 42)], allocations, resolve)

    assert got.gpus[0].processes[0].container == "worker-1"


def test_a_pid_of_no_pod_has_no_pod_uid_and_no_container() -> None:
    allocations = (alloc(POD_A, "trainer", GPU_X),)

    got = sample([device(GPU_X, 0, 42, 99)], allocations, {42: PodRef(POD_A, None)})

    by_pid = {p.pid: (p.pod_uid, p.container, p.mem_bytes) for p in got.gpus[0].processes}
    assert by_pid == {42: (POD_A, "trainer", 42 * GIB), 99: (None, None, 99 * GIB)}


def test_readings_pass_through_with_unsupported_ones_null() -> None:
    got = sample(
        [device(GPU_X, 0, mig_enabled=True, util_pct=None), mig_instance()],
        (alloc(POD_A, "trainer", MIG_1),),
        {77: PodRef(POD_A, None)},
    )

    parent, instance = got.gpus
    assert (parent.sharing, parent.util_pct, parent.power_w) == ("mig", None, 512.3)
    assert (instance.uuid, instance.parent_uuid, instance.mig_profile) == (
        MIG_1,
        GPU_X,
        "1g.10gb",
    )
    assert (instance.util_pct, instance.power_w, instance.temp_c, instance.ecc_dbe) == (
        None,
        None,
        None,
        None,
    )
    assert [(p.mem_bytes, p.sm_pct, p.container) for p in instance.processes] == [
        (None, None, "trainer")
    ]


def test_the_header_carries_what_the_agent_passed() -> None:
    got = sample([device(GPU_X, 3)], ())

    assert (got.schema, got.node, got.ts, got.interval_ms, got.seq) == (
        "gpuwatch.nvml.sample/v1",
        "gpu-node-17",
        1_764_412_345_000,
        1000,
        81234,
    )
    assert (got.gpus[0].index, got.gpus[0].model, got.gpus[0].mem_used_bytes) == (
        3,
        "NVIDIA H100 80GB HBM3",
        60 * GIB,
    )


# --- the wire format ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    path = JSON_DIR / NVML_SAMPLES.json_schema_file
    assert path.name == "gpuwatch.nvml.sample.v1.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    return Draft202012Validator(document)


def test_an_assembled_sample_of_every_kind_validates_and_round_trips(
    validator: Draft202012Validator,
) -> None:
    allocations = (
        alloc(POD_A, "trainer", f"{GPU_Y}::1", f"{GPU_Y}::2"),
        alloc(POD_B, "notebook", MIG_1),
    )
    got = sample(
        [device(GPU_X, 0, mig_enabled=True, util_pct=None), mig_instance(), device(GPU_Y, 1, 42)],
        allocations,
        {42: PodRef(POD_A, None), 77: PodRef(POD_B, None)},
    )
    raw = NVML_SAMPLES.encode(got)
    document = json.loads(raw)

    errors = sorted(validator.iter_errors(document), key=str)
    assert errors == []
    assert NVML_SAMPLES.decode(raw) == got
    assert [g["sharing"] for g in document["gpus"]] == ["mig", "mig", "time-slicing"]
    assert document["allocations"][0]["device_ids"] == [GPU_Y]


def test_the_schema_refuses_what_assemble_must_not_produce(
    validator: Draft202012Validator,
) -> None:
    """The check above can fail: a made-up sharing mode or a missing field is refused."""
    document = json.loads(NVML_SAMPLES.encode(sample([device(GPU_X, 0, 42)], ())))
    document["gpus"][0]["sharing"] = "shared"
    assert not validator.is_valid(document)
    document["gpus"][0]["sharing"] = "exclusive"
    del document["gpus"][0]["processes"][0]["pod_uid"]
    assert not validator.is_valid(document)
