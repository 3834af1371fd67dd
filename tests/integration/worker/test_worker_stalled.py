"""A worker or sink whose processing stops is seen: its stall gauge rises with the clock,
its /livez answers 503 past the (shortened) limit, and the shipped rule's expression
selects its series, while /metrics keeps answering.

The worker is stopped by derived topics deleted under it (the broker creates no topic on
its own): its sends wait for the topics, so it commits nothing more while inputs arrive.
The Redis sink is stopped by a Redis that is not there. Both resume once the cause goes.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import free_port, run_command
from test_worker_sinks import start_redis
from worker_fixtures import StartWorker, Worker, aligned_t0, produce, scenario, wait_for

from gpuwatch import kafka
from schemas import (
    ATTRIBUTION,
    GPU_WINDOWS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    NVML_SAMPLES,
    POD_USAGE,
)
from schemas.settings import Settings
from sinks.prometheus.collector import serve

pytestmark = pytest.mark.integration

LIMIT_S = 20  # stands in for the production limit (300 s): the stall passes it within a minute
COMMITS_S = 3 * 2.8  # three commit intervals of the worker (WorkerOptions.commit_interval_s)
RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "gpuwatch-rules.yml"


def livez(port: int) -> tuple[int, str]:
    """/livez's status and body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics by sample name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def worst(port: int, prefix: str) -> float | None:
    """The longest stall on the process' /metrics; None before it holds a partition."""
    stalled = scrape(port).get(f"{prefix}stalled_seconds", {})
    return max(stalled.values()) if stalled else None


def delete(settings: Settings, topics: list[str]) -> None:
    """Delete `topics` (the broker creates no topic on its own: the worker's sends wait)."""
    client = kafka.admin(settings.kafka)
    try:
        client.delete_topics(topics)
    finally:
        client.close()


def rising_until_stuck(port: int, prefix: str, worker: Worker) -> list[tuple[float, float]]:
    """(seconds since the first, worst stall) of scrapes until /livez fails."""
    seen: list[tuple[float, float]] = []
    start = time.monotonic()

    def failed() -> bool:
        seen.append((time.monotonic() - start, worst(port, prefix) or 0.0))
        return livez(port)[0] == 503

    wait_for("/livez to fail", failed, worker, timeout_s=LIMIT_S + 40)
    return seen


def serving(check: Callable[[], bool]) -> Callable[[], bool]:
    """`check`, False while the process does not serve /metrics yet."""

    def checked() -> bool:
        try:
            return check()
        except urllib.error.URLError:
            return False

    return checked


def stuck_past_the_limit(
    port: int, prefix: str, process: Worker, *, who: str, rule: str, job: str, tmp_path: Path
) -> None:
    """The stall rises with the clock until /livez fails, naming why, and the shipped rule
    selects the process' series."""
    seen = rising_until_stuck(port, prefix, process)
    status, reason = livez(port)
    assert status == 503
    assert reason.startswith(f"{who} stalled past {LIMIT_S} s:"), reason
    assert rises(seen), seen
    rule_selects(rule, prefix, job, port, tmp_path)


def rises(seen: list[tuple[float, float]]) -> bool:
    """The stall grew with the clock to the limit: the last stretch without a reset rises
    at every scrape (the gauge, not only a single late reading) and ends past the limit."""
    stretch: list[float] = []
    for _, stall in seen:
        stretch = [*stretch, stall] if stall > 0 and stretch and stall > stretch[-1] else [stall]
    return len(stretch) >= 5 and stretch[-1] > LIMIT_S


def rule_selects(rule: str, prefix: str, job: str, port: int, tmp_path: Path) -> None:
    """The shipped rule's expression, on what the process exports now, selects exactly its
    series past the limit (promtool on a unit test made of this scrape)."""
    expr = next(
        r["expr"]
        for group in yaml.safe_load(RULES.read_text("utf-8"))["groups"]
        for r in group["rules"]
        if r.get("alert") == rule
    )
    metrics = scrape(port)
    labels = {"job": job, "instance": "w"}
    (limit,) = metrics[f"{prefix}stall_limit_seconds"].values()
    stalled = metrics[f"{prefix}stalled_seconds"]
    assert any(v > limit for v in stalled.values()), stalled

    def series(name: str, own: tuple[tuple[str, str], ...]) -> str:
        text = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, **dict(own)}.items()))
        return f"{name}{{{text}}}"

    inputs = [{"series": series(f"{prefix}stalled_seconds", k), "values": f"{v}x2"}
              for k, v in stalled.items()]  # fmt: skip
    inputs.append({"series": series(f"{prefix}stall_limit_seconds", ()), "values": f"{limit}x2"})
    expected = [{"labels": series(f"{prefix}stalled_seconds", k), "value": v}
                for k, v in stalled.items() if v > limit]  # fmt: skip
    test = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": inputs,
            "promql_expr_test": [{"expr": expr, "eval_time": "15s", "exp_samples": expected}],
        }],
    }  # fmt: skip
    path = tmp_path / f"{rule}.yml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    done = run_command(["promtool", "test", "rules", str(path)], timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_livez_answers_503_with_the_reason_while_stuck_and_metrics_still_answer() -> None:
    from prometheus_client import CollectorRegistry

    state: dict[str, str | None] = {"reason": None}
    server, _ = serve(free_port(), "127.0.0.1", CollectorRegistry(), lambda: state["reason"])
    port = server.server_address[1]
    try:
        assert livez(port) == (200, "ok\n")
        state["reason"] = "worker stalled past 20 s: t.ticks:1=22s"
        assert livez(port) == (503, "worker stalled past 20 s: t.ticks:1=22s\n")
        assert scrape(port) == {}  # /metrics still answers
    finally:
        server.shutdown()
        server.server_close()


def test_a_worker_whose_output_topics_are_gone_stalls_fails_livez_and_matches_the_rule(
    scoped: Settings, start_worker: StartWorker, tmp_path: Path
) -> None:
    port = free_port()
    case = scenario(scoped, aligned_t0())
    half = len(case.messages) // 2
    produce(scoped, case.messages[:half])
    env = {
        "GPUWATCH_WORKER_SINKS": "true",
        "GPUWATCH_METRICS_PORT": str(port),
        "GPUWATCH_WORKER_STALL_LIMIT_S": str(LIMIT_S),
    }
    worker = start_worker(scoped, env=env)
    prefix = "gpuwatch_worker_"

    def processing() -> bool:
        metrics = scrape(port)
        return bool(metrics.get("gpuwatch_events_total")) and bool(
            metrics.get(f"{prefix}stalled_seconds")
        )

    wait_for("the worker to process its first records", serving(processing), worker, timeout_s=60)
    assert livez(port) == (200, "ok\n")
    healthy = scrape(port)[f"{prefix}stalled_seconds"]
    assert max(healthy.values()) < LIMIT_S
    # What the agents read, not the changelogs the worker writes (read only to restore).
    held = {dict(labels)["topic"] for labels in healthy}
    app = f"{scoped.kafka.topic_prefix}{scoped.kafka.app_id}"
    read = [NVML_SAMPLES, K8S_NODES, K8S_PODS, POD_USAGE, K8S_WORKLOADS]
    agents = {spec.full_name(scoped.kafka.topic_prefix) for spec in read}
    assert held == agents | {f"{app}.ticks", f"{app}.fleet"}, held

    # The second half closes the training pod's windows: their records cannot go out.
    gone = [spec.full_name(scoped.kafka.topic_prefix) for spec in (GPU_WINDOWS, ATTRIBUTION)]
    delete(scoped, gone)
    produce(scoped, case.messages[half:])
    stuck_past_the_limit(
        port, prefix, worker, who="worker", rule="GpuwatchWorkerStalled", job="gpuwatch-worker",
        tmp_path=tmp_path,
    )  # fmt: skip

    # The topics are back (`gpuwatch topics create`): the worker commits, it is live.
    kafka.create_topics(scoped)
    wait_for("/livez to pass again", lambda: livez(port)[0] == 200, worker, timeout_s=60)
    # Ticks come every half second and commits every 2.8 s: a busy partition's stall
    # restarts at each commit, so it stays within a few seconds, never at the limit again.
    settled = lambda: (worst(port, prefix) or 0.0) < COMMITS_S  # noqa: E731
    wait_for("the stalls to restart", settled, worker, timeout_s=30)
    assert worker.process.poll() is None


def test_a_redis_sink_without_redis_stalls_fails_livez_and_matches_the_rule(
    scoped: Settings, start_worker: StartWorker, tmp_path: Path
) -> None:
    redis_port, port = free_port(), free_port()
    case = scenario(scoped, aligned_t0())
    produce(scoped, case.messages)
    env = {
        "GPUWATCH_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "GPUWATCH_SINK_METRICS_PORT": str(port),
        "GPUWATCH_SINK_STALL_LIMIT_S": str(LIMIT_S),
    }
    sink = start_worker(scoped, "sink", env=env, sink="redis")
    prefix = "gpuwatch_sink_"
    holding = serving(lambda: worst(port, prefix) is not None)
    wait_for("the sink to hold its partitions", holding, sink)
    stuck_past_the_limit(
        port, prefix, sink, who="Redis sink", rule="GpuwatchSinkStalled", job="gpuwatch-sink",
        tmp_path=tmp_path,
    )  # fmt: skip

    redis: Any = start_redis(redis_port, tmp_path)
    try:
        wait_for("/livez to pass again", lambda: livez(port)[0] == 200, sink, timeout_s=60)
        assert worst(port, prefix) == 0.0
    finally:
        redis.terminate()
        redis.wait(timeout=10)
