"""What to publish after a watch event or a relist, given what was published before.

Pure functions over a map `key -> Published` (the last value sent for each pod or node).
A value is published only when its content changed; what counts as content is every
field but `type`, `ts` and `resource_version` (status churn the values do not show, such
as probe times or a new pod IP, publishes nothing). DELETED is always published for a
key that was published.

Event time (`ts`): the latest of the transition times the API recorded that are new
since the last published value (a condition's lastTransitionTime, a container's
startedAt/finishedAt, the deletionTimestamp), never later than the watcher's clock; a
change without a recorded time (ContainerCreating -> ImagePullBackOff, a label edit, a
deletion found by a relist) takes the watcher's clock. Per key, `ts` never goes back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

import msgspec

from producers.k8s.dra import SliceDevices
from producers.k8s.normalise import Stamps
from schemas.fields import K8sEventType
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.k8s_workload import K8sWorkload

__all__ = [
    "Observed",
    "Published",
    "Relisted",
    "content",
    "event_ts",
    "on_change",
    "relist",
    "unseen_deletion",
]

V = TypeVar("V", K8sPod, K8sNode, K8sWorkload, SliceDevices)

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True, slots=True)
class Observed(Generic[V]):
    """An object as just read: its key, resourceVersion, normalised value and stamps."""

    key: str
    resource_version: str
    value: V
    stamps: Stamps


@dataclass(frozen=True, slots=True)
class Published(Generic[V]):
    """The last value published for a key, and the object's latest resourceVersion seen
    (which moves on without a publish when only status churn changed)."""

    resource_version: str
    value: V
    stamps: Stamps


@dataclass
class Relisted(Generic[V]):
    """A relist's outcome: the messages to publish and the new published map."""

    messages: list[V] = field(default_factory=list)
    published: dict[str, Published[V]] = field(default_factory=dict)


def content(value: V) -> V:
    """The value without what changes on every event: type, ts, resource_version and
    whether a deletion was seen (`final_state_unknown`)."""
    if isinstance(value, K8sPod | K8sWorkload):
        return msgspec.structs.replace(
            value, type="ADDED", ts=0, resource_version="", final_state_unknown=False
        )
    return msgspec.structs.replace(value, type="ADDED", ts=0)


def event_ts(previous: Published[V] | None, stamps: Stamps, now_ms: int) -> int:
    """The event time of a change from `previous` to an object with `stamps`."""
    new = stamps - previous.stamps if previous is not None else stamps
    ts = min(max(ms for _, ms in new), now_ms) if new else now_ms
    return max(ts, previous.value.ts) if previous is not None else ts


def _stamped(
    observed: Observed[V], type_: K8sEventType, previous: Published[V] | None, now_ms: int
) -> V:
    ts = event_ts(previous, observed.stamps, now_ms)
    return msgspec.structs.replace(observed.value, type=type_, ts=ts)


def on_change(
    previous: Published[V] | None, change: ChangeType, observed: Observed[V], now_ms: int
) -> tuple[Published[V] | None, V | None]:
    """One watch event: the key's new entry (None: forget it) and the message, if any.

    The caller has decided the object is wanted; an object never published before goes
    out as ADDED whatever the API called the event (a node that just got its GPUs).
    """
    if change == "DELETED":
        if previous is None:
            return None, None
        return None, _stamped(observed, "DELETED", previous, now_ms)
    if previous is not None and content(previous.value) == content(observed.value):
        return Published(observed.resource_version, previous.value, previous.stamps), None
    message = _stamped(observed, "MODIFIED" if previous else "ADDED", previous, now_ms)
    return Published(observed.resource_version, message, observed.stamps), message


def relist(
    published: Mapping[str, Published[V]],
    listed: Iterable[Observed[V]],
    now_ms: int,
    *,
    cold: bool = False,
    resend_all: bool = False,
) -> Relisted[V]:
    """The difference between what was published and a fresh list.

    Changed objects go out as RESYNC, objects never published as ADDED (RESYNC on a
    `cold` start, when nothing is known of what consumers saw), and published keys the
    list lacks as DELETED with their last value (`unseen_deletion`). `resend_all` re-sends
    unchanged objects as RESYNC too, so a topic with time-based retention always holds
    every live object.
    """
    out: Relisted[V] = Relisted()
    for observed in listed:
        previous = published.get(observed.key)
        if previous is None:
            type_: K8sEventType = "RESYNC" if cold else "ADDED"
            message = _stamped(observed, type_, None, now_ms)
        elif (
            previous.resource_version == observed.resource_version
            or content(previous.value) == content(observed.value)
        ) and not resend_all:
            out.published[observed.key] = Published(
                observed.resource_version, previous.value, previous.stamps
            )
            continue
        else:
            message = _stamped(observed, "RESYNC", previous, now_ms)
        out.messages.append(message)
        out.published[observed.key] = Published(observed.resource_version, message, observed.stamps)
    for key in sorted(published.keys() - out.published.keys()):
        out.messages.append(unseen_deletion(published[key].value, now_ms))
    return out


def unseen_deletion(last: V, now_ms: int) -> V:
    """The DELETED of an object a list no longer holds: its last value, at the list's time
    (never before that value), a pod's or a workload's marked `final_state_unknown`
    (client-go's DeletedFinalStateUnknown: how it ended was not seen)."""
    ts = max(now_ms, last.ts)
    if isinstance(last, K8sPod | K8sWorkload):
        return msgspec.structs.replace(last, type="DELETED", ts=ts, final_state_unknown=True)
    return msgspec.structs.replace(last, type="DELETED", ts=ts)
