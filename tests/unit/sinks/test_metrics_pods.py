"""Per-pod series: state and seconds in it, share and VRAM, labels, and their removal."""

from __future__ import annotations

import msgspec
import pytest
from support.metric_records import POD as FIXTURE_POD
from support.metric_records import (
    T0,
    Clock,
    S,
    attribution,
    lifecycle,
    series,
    usage,
    value,
    worker,
)

from schemas.attribution import Attribution
from sinks.prometheus.collector import MAX_LABEL_LEN
from sinks.prometheus.metrics import SWEEP_EVERY_S

POD = FIXTURE_POD  # records that name no cluster: no cluster label
GPU = "GPU-8f3c2a1e-5b7d-4c9a-8e6f-1d2b3c4a5e6f"  # the examples' GPU
GPU_LABELS = POD | {"gpu": GPU, "model": "NVIDIA H100 80GB HBM3"}


def test_only_the_current_state_is_exported_with_its_seconds_at_stream_time() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle(to="queued", ts=T0, queued_ms=0))
    metrics.observe_lifecycle(lifecycle("u2", to="queued", ts=T0 + 90 * S, pod="other"))
    assert value(metrics, "gpuwatch_pod_state", **POD, state="queued") == 1.0
    assert value(metrics, "gpuwatch_pod_state_seconds", **POD, state="queued") == 90.0

    metrics.observe_lifecycle(lifecycle(to="running", ts=T0 + 100 * S, running_ms=5 * S))
    metrics.observe_lifecycle(lifecycle("u2", to="queued", ts=T0 + 130 * S, pod="other"))
    assert value(metrics, "gpuwatch_pod_state", **POD, state="queued") is None
    assert value(metrics, "gpuwatch_pod_state", **POD, state="running") == 1.0
    # Running before (5 s) plus 30 s of stream time since the transition.
    assert value(metrics, "gpuwatch_pod_state_seconds", **POD, state="running") == 35.0
    assert [s["state"] for s in series(metrics, "gpuwatch_pod_state")] == ["running", "queued"]


def test_an_older_transition_replayed_does_not_undo_a_newer_one() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle(to="stalled", ts=T0 + 10 * S))
    metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
    assert value(metrics, "gpuwatch_pod_state", **POD, state="stalled") == 1.0
    assert value(metrics, "gpuwatch_pod_state", **POD, state="running") is None


def test_team_is_the_one_pod_label_exported_and_its_name_is_configurable() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle(labels={"team": "vision", "project": "llm"}))
    (labels,) = series(metrics, "gpuwatch_pod_state")
    assert labels == POD | {"state": "running"}

    owners = worker(team_label="owner")
    owners.observe_lifecycle(lifecycle(labels={"team": "vision", "owner": "ana"}))
    assert value(owners, "gpuwatch_pod_state", **POD | {"team": "ana"}, state="running") == 1


def test_label_values_lose_control_characters_and_long_ones_are_cut_but_stay_distinct() -> None:
    metrics = worker()
    long_a, long_b = "a" * 600 + "x", "a" * 600 + "y"
    metrics.observe_lifecycle(lifecycle("u1", namespace="ml\n\x1b[31m", pod=long_a))
    metrics.observe_lifecycle(lifecycle("u2", pod=long_b))
    first, second = series(metrics, "gpuwatch_pod_state")
    assert first["namespace"] == "ml[31m"
    assert len(first["pod"]) == len(second["pod"]) == MAX_LABEL_LEN
    assert first["pod"] != second["pod"]
    assert first["pod"].startswith("a" * 200)


def test_share_and_vram_come_from_usage_and_attribution_newest_event_time_first() -> None:
    metrics = worker()
    metrics.observe_usage(usage(ts=T0, share=0.5))  # pod not known yet: nothing to label it
    assert series(metrics, "gpuwatch_pod_gpu_share_ratio") == []

    metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
    metrics.observe_usage(usage(ts=T0 + 100 * S, share=0.5, vram=2_000))
    assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) == 0.5
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 2_000
    # The window ending at T0 + 60 s is older than the usage: it does not overwrite it.
    metrics.observe_attribution(attribution(start=T0))
    assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) == 0.5
    # A later window does: 51.6 used of 60 allocated GPU-seconds.
    metrics.observe_attribution(attribution(start=T0 + 60 * S))
    assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) == pytest.approx(0.86)
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 61203283968


def test_an_unknown_share_is_not_exported_as_zero() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
    metrics.observe_usage(usage(ts=T0, share=None, vram=7))
    assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) is None
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 7


def test_a_finished_pod_is_removed_after_the_grace_period_and_replays_do_not_revive_it() -> None:
    clock = Clock(1000.0)
    metrics = worker(clock, finished_grace_s=300)
    metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
    metrics.observe_usage(usage(ts=T0))
    metrics.observe_lifecycle(lifecycle(to="finished", ts=T0 + 60 * S, reason="Completed"))
    assert value(metrics, "gpuwatch_pod_state", **POD, state="finished") == 1.0

    metrics.expire(1299.0)
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 10
    clock.now = 1300.0  # a scrape expires too
    assert series(metrics, "gpuwatch_pod_state") == []
    assert series(metrics, "gpuwatch_pod_gpu_memory_bytes") == []

    metrics.observe_lifecycle(lifecycle(to="running", ts=T0))  # a replay of the topic
    metrics.observe_attribution(attribution(start=T0 - 60 * S, state="running"))
    assert series(metrics, "gpuwatch_pod_state") == []
    assert series(metrics, "gpuwatch_pod_gpu_share_ratio") == []


def test_forget_drops_the_pods_and_gpus_of_revoked_partitions() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle("u1", to="running"))
    metrics.observe_lifecycle(lifecycle("u2", to="queued", pod="train-1"))
    metrics.forget(pods=["u1"])
    assert [s["pod"] for s in series(metrics, "gpuwatch_pod_state")] == ["train-1"]


def test_a_pod_without_any_record_for_a_day_is_forgotten() -> None:
    clock = Clock(0.0)
    metrics = worker(clock)
    metrics.observe_lifecycle(lifecycle("u1", to="running"))
    clock.now = 86_399.0
    metrics.observe_lifecycle(lifecycle("u2", to="queued", pod="train-1"))
    assert len(series(metrics, "gpuwatch_pod_state")) == 2
    clock.now = 86_399.0 + SWEEP_EVERY_S  # full scans are throttled; the last one was at 86399
    assert [s["pod"] for s in series(metrics, "gpuwatch_pod_state")] == ["train-1"]


def shared(record: Attribution, allocated: float, used: float) -> Attribution:
    """The record with its GPU time-sliced: `allocated` and `used` GPU-seconds."""
    gpu = msgspec.structs.replace(
        record.gpus[0],
        sharing="time-slicing",
        method="process",
        allocated_gpu_seconds=allocated,
        used_gpu_seconds=used,
    )
    return msgspec.structs.replace(record, gpus=(gpu,), method="process")


def test_a_window_of_a_shared_gpu_gives_vram_not_a_share() -> None:
    """Seconds of a GPU shared by 3 pods count a third to each: 18 used of 20 allocated is
    a pod at 30 %, not 90 %. Only pod.usage tells its own share there."""
    metrics = worker()
    metrics.observe_attribution(shared(attribution(start=T0), allocated=20.0, used=18.0))
    assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) is None
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 61203283968
    metrics.observe_usage(usage(ts=T0 + 60 * S, share=0.3, vram=5))
    # A later window keeps the usage's share and shows its own VRAM.
    metrics.observe_attribution(shared(attribution(start=T0 + 60 * S), allocated=20.0, used=18.0))
    assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) == 0.3
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 61203283968


@pytest.mark.parametrize("first", ["usage", "lifecycle"])
def test_usage_of_a_pod_not_known_yet_shows_once_its_lifecycle_comes(first: str) -> None:
    metrics = worker()
    records = [usage(ts=T0 + 10 * S, share=0.3, vram=5), usage(ts=T0, share=0.9, vram=7)]
    if first == "lifecycle":
        metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
    for record in records:
        metrics.observe_usage(record)
    if first == "usage":
        assert series(metrics, "gpuwatch_pod_gpu_share_ratio") == []
        metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
    assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) == 0.3  # the newest
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 5


def test_usage_kept_for_unknown_pods_is_bounded_and_leaves_with_a_revoked_partition() -> None:
    metrics = worker(max_pod_series=2)
    for uid in ("u1", "u2", "u3"):
        metrics.observe_usage(usage(uid, ts=T0, share=0.4))
    metrics.forget(pods=["u3"])
    for uid, pod in (("u1", "p1"), ("u2", "p2"), ("u3", "p3")):
        metrics.observe_lifecycle(lifecycle(uid, to="finished", ts=T0, pod=pod))
    # u1 was the oldest of three kept for two pods; u3 went with its partition.
    shown = {s["pod"] for s in series(metrics, "gpuwatch_pod_gpu_share_ratio")}
    assert shown == {"p2"}


def test_a_usage_and_a_window_ending_together_show_the_usage_in_either_order() -> None:
    window, reading = attribution(start=T0), usage(ts=T0 + 55 * S, share=0.5, vram=9)
    assert reading.end_ts == window.window_end
    for records in ((window, reading), (reading, window)):
        metrics = worker()
        metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
        for record in records:
            if isinstance(record, Attribution):
                metrics.observe_attribution(record)
            else:
                metrics.observe_usage(record)
        assert value(metrics, "gpuwatch_pod_gpu_share_ratio", **GPU_LABELS) == 0.5
        assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 9


def test_a_lower_revision_of_the_window_shown_does_not_replace_it() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle(to="running", ts=T0))
    revised = attribution(start=T0, revision=1)
    metrics.observe_attribution(revised)
    metrics.observe_attribution(attribution(start=T0, gpus=[gpu_of(revised, vram=3)]))
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 61203283968
    metrics.observe_attribution(attribution(start=T0, revision=2, gpus=[gpu_of(revised, vram=4)]))
    assert value(metrics, "gpuwatch_pod_gpu_memory_bytes", **GPU_LABELS) == 4


def gpu_of(record: Attribution, vram: int) -> dict[str, object]:
    """The record's GPU as a dict, with another peak VRAM."""
    raw: dict[str, object] = msgspec.to_builtins(record.gpus[0])
    return raw | {"vram_peak_bytes": vram}
