"""The `work.units` topic: units of work pods report done, keyed by pod uid.

A pod opts in with the annotation `gpuwatch.io/work` (`name=metric,...`); the node agent of
its node scrapes the pod's Prometheus endpoint (`gpuwatch.io/work-port`, `-path`) every
`work_interval_s` and publishes, per scrape, how much each named counter rose since the
previous one: a counter below its previous value, or one whose process restarted (a new
`process_start_time_seconds`), was reset and counts from zero, as Prometheus' `increase()`
takes it. The worker counts the same increases into the
pod's attribution windows (`work_units`, `cost_per_unit`).
"""

from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import (
    DEFAULT_CLUSTER,
    Cluster,
    EpochMs,
    UnitName,
    Value,
    WorkUnitCounts,
    keep_default_cluster,
)
from .ids import NodeName, PodUid

__all__ = ["TOPIC", "WorkUnits"]


class WorkUnits(Value, frozen=True, kw_only=True, omit_defaults=True):
    """The units of work one pod did over `[start, ts)`, as two scrapes of its counters
    tell. `ts` is the later scrape's time; `start` the earlier one's."""

    schema: Literal["gpuwatch.work.units/v1"]
    uid: PodUid
    namespace: str
    pod: str
    node: NodeName
    ts: Annotated[EpochMs, msgspec.Meta(description="time of the scrape, epoch ms")]
    start: Annotated[EpochMs, msgspec.Meta(description="time of the previous scrape")]
    units: Annotated[
        WorkUnitCounts,
        msgspec.Meta(description="increase of each named counter over [start, ts)"),
    ]
    resets: Annotated[
        tuple[UnitName, ...],
        msgspec.Meta(
            description="units whose counter was reset (below its previous value, or its "
            "process restarted) in the interval: counted from zero"
        ),
    ]
    missing: Annotated[
        tuple[UnitName, ...],
        msgspec.Meta(description="units whose metric the scrape did not find"),
    ]
    cluster: Cluster = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        keep_default_cluster(self)


TOPIC: Final = TopicSpec(
    name="work.units",
    key="pod_uid",
    value_type=WorkUnits,
    key_of=lambda value: value.uid,
    # As attribution, whose cost per unit it explains: 35 days cover a month's chargeback.
    compacted=False,
    retention_ms=35 * DAY_MS,
    internal=False,
)
