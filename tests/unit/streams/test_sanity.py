"""Semantic sanity checks of node samples and pod events: each with a bad and a good example."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from test_gpu_alerts_fixtures import (
    GIB,
    GPU_A,
    GPU_B,
    MIG_1,
    POD_P,
    POD_Q,
    T0,
    S,
    alloc,
    gpu,
    proc,
    sample,
)

from gpuwatch.harness.examples import example
from schemas.k8s_pod import TOPIC as PODS
from schemas.k8s_pod import K8sPod
from schemas.nvml_sample import TOPIC as SAMPLES
from schemas.nvml_sample import NvmlSample
from streams.core.sanity import check_pod, check_sample, unknown_devices, wrong_key

DAY = 86_400_000
SKEW = 300 * S  # GPUWATCH_MAX_CLOCK_SKEW_S's default
GOOD = sample(T0, [gpu(GPU_A, 50.0, proc(1, POD_P)), gpu(GPU_B, 0.0)], [alloc(POD_P, GPU_A)])


def with_gpu(**changes: Any) -> NvmlSample:
    """GOOD with GPU A's reading changed (10 GiB used unless said)."""
    changes.setdefault("mem_used_bytes", 10 * GIB)
    return msgspec.structs.replace(GOOD, gpus=(gpu(GPU_A, 50.0, **changes), GOOD.gpus[1]))


def test_the_design_example_and_a_plain_sample_pass() -> None:
    decoded = SAMPLES.decode(
        SAMPLES.encode(SAMPLES.value_type(**example("gpuwatch.nvml.sample/v1")))
    )
    assert check_sample(decoded, decoded.ts, SKEW) == []
    assert check_sample(GOOD, None, SKEW) == []
    assert unknown_devices(GOOD) == []


def test_memory_used_above_total() -> None:
    over = with_gpu(mem_used_bytes=81 * GIB, mem_total_bytes=80 * GIB)
    assert check_sample(over, None, SKEW) == [
        f"gpu {GPU_A}: mem_used_bytes {81 * GIB} > mem_total_bytes {80 * GIB}"
    ]
    within_slack = with_gpu(mem_used_bytes=80 * GIB + (100 << 20), mem_total_bytes=80 * GIB)
    assert check_sample(within_slack, None, SKEW) == []  # 100 MiB over 80 GiB: under 1 %


def test_a_process_using_more_than_the_gpu_has() -> None:
    big = with_gpu(processes=(proc(7, POD_P, mem=90 * GIB),), mem_used_bytes=80 * GIB)
    assert f"gpu {GPU_A}: pid 7 mem_bytes {90 * GIB} > mem_total_bytes" in check_sample(
        big, None, SKEW
    )
    fits = with_gpu(processes=(proc(7, POD_P, mem=79 * GIB),), mem_used_bytes=80 * GIB)
    assert check_sample(fits, None, SKEW) == []


def test_processes_far_above_the_device_memory_used() -> None:
    procs = (proc(1, POD_P, mem=20 * GIB), proc(2, POD_Q, mem=20 * GIB))
    far = with_gpu(processes=procs, mem_used_bytes=10 * GIB)  # 40 > 1.5 x 10 + 1 GiB
    assert check_sample(far, None, SKEW) == [
        f"gpu {GPU_A}: processes use {40 * GIB} bytes, mem_used_bytes is {10 * GIB}"
    ]
    skewed = with_gpu(processes=procs, mem_used_bytes=30 * GIB)  # reads ms apart: tolerated
    assert check_sample(skewed, None, SKEW) == []
    unknown = with_gpu(processes=(proc(1, POD_P, mem=None),) * 1, mem_used_bytes=0)
    assert check_sample(unknown, None, SKEW) == []  # null memory is unknown, not zero or too much


def test_a_pid_listed_twice_on_one_gpu() -> None:
    twice = with_gpu(processes=(proc(5, POD_P), proc(5, POD_P)))
    assert check_sample(twice, None, SKEW) == [f"gpu {GPU_A}: a pid is listed more than once"]
    assert check_sample(with_gpu(processes=(proc(5, POD_P), proc(6, POD_P))), None, SKEW) == []


@pytest.mark.parametrize(
    ("interval_ms", "ok"), [(9, False), (10, True), (3_600_000, True), (3_600_001, False)]
)
def test_interval_between_10_ms_and_an_hour(interval_ms: int, ok: bool) -> None:
    errors = check_sample(msgspec.structs.replace(GOOD, interval_ms=interval_ms), None, SKEW)
    assert errors == ([] if ok else [f"interval_ms {interval_ms} is outside 10..3600000"])


def test_event_time_before_2015_after_2100_or_past_the_clock_skew_ahead_of_the_wall() -> None:
    def errors(ts: int, reference: int | None, skew: int = SKEW) -> list[str]:
        return check_sample(msgspec.structs.replace(GOOD, ts=ts), reference, skew)

    assert errors(1_764_412_345, None) == [
        "ts 1764412345 is before 2015 (seconds instead of milliseconds?)"
    ]
    assert errors(1_764_412_345_000_000, None) == [
        "ts 1764412345000000 is after 2100 (micro- or nanoseconds instead of milliseconds?)"
    ]
    assert errors(T0 + SKEW + 1, T0) == [
        f"ts {T0 + SKEW + 1} is 300.001 s ahead of the wall clock {T0}, more than the clock "
        "skew allowed (300 s, GPUWATCH_MAX_CLOCK_SKEW_S)"
    ]
    assert errors(T0 + SKEW, T0) == []  # at the limit: in
    assert errors(T0 + 6 * 3_600 * S, T0, 3_600 * S) == [
        f"ts {T0 + 6 * 3_600 * S} is 21600 s ahead of the wall clock {T0}, more than the clock "
        "skew allowed (3600 s, GPUWATCH_MAX_CLOCK_SKEW_S)"
    ]
    assert errors(T0 + 3_600 * S, T0, 3_600 * S) == []  # the limit is the one passed in
    assert errors(T0 + 30 * DAY, None) == []  # no wall clock: no reference to judge by
    assert errors(T0 - 30 * DAY, T0) == []  # old data is a replay, not an error


def test_a_wrong_or_missing_key_is_worded_with_the_values_identity() -> None:
    assert wrong_key(b"gpu-node-2", "gpu-node-1", "node") == (
        "key 'gpu-node-2' is not the value's node name 'gpu-node-1'"
    )
    assert wrong_key(None, "gpu-node-1", "node") == (
        "no key: the key must be the value's node name 'gpu-node-1'"
    )
    assert wrong_key(b"gpu-node-1", "0f3c-uid", "pod_uid") == (
        "key 'gpu-node-1' is not the value's pod uid '0f3c-uid'"
    )
    # Bytes that are no UTF-8 are shown escaped, and a 10 kB name only by its start.
    assert wrong_key(b"n\xff", "n", "node") == "key 'n\\\\xff' is not the value's node name 'n'"
    long = wrong_key(b"k", "L" * 10_000, "pod_uid")
    assert long == f"key 'k' is not the value's pod uid '{'L' * 100}...'"


def test_duplicate_gpu_uuids() -> None:
    doubled = msgspec.structs.replace(GOOD, gpus=(*GOOD.gpus, GOOD.gpus[0], GOOD.gpus[1]))
    assert check_sample(doubled, None, SKEW) == [
        f"gpu uuids listed more than once: {GPU_A}, {GPU_B}"
    ]


def test_power_in_milliwatts() -> None:
    assert check_sample(with_gpu(power_w=512_300.0), None, SKEW) == [
        f"gpu {GPU_A}: power_w 512300.0 is above 5000 W"
    ]
    assert check_sample(with_gpu(power_w=1_400.0), None, SKEW) == []


def test_empty_node_name() -> None:
    assert check_sample(msgspec.structs.replace(GOOD, node=""), None, SKEW) == ["node is empty"]


def test_a_mig_instance_without_its_parent_is_fine() -> None:
    orphan = gpu(MIG_1, None, sharing="mig", parent_uuid=GPU_A, mig_profile="1g.10gb")
    assert check_sample(sample(T0, [orphan], [alloc(POD_P, MIG_1)]), None, SKEW) == []


def test_allocated_devices_nvml_does_not_report_are_warnings() -> None:
    lost = sample(T0, [gpu(GPU_A, 1.0)], [alloc(POD_P, GPU_A, GPU_B), alloc(POD_Q, MIG_1)])
    assert check_sample(lost, None, SKEW) == []
    assert unknown_devices(lost) == [
        f"ml/train-0 is allocated {GPU_B}, which NVML does not report",
        f"ml/eval-1 is allocated {MIG_1}, which NVML does not report",
    ]


def pod(**changes: Any) -> K8sPod:
    """The docs/DESIGN.md §3.2 pod event with changes."""
    fields = example("gpuwatch.k8s.pod/v1")
    fields.update(changes)
    return PODS.decode(msgspec.json.encode(fields))


def test_the_design_pod_example_passes() -> None:
    assert check_pod(pod(), 1_764_412_345_000, SKEW) == []


def test_pod_times_before_creation() -> None:
    created = 1_764_400_000_000
    finished_early = pod(phase="Succeeded", finished_at=created - 61 * S)
    assert check_pod(finished_early, None, SKEW) == [
        f"finished_at {created - 61 * S} is before created_at {created}"
    ]
    assert check_pod(pod(phase="Succeeded", finished_at=created - 60 * S), None, SKEW) == []  # skew
    assert check_pod(pod(started_at=created - 120 * S), None, SKEW) == [
        f"started_at {created - 120 * S} is before created_at {created}"
    ]
    assert check_pod(pod(scheduled_at=created - 120 * S), None, SKEW) == [
        f"scheduled_at {created - 120 * S} is before created_at {created}"
    ]


def test_pod_event_times() -> None:
    assert check_pod(pod(ts=T0 + 2 * DAY), T0, SKEW) == [
        f"ts {T0 + 2 * DAY} is 172800 s ahead of the wall clock {T0}, more than the clock skew "
        "allowed (300 s, GPUWATCH_MAX_CLOCK_SKEW_S)"
    ]
    assert check_pod(pod(ts=T0 + SKEW), T0, SKEW) == []
    # Only `ts` is judged by the wall clock: it is what moves time; the others are the
    # API server's and the kubelet's own stamps.
    assert check_pod(pod(ts=T0, created_at=T0 - S, started_at=T0 + DAY), T0, SKEW) == []
    assert check_pod(pod(created_at=1_764_400_000), None, SKEW)[0] == (
        "created_at 1764400000 is before 2015 (seconds instead of milliseconds?)"
    )


def test_running_pod_without_a_node() -> None:
    assert check_pod(pod(node=None), None, SKEW) == ["phase Running without a node"]
    assert check_pod(pod(node=None, phase="Pending", started_at=None), None, SKEW) == []
