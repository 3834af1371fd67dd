"""Same input, same records: with two workers sharing the partitions, and across a kill -9."""

from __future__ import annotations

import signal

import pytest
from topic_io import NewScope
from worker_fixtures import (
    StartWorker,
    aligned_t0,
    assert_same_records,
    decoded,
    finished,
    group_members,
    moved,
    produce,
    run_alone,
    scenario,
    wait_for,
)

from schemas import POD_USAGE

pytestmark = pytest.mark.integration


def test_two_workers_and_a_killed_worker_give_the_records_of_an_undisturbed_run(
    new_scope: NewScope, start_worker: StartWorker
) -> None:
    t0 = aligned_t0()
    baseline, shared, killed = new_scope(), new_scope(), new_scope()
    messages = scenario(baseline, t0).messages  # the topic names differ only by prefix

    # Two workers join first; the data comes once they share the partitions.
    first, second = start_worker(shared, "w1"), start_worker(shared, "w2")
    wait_for("two workers in the group", lambda: group_members(shared) == 2, first)
    produce(shared, moved(messages, baseline, shared))
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
    produce(killed, moved(messages[:half], baseline, killed))
    victim = start_worker(killed, "victim")
    wait_for("usage from the first half", lambda: len(decoded(killed, POD_USAGE)) >= 4, victim)
    victim.stop(signal.SIGKILL)
    assert victim.process.returncode == -signal.SIGKILL
    produce(killed, moved(messages[half:], baseline, killed))
    restarted = start_worker(killed, "restarted")
    wait_for("the run after the restart", lambda: finished(killed), restarted)
    restarted.stop()
    assert restarted.counters()["late"] == 0
    assert_same_records(killed, baseline)
