"""A worker behind its input gives the numbers of one that is not (SEMANTICS.md, Time).

Twelve hours of ten nodes (4 GPUs each, sampled every 57 s) and some 250 pods that come and
go, whose GPUs vanish from the samples for a while, on 12 partitions: produced paced while
a worker runs, produced whole before a worker starts, and produced whole with the worker
killed (`kill -9`) halfway and started again. Every derived record is the same in the
three; nothing is late; every pod's allocated and idle GPU-seconds equal its samples'.
And a whole day of some 500 pods worked off as a backlog, as a user replaying a day sees it.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from backlog_runs import (
    DONE_S,
    PARTITIONS,
    a_day,
    complete,
    messages,
    produce_paced,
    produced,
    twelve_hours,
)
from histories import History
from topic_io import NewScope, topic_scopes
from worker_fixtures import StartWorker, Worker, produce, wait_for, worker_starter

from schemas.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def history() -> History:
    return twelve_hours(seed=15)


@pytest.fixture
def scope12(stack: Settings) -> Iterator[NewScope]:
    """Scopes of 12 partitions (the default), topics created, deleted after."""
    with topic_scopes(stack, partitions=PARTITIONS) as scope:
        yield scope


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    """The same identities, each with one content equal to the other run's."""
    for topic, expected in want.items():
        extra, missing = set(got[topic]) - set(expected), set(expected) - set(got[topic])
        uids = sorted({identity[0] for identity in extra | missing})[:5]
        differing = {"extra": sorted(extra)[:10], "missing": sorted(missing)[:10]}
        assert differing == {"extra": [], "missing": []}, (
            topic,
            [story(got, want, uid) for uid in uids],
        )
        for identity, copies in got[topic].items():
            assert set(copies) == set(expected[identity]), (
                topic,
                identity,
                differ(copies, expected[identity]),
                story(got, want, identity[0]),
            )
            assert len(set(copies)) == 1, (topic, identity)


def story(got: dict[str, Any], want: dict[str, Any], uid: str) -> dict[str, list[str]]:
    """The pod's lifecycle in each run: ts, from, to, reason, running and stalled ms."""

    def of(run: dict[str, Any]) -> list[str]:
        out = []
        for identity, copies in sorted(run["pod.lifecycle"].items()):
            if identity[0] == uid:
                for copy in copies:
                    c = json.loads(copy)
                    out.append(
                        f"{c['ts']} {c['from_state']}->{c['to_state']} {c['reason']}"
                        f" run {c['running_ms']} stall {c['stalled_ms']}"
                    )
        return out

    return {"got": of(got), "want": of(want)}


def differ(got: list[str], want: list[str]) -> list[dict[str, Any]]:
    """Per copy not in `want`, the fields where it differs from `want`'s first copy."""
    base = json.loads(want[0])
    out = []
    for copy in sorted(set(got) - set(want)):
        value = json.loads(copy)
        keys = sorted(set(value) | set(base))
        out.append({k: (value.get(k), base.get(k)) for k in keys if value.get(k) != base.get(k)})
    return out


@pytest.fixture(scope="module")
def paced_run(stack: Settings, history: History, tmp_path_factory: Any) -> dict[str, Any]:
    """The history produced as it happens, over about 30 s, while one worker keeps up."""
    with (
        topic_scopes(stack, partitions=PARTITIONS) as scope,
        worker_starter(tmp_path_factory.mktemp("paced")) as start,
    ):
        live = scope()
        worker = start(live)
        producer = produce_paced(live, history, seconds=30.0)
        producer.join()
        started = time.monotonic()
        result = complete(live, history, worker)
        worker.stop()
        result["@counters"] = worker.counters()
        figures = {
            "pods": len(history.pods),
            "attribution": len(result["attribution"]),
            "gpu_windows": len(result["gpu.windows"]),
            "lifecycle": len(result["pod.lifecycle"]),
            "alerts": len(result["alerts"]),
            "complete_after_production_s": round(time.monotonic() - started, 1),
            **worker.counters(),
        }
        print("FIGURES paced", json.dumps(figures))
        return result


def work_off(
    backlog: Settings, history: History, start_worker: StartWorker
) -> tuple[dict[str, Any], float, Worker]:
    """The history produced whole, then one worker until every pod adds up: (records, s, worker)."""
    produce(backlog, messages(backlog, history))
    worker = start_worker(backlog)
    started = time.monotonic()
    result = complete(backlog, history, worker)
    took = time.monotonic() - started
    worker.stop()
    return result, took, worker


def test_the_history_is_what_the_test_needs(history: History) -> None:
    assert len(history.nodes) == 10
    assert history.duration_ms >= 12 * 3_600_000
    assert 100 <= len(history.pods) <= 400
    assert any(p.vanished for p in history.pods)
    assert any(p.idle for p in history.pods)


def test_paced_every_pod_adds_up_and_nothing_is_late(paced_run: dict[str, Any]) -> None:
    assert paced_run["@counters"]["late"] == 0
    assert paced_run["@counters"]["deadletter"] == 0
    assert len(paced_run["attribution"]) > 5_000


def test_a_backlog_gives_the_paced_records(
    scope12: NewScope, start_worker: StartWorker, history: History, paced_run: dict[str, Any]
) -> None:
    result, took, worker = work_off(scope12(), history, start_worker)
    assert worker.counters()["late"] == 0
    samples = sum(1 for m in history.inputs() if m.spec.name == "nvml.samples")
    figures = {"backlog_s": round(took, 1), "node_samples": samples, **worker.counters()}
    print("FIGURES backlog", json.dumps(figures))
    assert_same(result, {k: v for k, v in paced_run.items() if not k.startswith("@")})


def test_a_backlog_with_a_kill_a_quarter_in_gives_the_paced_records(
    scope12: NewScope, start_worker: StartWorker, history: History, paced_run: dict[str, Any]
) -> None:
    backlog = scope12()
    produce(backlog, messages(backlog, history))
    first = start_worker(backlog, instance="w1")
    quarter = len(paced_run["attribution"]) // 4
    wait_for(
        "a quarter of the attribution",
        lambda: produced(backlog, "attribution") >= quarter,  # end offsets: no lag
        first,
        timeout_s=DONE_S,
    )
    first.stop(signal.SIGKILL)
    second = start_worker(backlog, instance="w2")
    result = complete(backlog, history, second)
    second.stop()
    assert second.counters()["late"] == 0
    assert second.counters()["events"] > 0  # the first had not finished: a restart was tested
    assert_same(result, {k: v for k, v in paced_run.items() if not k.startswith("@")})


def test_a_day_of_history_worked_off_adds_up_for_every_pod(
    scope12: NewScope, start_worker: StartWorker
) -> None:
    """What a user replaying a day sees: every pod's allocated and idle GPU-seconds in its
    attribution equal its samples' to 1e-6 (`complete` waits for exactly that), none late."""
    day = a_day(seed=24)
    assert day.duration_ms >= 24 * 3_600_000
    assert 300 <= len(day.pods) <= 800
    result, took, worker = work_off(scope12(), day, start_worker)
    counters = worker.counters()
    assert counters["late"] == 0
    assert counters["deadletter"] == 0
    samples = sum(1 for m in day.inputs() if m.spec.name == "nvml.samples")
    allocated = sum(allocated for allocated, _ in day.expected().values())
    figures = {
        "pods": len(day.pods),
        "node_samples": samples,
        "allocated_gpu_seconds": round(allocated, 3),
        "attribution": len(result["attribution"]),
        "backlog_s": round(took, 1),
        **counters,
    }
    print("FIGURES day", json.dumps(figures))
