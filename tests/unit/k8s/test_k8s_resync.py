"""What is published after an event or a relist: changes only, DELETED always, event time."""

from __future__ import annotations

import msgspec
import pytest

from gpuwatch.harness.examples import example
from producers.k8s.normalise import Stamps
from producers.k8s.resync import Observed, Published, content, event_ts, on_change, relist
from schemas import K8sNode, K8sPod
from schemas.ids import NodeName

NOW = 1_741_100_000_000
BASE = msgspec.convert(example("gpuwatch.k8s.pod/v1"), K8sPod)


def pod(uid: str = "u1", rv: str = "10", **changes: object) -> K8sPod:
    return msgspec.structs.replace(
        BASE, uid=uid, resource_version=rv, type="ADDED", ts=0, **changes
    )


def observed(value: K8sPod, stamps: Stamps = frozenset()) -> Observed[K8sPod]:
    return Observed(value.uid, value.resource_version, value, stamps)


def published(
    value: K8sPod, ts: int, stamps: Stamps = frozenset(), rv: str | None = None
) -> Published[K8sPod]:
    sent = msgspec.structs.replace(value, type="ADDED", ts=ts)
    return Published(rv or value.resource_version, sent, stamps)


def test_content_ignores_type_ts_and_resource_version() -> None:
    a = pod(rv="1")
    b = msgspec.structs.replace(pod(rv="2"), type="RESYNC", ts=5)
    assert content(a) == content(b)
    assert content(a) != content(pod(phase="Succeeded"))
    node = K8sNode(
        schema="gpuwatch.k8s.node/v1",
        type="MODIFIED",
        node=NodeName("n"),
        ts=9,
        gpu_capacity={},
        gpu_allocatable={},
        gpu_product=None,
        labels={},
        ready=True,
        unschedulable=False,
    )
    assert content(node) == msgspec.structs.replace(node, type="ADDED", ts=0)


def test_a_new_object_goes_out_as_added_at_its_latest_recorded_transition() -> None:
    stamps = frozenset({("created", NOW - 5000), ("condition/PodScheduled", NOW - 2000)})
    entry, message = on_change(None, "MODIFIED", observed(pod(), stamps), NOW)
    assert message is not None
    assert (message.type, message.ts) == ("ADDED", NOW - 2000)
    assert entry == Published("10", message, stamps)


def test_status_churn_publishes_nothing_but_moves_the_resource_version() -> None:
    before = published(pod(rv="10"), NOW - 100)
    entry, message = on_change(before, "MODIFIED", observed(pod(rv="11")), NOW)
    assert message is None
    assert entry == Published("11", before.value, before.stamps)


def test_a_change_is_modified_at_the_time_of_its_new_stamp() -> None:
    old_stamps = frozenset({("created", NOW - 9000)})
    new_stamps = old_stamps | {("condition/Ready", NOW - 700)}
    before = published(pod(), NOW - 9000, old_stamps)
    _, message = on_change(
        before, "MODIFIED", observed(pod(rv="11", phase="Succeeded"), new_stamps), NOW
    )
    assert message is not None
    assert (message.type, message.ts, message.phase, message.resource_version) == (
        "MODIFIED",
        NOW - 700,
        "Succeeded",
        "11",
    )


def test_a_change_without_a_recorded_time_takes_the_clock() -> None:
    stamps = frozenset({("created", NOW - 9000)})
    before = published(pod(), NOW - 9000, stamps)
    _, message = on_change(
        before, "MODIFIED", observed(pod(rv="11", labels={"team": "x"}), stamps), NOW
    )
    assert message is not None
    assert message.ts == NOW


def test_a_future_stamp_is_capped_at_the_clock_and_ts_never_goes_back() -> None:
    # deletionTimestamp is the end of the grace period: in the future when set.
    before = published(pod(), NOW - 10, frozenset({("created", NOW - 9000)}))
    assert event_ts(before, frozenset({("deleted", NOW + 30_000)}), NOW) == NOW
    # A new stamp older than what was already published (second precision) is clamped.
    assert event_ts(before, frozenset({("condition/Ready", NOW - 900)}), NOW) == NOW - 10
    assert event_ts(None, frozenset(), NOW) == NOW


def test_deleted_is_always_published_for_a_published_key_only() -> None:
    before = published(pod(), NOW - 100)
    entry, message = on_change(before, "DELETED", observed(pod(rv="12")), NOW)
    assert entry is None
    assert message is not None
    assert (message.type, message.resource_version, message.ts) == ("DELETED", "12", NOW)
    assert on_change(None, "DELETED", observed(pod()), NOW) == (None, None)


def test_a_relist_publishes_the_difference() -> None:
    same = published(pod("same", "1"), NOW - 50)
    churned = published(pod("churned", "1"), NOW - 50)
    changed = published(pod("changed", "1"), NOW - 50)
    gone = published(pod("gone", "1"), NOW - 50)
    before: dict[str, Published[K8sPod]] = {p.value.uid: p for p in (same, churned, changed, gone)}
    listed = [
        observed(pod("same", "1")),
        observed(pod("churned", "7")),
        observed(
            pod("changed", "8", phase="Succeeded"),
            frozenset({("container/main/finished", NOW - 20)}),
        ),
        observed(pod("new", "9")),
    ]
    out = relist(before, listed, NOW)
    assert [(m.uid, m.type, m.ts) for m in out.messages] == [
        ("changed", "RESYNC", NOW - 20),
        ("new", "ADDED", NOW),
        ("gone", "DELETED", NOW),
    ]
    gone_message = out.messages[2]
    assert gone_message.resource_version == "1"  # the last state we knew
    # How it ended was not seen (client-go's DeletedFinalStateUnknown); the others say nothing.
    assert [m.final_state_unknown for m in out.messages] == [False, False, True]
    assert set(out.published) == {"same", "churned", "changed", "new"}
    assert out.published["churned"].resource_version == "7"
    assert out.published["churned"].value is churned.value


def test_a_cold_start_sends_everything_as_resync() -> None:
    out = relist({}, [observed(pod("a")), observed(pod("b"))], NOW, cold=True)
    assert [(m.uid, m.type) for m in out.messages] == [("a", "RESYNC"), ("b", "RESYNC")]


@pytest.mark.parametrize("resend_all", [True, False])
def test_a_periodic_resync_resends_unchanged_objects(resend_all: bool) -> None:
    before = {"a": published(pod("a"), NOW - 50)}
    out = relist(before, [observed(pod("a"))], NOW, resend_all=resend_all)
    assert [(m.type, m.ts) for m in out.messages] == ([("RESYNC", NOW)] if resend_all else [])
