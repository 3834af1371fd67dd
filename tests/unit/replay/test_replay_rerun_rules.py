"""The refusals and choices of `gpuwatch replay --rerun` that need no Kafka."""

from __future__ import annotations

import json
from typing import Any

import pytest
from replay_records import MIN, SPAN, T0, TRAIN, S, attribution, gpu_window

from gpuwatch.harness.examples import GPU_0, example
from gpuwatch.replay.read import Hit
from gpuwatch.replay.rerun import (
    RerunError,
    RerunResult,
    check_prefix,
    in_cluster,
    keep,
    rerun_redis_url,
    totals,
    widened,
)
from gpuwatch.replay.view import render_rerun, rerun_json
from gpuwatch.timerange import TimeRange
from schemas import K8S_NODES, K8S_PODS, Attribution


@pytest.mark.parametrize("target", ["gpuwatch.", "gpu", "g", "", "bad/name.", "two words."])
def test_a_prefix_that_could_hold_live_topics_or_none_is_refused(target: str) -> None:
    with pytest.raises(RerunError, match="--to-prefix"):
        check_prefix("gpuwatch.", target)


@pytest.mark.parametrize("target", ["replay-idle20.", "gpuwatch.replay.show.", "r_1."])
def test_a_prefix_of_its_own_is_accepted(target: str) -> None:
    check_prefix("gpuwatch.", target)


@pytest.mark.parametrize(
    ("live", "rerun"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/1"),
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/1"),
        ("rediss://:pw@cache:6380/4", "rediss://:pw@cache:6380/5"),
        ("unix:///run/redis.sock?db=2", "unix:///run/redis.sock?db=3"),
    ],
)
def test_by_default_the_rerun_writes_the_next_redis_database(live: str, rerun: str) -> None:
    url, note = rerun_redis_url(live, None)
    assert url == rerun
    assert note is not None
    assert "the live one's + 1" in note


@pytest.mark.parametrize(
    "given", ["redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379", "redis://127.0.0.1/0"]
)
def test_the_live_redis_database_is_refused(given: str) -> None:
    with pytest.raises(RerunError, match="is the live Redis database"):
        rerun_redis_url("redis://127.0.0.1:6379/0", given)


def test_another_database_or_server_is_taken_as_given() -> None:
    live = "redis://127.0.0.1:6379/0"
    assert rerun_redis_url(live, "redis://127.0.0.1:6379/7") == ("redis://127.0.0.1:6379/7", None)
    assert rerun_redis_url(live, "redis://other:6379/0") == ("redis://other:6379/0", None)
    with pytest.raises(RerunError, match="give the rerun's with --redis-url"):
        rerun_redis_url("redis://127.0.0.1:6379/15", None)


def test_the_range_grows_to_whole_windows() -> None:
    assert widened(TimeRange(T0 + 30 * S, T0 + 90 * S), MIN) == TimeRange(T0, T0 + 2 * MIN)
    assert widened(TimeRange(T0, T0 + 2 * MIN), MIN) == TimeRange(T0, T0 + 2 * MIN)


def test_totals_sum_the_pod_and_gpu_windows() -> None:
    pods = [
        attribution(TRAIN, T0, used=30.0, idle=20.0, cost=0.06, waste=0.02),
        attribution(TRAIN, T0 + MIN, used=51.5, idle=3.5, cost=0.06, waste=0.0035),
    ]
    gpus = [gpu_window(GPU_0, T0, [TRAIN], 50.0), gpu_window(GPU_0, T0 + MIN, [TRAIN], 90.0)]
    assert totals(pods, gpus) == pytest.approx(
        {
            "pod_windows": 2,
            "allocated_gpu_seconds": 120.0,
            "used_gpu_seconds": 81.5,
            "idle_gpu_seconds": 23.5,
            "cost_usd": 0.12,
            "waste_usd": 0.0235,
            "gpu_windows": 2,
            "gpu_idle_seconds": 72.0,  # the example window: 36 s idle each
            "gpu_allocated_idle_seconds": 72.0,
        }
    )


def test_the_rerun_summary_puts_the_rerun_beside_live() -> None:
    result = RerunResult(
        prefix="replay-idle95.",
        app_id="gwreplay-1",
        redis_url="redis://127.0.0.1:6379/1",
        span=SPAN,
        settings={"idle_util_pct": 95.0, "stall_after_s": 300, "window_s": 60},
        copied={"k8s.pods": 3, "nvml.samples": 90},
        before_range={"k8s.pods": 2, "nvml.samples": 0},
        derived={"attribution": 3, "gpu.windows": 2},
        rerun_totals={"pod_windows": 3, "idle_gpu_seconds": 81.0, "waste_usd": 0.09},
        live_totals={"pod_windows": 3, "idle_gpu_seconds": 60.0, "waste_usd": 0.066},
        caught_up_s=12.34,
        worker_log="/tmp/w.log",
    )
    lines = render_rerun(result).splitlines()
    assert lines[1] == "  settings  idle_util_pct 95  stall_after_s 300  window_s 60"
    assert lines[2] == (
        "  copied    k8s.pods 3 (2 of them each one's last before the range), nvml.samples 90"
    )
    assert "caught up in 12.3 s" in lines[3]
    row = {
        line[:24].strip(): line[24:].split()
        for line in lines
        if line.startswith(("idle GPU-s", "waste USD"))
    }
    assert row == {"idle GPU-s (pods)": ["81.0", "60.0"], "waste USD": ["0.0900", "0.0660"]}
    data = json.loads(rerun_json(result))
    assert (data["span"], data["rerun_totals"]["idle_gpu_seconds"]) == (
        {"start_ms": SPAN.start_ms, "end_ms": SPAN.end_ms},
        81.0,
    )


@pytest.mark.parametrize(
    ("spec", "changes", "kept"),
    [
        (K8S_PODS, {"phase": "Running"}, True),
        (K8S_PODS, {"phase": "Pending", "node": None}, True),
        (K8S_PODS, {"phase": "Succeeded"}, False),
        (K8S_PODS, {"phase": "Failed"}, False),
        (K8S_PODS, {"type": "DELETED"}, False),
        (K8S_NODES, {"ready": False}, True),
        (K8S_NODES, {"type": "DELETED"}, False),
    ],
)
def test_only_pods_and_nodes_still_in_the_cluster_are_copied_as_the_state_before(
    spec: Any, changes: dict[str, Any], kept: bool
) -> None:
    data = example(spec.schema_name) | changes
    hit = Hit(spec.name, 0, b"k", json.dumps(data).encode(), data["ts"])
    assert in_cluster(spec, hit) is kept
    assert in_cluster(spec, Hit(spec.name, 0, b"k", b"not json", 0)) is False


def test_the_comparison_takes_each_windows_newest_revision_once() -> None:
    # Copies of one window as read: the first, a revision, the first again, a second
    # revision, the first revision again. The sums are those of the second revision.
    def copy(used: float, revision: int) -> Attribution:
        return attribution(TRAIN, T0, used=used, idle=60.0 - used, cost=0.0658,
                           waste=0.0011 * (60.0 - used), revision=revision)  # fmt: skip

    kept: dict[tuple[str, str, int], Attribution] = {}
    for rec in [copy(10.0, 0), copy(30.0, 1), copy(10.0, 0), copy(50.0, 2), copy(30.0, 1)]:
        keep(kept, (rec.cluster, rec.uid, rec.window_start), rec)
    sums = totals(list(kept.values()), [])
    assert (sums["pod_windows"], sums["used_gpu_seconds"], sums["idle_gpu_seconds"]) == (
        1,
        50.0,
        10.0,
    )
