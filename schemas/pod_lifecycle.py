"""The `pod.lifecycle` topic: state transitions of pods that request a GPU, keyed by pod uid."""

from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import (
    DEFAULT_CLUSTER,
    Cluster,
    Count,
    EpochMs,
    Labels,
    LifecycleState,
    Value,
    keep_default_cluster,
)
from .ids import NodeName, PodUid

__all__ = ["TOPIC", "PodLifecycle"]

_STATE_MS = "milliseconds spent in this state so far, including the state being left"


class PodLifecycle(Value, frozen=True, kw_only=True, omit_defaults=True):
    """One transition of a pod between queued, running, stalled and finished.

    `ts` is the event time the new state's condition was met (for stalled: idle since +
    stall_after_s), not when it was noticed. The first transition of a pod has a null
    `from_state`. The `*_ms` totals are cumulative over the pod's life up to `ts`.
    """

    schema: Literal["gpuwatch.pod.lifecycle/v1"]
    uid: PodUid
    namespace: str
    pod: str
    node: Annotated[NodeName | None, msgspec.Meta(description="null while not bound to a node")]
    labels: Labels
    ts: EpochMs
    from_state: Annotated[
        LifecycleState | None, msgspec.Meta(description="null on the pod's first transition")
    ]
    to_state: LifecycleState
    reason: Annotated[
        str | None,
        msgspec.Meta(
            description="why: Unschedulable, ImagePull, Idle, CrashLoopBackOff, "
            "Completed, OOMKilled, Error, Evicted, Deleted...; null when none applies"
        ),
    ]
    queued_ms: Annotated[Count, msgspec.Meta(description=_STATE_MS)]
    running_ms: Annotated[Count, msgspec.Meta(description=_STATE_MS)]
    stalled_ms: Annotated[Count, msgspec.Meta(description=_STATE_MS)]
    cluster: Cluster = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="pod.lifecycle",
    key="pod_uid",
    value_type=PodLifecycle,
    key_of=lambda value: value.uid,
    # Delete after 30 days: low volume, and a month of transitions answers "how long did
    # this team's jobs queue" and rebuilds incident timelines.
    compacted=False,
    retention_ms=30 * DAY_MS,
    internal=False,
)
