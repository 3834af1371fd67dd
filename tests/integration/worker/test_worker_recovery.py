"""Same input, same records: with two workers sharing the partitions, and across a kill -9."""

from __future__ import annotations

import signal
from typing import Any

import msgspec
import pytest
from topic_io import NewScope
from worker_fixtures import (
    StartWorker,
    Worker,
    aligned_t0,
    decoded,
    group_members,
    identities,
    produce,
    scenario,
    wait_for,
)

from schemas import ALERTS, ATTRIBUTION, GPU_WINDOWS, POD_USAGE
from schemas.settings import Settings

pytestmark = pytest.mark.integration


def finished(settings: Settings) -> bool:
    """All the scenario's windows and alerts are out (3 attributions, 2 GPU windows, 3 alerts)."""
    return (
        len({(a.uid, a.window_start) for a in decoded(settings, ATTRIBUTION)}) >= 3
        and len(decoded(settings, GPU_WINDOWS)) >= 2
        and len({a.fingerprint for a in decoded(settings, ALERTS)}) >= 3
    )


def assert_same_records(got: Settings, want: Settings) -> None:
    """Every identity of `want` is in `got`, each copy equal to `want`'s one record."""
    expected, actual = identities(want), identities(got)
    for topic, records in expected.items():
        assert sorted(actual[topic]) == sorted(records), topic
        for identity, (record,) in records.items():
            for copy in actual[topic][identity]:
                diff = {
                    name: (getattr(copy, name), value)
                    for name, value in msgspec.structs.asdict(record).items()
                    if getattr(copy, name) != value
                }
                assert diff == {}, (topic, identity)


def run_alone(settings: Settings, start: StartWorker, messages: list[Any]) -> Worker:
    produce(settings, messages)
    worker = start(settings, "alone")
    wait_for("the undisturbed run", lambda: finished(settings), worker)
    return worker


def test_two_workers_and_a_killed_worker_give_the_records_of_an_undisturbed_run(
    new_scope: NewScope, start_worker: StartWorker
) -> None:
    t0 = aligned_t0()
    baseline, shared, killed = new_scope(), new_scope(), new_scope()
    messages = scenario(baseline, t0).messages  # the topic names differ only by prefix

    def moved(settings: Settings, part: list[Any]) -> list[Any]:
        old, new = baseline.kafka.topic_prefix, settings.kafka.topic_prefix
        return [(new + topic.removeprefix(old), *rest) for topic, *rest in part]

    # Two workers join first; the data comes once they share the partitions.
    first, second = start_worker(shared, "w1"), start_worker(shared, "w2")
    wait_for("two workers in the group", lambda: group_members(shared) == 2, first)
    produce(shared, moved(shared, messages))
    # The undisturbed run, meanwhile.
    alone = run_alone(baseline, start_worker, messages)
    wait_for("the shared run", lambda: finished(shared), second)
    for worker in (alone, first, second):
        worker.stop()
        assert worker.process.returncode == 0, worker.log
    assert alone.counters()["late"] == 0
    assert first.counters()["events"] > 0
    assert second.counters()["events"] > 0
    assert_same_records(shared, baseline)

    # Kill -9 mid-stream: the rest of the input comes while it is down.
    half = sum("k8s.pods" in topic for topic, *_ in messages) + 45  # pod events, 45 samples
    produce(killed, moved(killed, messages[:half]))
    victim = start_worker(killed, "victim")
    wait_for("usage from the first half", lambda: len(decoded(killed, POD_USAGE)) >= 4, victim)
    victim.stop(signal.SIGKILL)
    assert victim.process.returncode == -signal.SIGKILL
    produce(killed, moved(killed, messages[half:]))
    restarted = start_worker(killed, "restarted")
    wait_for("the run after the restart", lambda: finished(killed), restarted)
    restarted.stop()
    assert restarted.counters()["late"] == 0
    assert_same_records(killed, baseline)
