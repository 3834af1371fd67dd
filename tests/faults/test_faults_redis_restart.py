"""Redis goes away mid-run and comes back: the worker's Redis state converges to its topics.

A worker with its sinks runs the worker tests' scenario against a redis-server of this
test. After the first 45 s of samples Redis matches the derived topics; then Redis goes
(stopped cleanly, or killed), the other 45 s are processed while it is away, it restarts
from what it persisted, and Redis must again hold exactly what the derived topics say
(`fault_checks.redis_mismatches`), with every GPU's live state as of the last sample.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from fault_checks import KEYS_OF, redis_mismatches
from fault_services import Persistence, StartRedis
from support import free_port
from topic_io import NewScope
from worker_fixtures import (
    QUEUED_UID,
    TICKS,
    S,
    StartWorker,
    aligned_t0,
    decoded,
    produce,
    scenario,
    wait_for,
)

from schemas import ALERTS, ATTRIBUTION, GPU_WINDOWS, K8S_PODS

pytestmark = pytest.mark.integration

HALF = 45  # samples before Redis goes
CONVERGE_S = 60.0  # the writer retries every 10 s at most once Redis has been away a while


def finished(settings: Any) -> bool:
    """Every window and alert of the scenario is out (as the recovery test counts them)."""
    return (
        len({(a.uid, a.window_start) for a in decoded(settings, ATTRIBUTION)}) >= 3
        and len(decoded(settings, GPU_WINDOWS)) >= 2
        and len({a.fingerprint for a in decoded(settings, ALERTS)}) >= 3
    )


def live_until(client: redis.Redis, uuids: list[str]) -> dict[str, int | None]:
    """Each GPU's `updated_at` in Redis (its last sample's end); None while Redis is away."""
    out: dict[str, int | None] = {}
    for uuid in uuids:
        try:
            value = client.hget(KEYS_OF.gpu(uuid), "updated_at")
        except redis.ConnectionError:
            value = None
        out[uuid] = None if value is None else int(value)
    return out


def converged(
    client: redis.Redis, settings: Any, uuids: list[str], until: int
) -> Callable[[], bool]:
    """Redis holds what the topics say, and every GPU's live state is as of `until`."""

    def check() -> bool:
        live = set(live_until(client, uuids).values())
        return live == {until} and not redis_mismatches(client, settings)

    return check


@pytest.mark.parametrize(
    ("how", "persistence"),
    [
        ("stopped", "snapshot"),
        ("killed", "aof"),
        # Killed with snapshots only, Redis comes back without the writes since its last
        # snapshot; the writer's positions, stored with each batch, show what it lost.
        ("killed", "snapshot"),
    ],
    ids=["sigterm-snapshot", "sigkill-aof", "sigkill-snapshot"],
)
def test_redis_away_mid_run_comes_back_to_the_state_the_topics_say(
    how: str,
    persistence: Persistence,
    new_scope: NewScope,
    start_worker: StartWorker,
    private_redis: StartRedis,
) -> None:
    figures: dict[str, Any] = {"how": how, "persistence": persistence}
    scoped = new_scope()
    case = scenario(scoped, aligned_t0())
    uuids = [*case.training.gpu_uuids, *case.idle.gpu_uuids]
    # Pod events by event time (the training pod ends at t0 + 75 s), samples by second.
    events = [m for m in case.messages if m[0].endswith(".k8s.pods")]
    samples = [m for m in case.messages if m[0].endswith(".nvml.samples")]
    late = [m for m in events if K8S_PODS.decode(m[2]).ts > case.t0 + HALF * S]
    first = [m for m in events if m not in late] + samples[:HALF]
    rest = late + samples[HALF:]
    assert (len(late), len(rest)) == (1, 1 + TICKS - HALF)
    store = private_redis(persistence)
    env = {
        "GPUWATCH_REDIS_URL": store.url,
        "GPUWATCH_SINK_METRICS_PORT": str(free_port()),
    }
    produce(scoped, first)
    worker = start_worker(scoped)
    sink = start_worker(scoped, "sink", env=env, sink="redis")
    client = redis.Redis(port=store.port, decode_responses=False)
    try:
        half_until = case.t0 + HALF * S
        up_to_half = converged(client, scoped, uuids, half_until)

        def first_half() -> bool:
            # Pod transitions come out once the usage watermark passes them: wait for both.
            return up_to_half() and {case.training.uid, QUEUED_UID} <= set(_states(client, case))

        wait_for("Redis up to the first half", first_half, sink)
        before = _states(client, case)
        assert (before[case.training.uid], before[QUEUED_UID]) == ("running", "queued")

        went = time.monotonic()
        store.stop() if how == "stopped" else store.kill()
        assert store.process is not None
        assert store.process.returncode == (0 if how == "stopped" else -signal.SIGKILL)
        produce(scoped, rest)
        wait_for("the second half's records", lambda: finished(scoped), worker, timeout_s=60)
        wait_for("the sink to notice", lambda: "Redis unavailable" in sink.log, sink)
        figures["away_s"] = round(time.monotonic() - went, 1)
        store.start()
        back = time.monotonic()
        end = case.t0 + TICKS * S
        # Writes lost in a crash never come back: a shorter wait says so sooner.
        within = 20.0 if (how, persistence) == ("killed", "snapshot") else CONVERGE_S
        wait_for("Redis to converge", converged(client, scoped, uuids, end), sink, within)
        figures["converged_after_restart_s"] = round(time.monotonic() - back, 1)
        assert _states(client, case) == {
            case.training.uid: "finished",
            case.idle.uid: "stalled",
            QUEUED_UID: "queued",
        }
    finally:
        client.close()
    worker.stop()
    sink.stop()
    assert worker.process.returncode == 0, worker.log[-3000:]
    assert sink.process.returncode == 0, sink.log[-3000:]
    assert "rejected=0" in sink.log
    print("FIGURES redis", json.dumps(figures))


def _states(client: redis.Redis, case: Any) -> dict[str, str]:
    """The state field of the scenario's pods in Redis."""
    out = {}
    for uid in (case.training.uid, case.idle.uid, QUEUED_UID):
        state = client.hget(KEYS_OF.pod(uid), "state")
        if state is not None:
            out[uid] = state.decode()
    return out
