"""Live GPU state between Redis writes: idle runs, newest sample wins, nothing lost on a retry."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuwatch.harness.examples import example
from schemas.ids import GpuUuid, PodUid
from schemas.nvml_sample import Allocation, GpuProcess, NvmlSample
from schemas.settings import RuleSettings
from sinks.redis.live_gpus import LiveGpus
from streams.core.node.gpu_alerts import NodeAlertState, on_sample

T0 = 1_764_412_000_000
S = 1000


def sample(ts: int, util: float | None, *, uuid: str | None = None) -> NvmlSample:
    """The example node sample (one H100 allocated to one pod) at `ts`, with `util`."""
    raw: dict[str, Any] = example("gpuwatch.nvml.sample/v1") | {"ts": ts, "interval_ms": S}
    raw["gpus"][0]["util_pct"] = util
    if uuid is not None:
        raw["gpus"][0]["uuid"] = uuid
    return msgspec.convert(raw, NvmlSample)


def test_idle_since_is_the_first_idle_sample_of_the_run_and_busy_ends_it() -> None:
    live = LiveGpus(idle_util_pct=5.0)
    utils = [50.0, 2.0, 0.0, 4.9, 30.0, 1.0]
    seen = []
    for i, util in enumerate(utils):
        live.observe(sample(T0 + i * S, util))
        (state,) = live.take()
        seen.append(None if state.idle_since is None else (state.idle_since - T0) // S)
    # Idle from the sample at 1 s through the one at 3 s; busy at 4 s; idle again at 5 s.
    assert seen == [None, 1, 1, 1, None, 5]


def test_unknown_utilization_is_not_idle_and_ends_a_run() -> None:
    live = LiveGpus(idle_util_pct=5.0)
    live.observe(sample(T0, 0.0))
    live.observe(sample(T0 + S, None))
    live.observe(sample(T0 + 2 * S, 0.0))
    (state,) = live.take()
    assert (state.idle_since, state.util_pct, state.ts) == (T0 + 2 * S, 0.0, T0 + 3 * S)


def test_the_newest_sample_wins_and_a_replayed_older_one_changes_nothing() -> None:
    live = LiveGpus(idle_util_pct=5.0)
    live.observe(sample(T0 + 5 * S, 70.0))
    live.observe(sample(T0, 0.0))  # a redelivery of an older sample
    (state,) = live.take()
    assert (state.ts, state.util_pct, state.idle_since) == (T0 + 6 * S, 70.0, None)
    assert live.take() == []


def test_states_put_back_after_a_failed_write_lose_to_newer_ones() -> None:
    live = LiveGpus(idle_util_pct=5.0)
    live.observe(sample(T0, 10.0, uuid="GPU-a"))
    live.observe(sample(T0, 20.0, uuid="GPU-b"))
    taken = live.take()
    live.observe(sample(T0 + S, 30.0, uuid="GPU-a"))  # newer than the one taken
    live.put_back(taken)
    back = {s.uuid: s.util_pct for s in live.take()}
    assert back == {"GPU-a": 30.0, "GPU-b": 20.0}


def test_a_cluster_with_its_own_idle_threshold_uses_it() -> None:
    live = LiveGpus(idle_util_pct=5.0, by_cluster={"dev": 10.0})
    live.observe(sample(T0, 7.0))
    dev = msgspec.structs.replace(sample(T0, 7.0, uuid="GPU-dev"), cluster="dev")
    live.observe(dev)
    states = {state.uuid: state.idle_since for state in live.take()}
    # 7 % is busy by the default threshold, idle by dev's 10 %.
    assert states == {sample(T0, 7.0).gpus[0].uuid: None, "GPU-dev": T0}


# --- The live view's idleness is the idle alert's ------------------------------------------

P, Q = (
    PodUid("pppppppp-0000-4000-8000-000000000000"),
    PodUid("qqqqqqqq-0000-4000-8000-000000000000"),
)
SLICED = GpuUuid("GPU-5115ed00-0000-4000-8000-000000000000")


def _proc(pid: int, pod: PodUid | None, sm: float | None, mem: int | None = 1 << 30) -> GpuProcess:
    return GpuProcess(pid=pid, mem_bytes=mem, sm_pct=sm, pod_uid=pod, container=None)


def _sliced(ts: int, util: float, *procs: GpuProcess) -> NvmlSample:
    """The example node sample with one time-sliced GPU held by pods P and Q."""
    base = sample(ts, util)
    reading = msgspec.structs.replace(
        base.gpus[0], uuid=SLICED, sharing="time-slicing", util_pct=util, processes=procs
    )
    holders = tuple(
        Allocation(
            pod_uid=uid,
            namespace="ml",
            pod=name,
            container="main",
            resource="nvidia.com/gpu",
            device_ids=(SLICED,),
        )
        for uid, name in ((P, "train-0"), (Q, "eval-1"))
    )
    return msgspec.structs.replace(base, gpus=(reading,), allocations=holders)


def _history() -> list[NvmlSample]:
    """Two minutes of a time-sliced GPU, each phase a case where the device's reading and
    its holders' own shares say different things (docs/DESIGN.md §4: a pod is idle by its share)."""
    out = []
    for i in range(120):
        ts = T0 + i * S
        if i < 10:  # P computes, Q holds the GPU and does nothing: the GPU is in use
            out.append(_sliced(ts, 60.0, _proc(1, P, 60.0)))
        elif i < 80:  # both holders idle while a host process (of no pod) keeps it busy
            out.append(_sliced(ts, 72.0, _proc(1, P, 1.0), _proc(2, Q, 1.0), _proc(3, None, 70.0)))
        elif i < 100:  # everything idle
            out.append(_sliced(ts, 0.0, _proc(1, P, 0.0), _proc(2, Q, 0.0)))
        else:  # the device near idle, the holders' shares unknown: unknown is not idle
            out.append(_sliced(ts, 2.0, _proc(1, P, None, None), _proc(2, Q, None, None)))
    return out


def test_a_time_sliced_gpu_is_idle_in_the_live_view_exactly_when_its_idle_alert_says_so() -> None:
    rules = RuleSettings()
    live = LiveGpus(idle_util_pct=rules.idle_util_pct)
    state: NodeAlertState | None = None
    fired: list[tuple[str, str, int]] = []
    seen = []
    for item in _history():
        state, alerts, _ = on_sample(state, item, rules)
        fired += [(a.name, a.status, (a.since - T0) // S) for a in alerts]
        live.observe(item)
        run = state.idle.get(SLICED)
        seen.append((live.idle_since()[SLICED], None if run is None else run.since))
    disagree = [(i, mine, alert) for i, (mine, alert) in enumerate(seen) if mine != alert]
    assert disagree == []
    (written,) = live.take()
    assert written.idle_since is None  # the last phase: unknown
    # The alert fired for the run that began at 10 s and ended when the shares went unknown.
    assert fired == [("GpuIdleAllocated", "firing", 10), ("GpuIdleAllocated", "resolved", 10)]
