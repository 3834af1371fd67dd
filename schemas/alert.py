"""The `alerts` topic: firing and resolved in-stream alerts, keyed by alert fingerprint."""

from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import DEFAULT_CLUSTER, Cluster, EpochMs, Labels, Value, keep_default_cluster
from .ids import AlertFingerprint, GpuUuid, NodeName, PodUid

__all__ = ["TOPIC", "Alert", "AlertName", "AlertStatus", "AlertSubject", "Severity"]

AlertName = Literal[
    "GpuIdleAllocated",
    "PodStalled",
    "PodQueuedTooLong",
    "GpuUnallocatedAccess",
    "NodeTelemetryMissing",
    "GpuXidError",
    "GpuEccUncorrectable",
    "GpuRowRemapFailure",
    "GpuThrottled",
    "PodBlockedByFragmentation",
    "WorkloadQueuedTooLong",
]
AlertStatus = Literal["firing", "resolved"]
Severity = Literal["info", "warning", "critical"]


class AlertSubject(Value, frozen=True, kw_only=True):
    """What the alert is about: a pod, a GPU, a node or a Kueue workload; the ids that
    apply are set.

    A pod subject has `uid` (and `node` once bound), a GPU subject `uuid` and `node`, a
    node subject `node`, a workload subject `uid` (the workload's); the others are null.
    """

    kind: Literal["pod", "gpu", "node", "workload"]
    uid: PodUid | None
    uuid: GpuUuid | None
    node: NodeName | None


class Alert(Value, frozen=True, kw_only=True, omit_defaults=True):
    """A change of an alert's status (or a refresh while it keeps firing).

    `fingerprint` is derived from the name and the subject only, so the firing and the
    resolved message of one alert share it. `since` is when the condition began (event
    time); `ts` is the event time of this message.
    """

    schema: Literal["gpuwatch.alert/v1"]
    fingerprint: AlertFingerprint
    name: AlertName
    status: AlertStatus
    severity: Severity
    ts: EpochMs
    since: Annotated[EpochMs, msgspec.Meta(description="when the condition began, epoch ms")]
    subject: AlertSubject
    labels: Annotated[
        Labels, msgspec.Meta(description="namespace, pod, team, node, gpu... for routing")
    ]
    summary: Annotated[str, msgspec.Meta(description="one line for a human")]
    value: Annotated[
        float | None,
        msgspec.Meta(description="the measured value the rule tested (seconds idle, ...)"),
    ]
    cluster: Cluster = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="alerts",
    key="alert_fingerprint",
    value_type=Alert,
    key_of=lambda value: value.fingerprint,
    # Delete after 30 days: alert history for incident reviews; not compacted, since the
    # firing -> resolved history per fingerprint is the point.
    compacted=False,
    retention_ms=30 * DAY_MS,
    internal=False,
)
