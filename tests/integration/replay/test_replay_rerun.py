"""`gpuwatch replay --rerun` on the real broker: 90 s of a node re-processed with idle at 87 %."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from clusters import in_cluster, other_uid
from conftest import RunCli, Sandbox
from topic_io import NewScope, consume_all
from worker_fixtures import FINISH_S, TICKS, WINDOW_MS, S, aligned_t0, decoded, produce, scenario

from schemas import ALL_TOPICS, ATTRIBUTION, K8S_PODS, NVML_SAMPLES
from schemas.settings import Settings

pytestmark = pytest.mark.integration

IDLE_PCT = 87.0  # the training pod runs at 85-89 % (pauses near 1 %): this splits its seconds


def ends(settings: Settings) -> dict[str, int]:
    """Records in each public topic of the scope."""
    prefix = settings.kafka.topic_prefix
    return {spec.name: len(consume_all(settings, spec.full_name(prefix))) for spec in ALL_TOPICS}


def test_a_rerun_with_another_idle_threshold_gives_the_idle_seconds_it_implies(
    new_scope: NewScope, run_cli: RunCli, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = new_scope()
    case = scenario(live, aligned_t0())
    produce(live, case.messages)
    before = ends(live)
    target = live.kafka.topic_prefix.rstrip(".") + "-rerun."
    sandbox.prefixes.append(target)
    monkeypatch.setenv("GPUWATCH_IDLE_UTIL_PCT", f"{IDLE_PCT:g}")

    t0 = case.t0
    args = ["--rerun", "--to-prefix", target, "--from", str(t0), "--to", str(t0 + TICKS * S)]
    code, out, err = run_cli(live, *args, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert "the rerun writes Redis database 1" in err
    log = Path(result["worker_log"])
    assert log.parent == sandbox.logs
    assert "worker stopped" in log.read_text()  # SIGTERM, a clean stop

    # What the threshold implies, from the samples themselves: a second of an exclusive GPU
    # allocated to the pod with a reading under the threshold is an idle second of that pod.
    def idle_seconds(uid: str, start: int, end: int) -> float:
        total = 0.0
        for sample in case.samples:
            if not start <= sample.ts < end:
                continue
            held = {d for a in sample.allocations if a.pod_uid == uid for d in a.device_ids}
            for gpu in sample.gpus:
                if gpu.uuid in held and gpu.util_pct is not None and gpu.util_pct < IDLE_PCT:
                    total += sample.interval_ms / 1000
        return total

    training, idle = case.training.uid, case.idle.uid
    windows = {
        (training, t0): t0 + WINDOW_MS,
        (training, t0 + WINDOW_MS): t0 + FINISH_S * S,  # it finished at +75 s
        (idle, t0): t0 + WINDOW_MS,
        # The range is widened to t0 + 120 s and the input ends there: the idle pod's
        # second window closes too, with the 30 s of samples it has.
        (idle, t0 + WINDOW_MS): t0 + 2 * WINDOW_MS,
    }
    rerun = Settings.model_validate(
        live.model_dump() | {"kafka": live.kafka.model_dump() | {"topic_prefix": target}}
    )
    records = {(a.uid, a.window_start): a for a in decoded(rerun, ATTRIBUTION)}
    assert set(records) == set(windows)
    expected = {key: idle_seconds(key[0], key[1], end) for key, end in windows.items()}
    assert 0 < expected[(training, t0)] < 60  # the threshold matters: some seconds, not all
    assert expected[(idle, t0)] == 60.0
    for key, seconds in expected.items():
        assert records[key].idle_gpu_seconds == pytest.approx(seconds, abs=1e-6), key
    assert result["rerun_totals"]["idle_gpu_seconds"] == pytest.approx(sum(expected.values()))
    assert result["rerun_totals"]["pod_windows"] == 4
    assert result["live_totals"]["pod_windows"] == 0  # no live worker ran here
    assert result["settings"]["idle_util_pct"] == IDLE_PCT

    # Copied: the 90 samples; the two running pods' events from before t0 as their state,
    # then the queued pod (t0) and the training pod's end (t0 + 75 s).
    assert result["copied"] == {"k8s.pods": 4, "nvml.samples": TICKS}
    assert result["before_range"] == {"k8s.nodes": 0, "k8s.pods": 2, "nvml.samples": 0}
    assert result["derived"]["attribution"] == 4
    copied_pods = [K8S_PODS.decode(r.value) for r in consume_all(rerun, K8S_PODS.full_name(target))]
    assert sorted(p.name for p in copied_pods) == sorted(
        [case.training.name, case.idle.name, "queued-0", case.training.name]
    )
    assert len(consume_all(rerun, NVML_SAMPLES.full_name(target))) == TICKS

    # Live state untouched: the live topics hold what was produced, the live Redis nothing.
    assert ends(live) == before
    assert before["attribution"] == 0
    live_db = redis.Redis(port=sandbox.redis_port, db=0)
    rerun_db = redis.Redis(port=sandbox.redis_port, db=1)
    try:
        assert live_db.dbsize() == 0
        keys: Any = rerun_db.keys("gpuwatch:pod:*")
        assert {k.decode().rsplit(":", 1)[1] for k in keys} >= {training, idle}
    finally:
        live_db.close()
        rerun_db.close()


def test_the_live_prefix_and_redis_are_refused(new_scope: NewScope, run_cli: RunCli) -> None:
    live = new_scope()
    prefix = live.kafka.topic_prefix
    code, _, err = run_cli(live, "--rerun", "--to-prefix", prefix, "--from", "-1h")
    assert code == 1
    assert "would write the live topics" in err
    url = live.redis.url.get_secret_value()
    args = ["--rerun", "--to-prefix", "x-" + prefix, "--from", "-1h", "--redis-url", url]
    code, _, err = run_cli(live, *args)
    assert code == 1
    assert "is the live Redis database" in err


def test_a_rerun_of_one_cluster_re_processes_its_inputs_alone(
    new_scope: NewScope, run_cli: RunCli, sandbox: Sandbox
) -> None:
    """The same 90 s as the default cluster and as `east` (same node and pod names):
    `--cluster east` copies east's inputs alone, its node state included, and its windows
    are east's pods'."""
    live = new_scope()
    case = scenario(live, aligned_t0())
    produce(live, [*case.messages, *(in_cluster(m, "east") for m in case.messages)])
    target = live.kafka.topic_prefix.rstrip(".") + "-rerun."
    sandbox.prefixes.append(target)
    t0 = case.t0
    args = ["--rerun", "--to-prefix", target, "--from", str(t0), "--to", str(t0 + TICKS * S)]
    code, out, err = run_cli(live, *args, "--cluster", "east", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["cluster"] == "east"
    assert result["copied"] == {"k8s.pods": 4, "nvml.samples": TICKS}  # one cluster's
    assert result["before_range"] == {"k8s.nodes": 0, "k8s.pods": 2, "nvml.samples": 0}
    rerun = Settings.model_validate(
        live.model_dump() | {"kafka": live.kafka.model_dump() | {"topic_prefix": target}}
    )
    records = decoded(rerun, ATTRIBUTION)
    assert {(a.uid, a.cluster) for a in records} == {
        (other_uid(case.training.uid), "east"),
        (other_uid(case.idle.uid), "east"),
    }
    assert result["rerun_totals"]["pod_windows"] == 4
