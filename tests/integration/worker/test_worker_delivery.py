"""Records the broker refuses stop the worker before it stores state past them; once the topic
takes them again, a restarted worker gives the records of an undisturbed run."""

from __future__ import annotations

import pytest
from kafka.admin import ConfigResource, ConfigResourceType
from topic_io import NewScope, consume_all
from worker_fixtures import (
    StartWorker,
    aligned_t0,
    assert_same_records,
    decoded,
    finished,
    moved,
    produce,
    run_alone,
    scenario,
    wait_for,
)

from gpuwatch import kafka
from schemas import ATTRIBUTION
from schemas.settings import Settings
from streams.core.pod import pod_state
from streams.core.pod.pod_state import PodState
from streams.faust.app import changelog_topic_names

pytestmark = pytest.mark.integration

TOO_SMALL = "100"  # bytes: below any attribution record batch (a record is about 1 kB)
BROKER_DEFAULT = "1048588"  # Kafka's default max.message.bytes


def set_max_message_bytes(settings: Settings, topic: str, value: str) -> None:
    """Change `topic`'s max.message.bytes on the broker."""
    admin = kafka.admin(settings.kafka)
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": value})
        admin.alter_configs([resource])
    finally:
        admin.close()


def stored_pod_states(settings: Settings, uids: set[str]) -> dict[str, PodState]:
    """The state of each pod of `uids` the worker's changelog holds now (its last value)."""
    _, pod_log = changelog_topic_names(settings)
    states: dict[str, PodState] = {}
    for record in consume_all(settings, pod_log):
        uid = record.key.split(b"|", 1)[1].decode()
        if uid in uids:
            if record.value is None:
                states.pop(uid, None)
            else:
                states[uid] = pod_state.decode(record.value)
    return states


def test_refused_outputs_stop_the_worker_unstored_and_a_restart_sends_them(
    new_scope: NewScope, start_worker: StartWorker
) -> None:
    t0 = aligned_t0()
    baseline, refused = new_scope(), new_scope()
    messages = scenario(baseline, t0).messages
    attribution = ATTRIBUTION.full_name(refused.kafka.topic_prefix)
    set_max_message_bytes(refused, attribution, TOO_SMALL)
    produce(refused, moved(messages, baseline, refused))
    worker = start_worker(refused, "refused")
    alone = run_alone(baseline, start_worker, messages)

    # The first attribution window the broker refuses stops the worker, non-zero.
    wait_for("the worker to stop", lambda: worker.process.poll() is not None, timeout_s=60)
    assert worker.process.returncode not in (0, None), worker.log
    assert f"delivery failed topic={attribution}" in worker.log
    assert "MessageSizeTooLargeError" in worker.log
    assert decoded(refused, ATTRIBUTION) == []
    # No pod state stored counts a refused window as closed: a restart closes it again. (A
    # pod whose events were still held when the worker stopped has none stored.)
    windows = {(a.uid, a.window_start) for a in decoded(baseline, ATTRIBUTION)}
    assert len(windows) >= 3
    stored = stored_pod_states(refused, {uid for uid, _ in windows})
    for uid, start in windows:
        if uid in stored:
            assert stored[uid].closed_until <= start, (uid, start, stored[uid].closed_until)

    # The topic takes records again: the restart reads the inputs again and sends them.
    set_max_message_bytes(refused, attribution, BROKER_DEFAULT)
    restarted = start_worker(refused, "restarted")
    wait_for("the run after the restart", lambda: finished(refused), restarted)
    for run in (alone, restarted):
        run.stop()
        assert run.process.returncode == 0, run.log
    assert restarted.counters()["late"] == 0
    assert_same_records(refused, baseline)
