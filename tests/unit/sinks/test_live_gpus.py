"""Live GPU state between Redis writes: idle runs, newest sample wins, nothing lost on a retry."""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.examples import example
from schemas.nvml_sample import NvmlSample
from sinks.redis.live_gpus import LiveGpus

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
