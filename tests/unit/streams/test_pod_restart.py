"""A restart reads the pod side's inputs again from the oldest one held: the records stay equal."""

from __future__ import annotations

from test_pod_fixtures import UID, pod, usage
from test_pod_processor import PODS, PREFIX, USAGE, B, S, claims, decoded, part

from schemas import ATTRIBUTION, K8S_PODS, POD_USAGE
from schemas.ids import PodUid
from streams.core.pod import pod_state
from streams.processors.outputs import Counters, Outputs, Source
from streams.processors.pod import FINISHED_KEEP_MS, FORGOTTEN, SENT_AGAIN_KEEP_MS, PodPartition

OTHER = PodUid("99999999-2222-4333-8444-555555555555")
HOUR_S = 3600


def inputs() -> list[tuple[str, int, bytes]]:
    """A pod running a minute, its usage in six messages, and among them usage of another pod
    three hours ahead (held by the pod side until the watermark reaches it)."""
    events = [
        K8S_PODS.encode(pod("Running", ts=B, rv=1, created_at=B)),
        K8S_PODS.encode(pod("Succeeded", ts=B + 60 * S, rv=2, created_at=B)),
    ]
    used = [POD_USAGE.encode(usage(B + s * S, B + (s + 10) * S)) for s in range(0, 60, 10)]
    ahead = usage(B + 3 * HOUR_S * S, B + (3 * HOUR_S + 10) * S, uid=OTHER)
    usages = [*used[:3], POD_USAGE.encode(ahead), *used[3:]]
    return [(PODS, i, raw) for i, raw in enumerate(events)] + [
        (USAGE, i, raw) for i, raw in enumerate(usages)
    ]


def key(topic: str, raw: bytes) -> bytes:
    """An input's key: its pod's uid."""
    return (K8S_PODS if topic == PODS else POD_USAGE).decode(raw).uid.encode()


def forgotten(counters: Counters) -> tuple[PodPartition, Outputs, int]:
    """The inputs processed, then a watermark an hour after the pod finished: it is forgotten
    while the other pod's usage is still held. (partition, outputs, watermark)"""
    p, out = part(counters), Outputs(PREFIX, counters)
    for topic, offset, raw in inputs():
        p.handle(Source(topic, 0, offset, key(topic, raw)), raw, out)
    now = B + 60 * S + FINISHED_KEEP_MS + 20 * S
    p.on_tick(claims(p0=now, p1=now), out)
    assert UID not in p.pods
    return p, out, now


def test_a_pod_forgotten_before_a_restart_is_not_started_again_by_its_inputs_read_again() -> None:
    counters = Counters()
    first, out, now = forgotten(counters)
    ((window, allocated),) = [
        (a.window_start, a.allocated_gpu_seconds) for a in decoded(out, ATTRIBUTION)
    ]
    assert (window, allocated) == (B, 60.0)
    stored = [(k, v) for k, v in first.take_writes() if v is not None]
    assert [k for k, _ in stored] == [FORGOTTEN + UID.encode()]
    positions = {PODS: 2, **first.resume_offsets()}  # what the agent loop stores with it
    assert positions == {PODS: 2, USAGE: 3}

    again, out2 = part(counters, stored), Outputs(PREFIX, counters)
    for topic, offset, raw in inputs():
        if offset >= positions[topic]:
            again.handle(Source(topic, 0, offset, key(topic, raw)), raw, out2)
    later = now + 600 * S  # past the 5 minutes a pod without a pod event keeps its windows
    again.on_tick(claims(p0=later, p1=later), out2)
    # Before: the last 30 s read again started the pod anew, and its window came out again
    # with 30 of its 60 allocated seconds, unnamed, over the complete record.
    assert decoded(out2, ATTRIBUTION) == []


def test_usage_sent_again_after_the_pod_was_forgotten_does_not_start_it_anew() -> None:
    """A restarted node side sends again, at new offsets, usage the pod side had applied
    before the watermark (old claims) made it forget the pod."""
    counters = Counters()
    first, _, now = forgotten(counters)
    stored = [(k, v) for k, v in first.take_writes() if v is not None]
    again = part(counters, stored)
    for p, offset in ((first, 7), (again, 7)):  # offset 7: past every input of the history
        sent_again = POD_USAGE.encode(usage(B + 50 * S, B + 60 * S))
        out2 = Outputs(PREFIX, counters)
        p.handle(Source(USAGE, 0, offset, None), sent_again, out2)
        later = now + 600 * S  # past the 5 minutes an unnamed pod keeps its windows
        p.on_tick(claims(p0=later, p1=later), out2)
        # Before: the copy started the pod anew, and its window came out again with 10 of
        # its 60 allocated seconds, unnamed, over the complete record.
        assert UID not in p.pods
        assert decoded(out2, ATTRIBUTION) == []


def test_a_forgotten_pod_stored_in_the_older_form_still_skips_what_is_read_again() -> None:
    older = (FORGOTTEN + UID.encode(), b'{"%s":5}' % USAGE.encode())
    p, out = part(Counters(), [older]), Outputs(PREFIX, Counters())
    p.handle(Source(USAGE, 0, 5, None), POD_USAGE.encode(usage(B, B + 10 * S)), out)
    assert UID not in p.pods
    assert pod_state.decode_forgotten(older[1]) == pod_state.Forgotten(read={USAGE: 5})


def test_a_forgotten_pod_is_dropped_from_the_state_once_nothing_can_come_again() -> None:
    p, out, _ = forgotten(Counters())
    p.take_writes()
    # The other pod's usage is released (nothing is held), but the pod's usage could still
    # be sent again: it is kept until the watermark is that much past its forgetting.
    soon = B + 4 * HOUR_S * S
    p.on_tick(claims(p0=soon, p1=soon), out)
    assert p.resume_offsets() == {}
    assert [key for key, _ in p.take_writes() if key.startswith(FORGOTTEN)] == []
    far = B + 60 * S + FINISHED_KEEP_MS + SENT_AGAIN_KEEP_MS + 60 * S
    p.on_tick(claims(p0=far, p1=far), out)
    assert p.resume_offsets() == {}
    writes = p.take_writes()
    assert (FORGOTTEN + UID.encode(), None) in writes
    # A new input of the same uid (past the forgotten offsets) is a new input as before.
    late = POD_USAGE.encode(usage(far, far + 10 * S))
    p.handle(Source(USAGE, 0, 7, None), late, out)
    assert UID in p.pods
