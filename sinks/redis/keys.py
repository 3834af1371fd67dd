"""Every Redis key the sink writes, in one place (docs/DESIGN.md §5 plus the sink's own helpers).

The public keys are the ones docs/DESIGN.md §5 names; the others (`:windows`, `:seen`, `:last`,
per-window leaderboards) exist so that every write is an idempotent upsert keyed by a
record's identity. SINKS-redis.md documents the layout and why each helper key exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from schemas.fields import LifecycleState
from schemas.ids import GpuUuid, PodUid

__all__ = ["DEFAULT_PREFIX", "STATES", "RedisKeys"]

DEFAULT_PREFIX: Final = "gpuwatch:"

STATES: Final[tuple[LifecycleState, ...]] = ("queued", "running", "stalled", "finished")
"""Lifecycle states in rank order: at equal event time the later one wins (finished last)."""

_PREFIX = re.compile(r"^[A-Za-z0-9._{}:-]*$")  # `{...}` allowed: a cluster hash tag
_UID_ESCAPES = str.maketrans({"%": "%25", ":": "%3A"})


def _uid(uid: str) -> str:
    """A pod uid as a key part: `%` and `:` percent-encoded, everything else as it is.

    A pod's keys are its uid plus suffixes (`pod:{uid}`, `pod:{uid}:windows`); a uid with a
    colon could name another pod's key (`X:windows`). Kubernetes uids have neither
    character, so their keys are exactly `pod:{uid}`.
    """
    return uid.translate(_UID_ESCAPES)


@dataclass(frozen=True, slots=True)
class RedisKeys:
    """Key names under one prefix (`gpuwatch:` in production, a unique one per test)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"key prefix must match {_PREFIX.pattern}, got {self.prefix!r}")

    # -- pods -----------------------------------------------------------------------------
    def pod(self, uid: PodUid | str) -> str:
        """Hash: a pod's live state, names, cost and waste totals (public)."""
        return f"{self.prefix}pod:{_uid(uid)}"

    def pod_windows(self, uid: PodUid | str) -> str:
        """Hash: `cost:{window_start}` / `waste:{window_start}` in nano-USD, and the totals."""
        return f"{self.prefix}pod:{_uid(uid)}:windows"

    def timeline(self, uid: PodUid | str) -> str:
        """Stream: a pod's transitions and alerts, capped (public)."""
        return f"{self.prefix}timeline:{_uid(uid)}"

    def timeline_seen(self, uid: PodUid | str) -> str:
        """Sorted set: identities of the timeline's entries by event time (deduplication)."""
        return f"{self.prefix}timeline:{_uid(uid)}:seen"

    def pod_keys(self, uid: PodUid | str) -> tuple[str, str, str, str]:
        """The keys of one pod that expire `finished_ttl_s` after it finishes."""
        return (self.pod(uid), self.pod_windows(uid), self.timeline(uid), self.timeline_seen(uid))

    def state(self, state: LifecycleState) -> str:
        """Sorted set: uids of the pods in `state`, scored by state_since (public)."""
        return f"{self.prefix}state:{state}"

    def states(self) -> tuple[str, ...]:
        """The four state sets, in the rank order of `STATES`."""
        return tuple(self.state(state) for state in STATES)

    # -- the writer's own ------------------------------------------------------------------
    def positions(self, group: str) -> str:
        """Hash: `{topic}:{partition}` -> next offset written, of one consumer group.

        Written in the same transaction as the records, so it says exactly what this Redis
        holds: after Redis lost writes (a restart from an older snapshot) it is behind the
        group's committed offsets, and the writer reads the difference again.
        """
        return f"{self.prefix}sink:positions:{group}"

    def rebuild(self, group: str) -> str:
        """Hash: `generation` (how many times the keys were deleted to be written anew from
        the topics), `evicted` and `run_id` (Redis's eviction count and run the last time),
        of one group; the one key of the prefix a rebuild keeps.

        The writers of the group read the generation every few seconds: a new one tells
        each to read its partitions again from the start (`RedisWriter`).
        """
        return f"{self.prefix}sink:rebuild:{group}"

    # -- GPUs -----------------------------------------------------------------------------
    def gpu(self, uuid: GpuUuid | str) -> str:
        """Hash: a GPU's live state from the latest node sample and its latest window (public)."""
        return f"{self.prefix}gpu:{uuid}"

    def gpus(self) -> str:
        """Sorted set: every GPU uuid scored by its latest sample's event time."""
        return f"{self.prefix}gpus"

    # -- waste leaderboards -----------------------------------------------------------------
    def waste_pods(self) -> str:
        """Sorted set: pod uid by waste_usd over the last hour of windows (public)."""
        return f"{self.prefix}waste:pods"

    def waste_namespaces(self) -> str:
        """Sorted set: namespace by waste_usd over the last hour of windows (public)."""
        return f"{self.prefix}waste:namespaces"

    def waste_pods_window_prefix(self) -> str:
        """Prefix of the per-window pod leaderboards (`...:{window_start}`)."""
        return f"{self.prefix}waste:pods:"

    def waste_namespaces_window_prefix(self) -> str:
        """Prefix of the per-window namespace leaderboards (`...:{window_start}`)."""
        return f"{self.prefix}waste:namespaces:"

    def waste_pods_window(self, window_start: int) -> str:
        """Sorted set: pod uid by the waste_usd of its record for one window."""
        return f"{self.waste_pods_window_prefix()}{window_start}"

    def waste_namespaces_window(self, window_start: int) -> str:
        """Sorted set: namespace by the sum of its pods' waste_usd for one window."""
        return f"{self.waste_namespaces_window_prefix()}{window_start}"

    def waste_windows(self) -> str:
        """Sorted set: the window starts inside the last hour, scored by window end."""
        return f"{self.prefix}waste:windows"

    # -- alerts ---------------------------------------------------------------------------
    def alerts(self) -> str:
        """Stream: every alert message, capped (public)."""
        return f"{self.prefix}alerts"

    def alerts_seen(self) -> str:
        """Sorted set: identities of the alert stream's entries by event time (deduplication)."""
        return f"{self.prefix}alerts:seen"

    def alerts_firing(self) -> str:
        """Hash: fingerprint -> JSON of the latest message of each firing alert (public)."""
        return f"{self.prefix}alerts:firing"

    def alerts_last(self) -> str:
        """Sorted set: fingerprint by the event time of its latest applied status."""
        return f"{self.prefix}alerts:last"

    # -- capacity -------------------------------------------------------------------------
    def capacity(self) -> str:
        """Hash: a capacity record's key (`Capacity.key`: `[cluster/]product/resource`) ->
        JSON of its latest record, the picture now (public)."""
        return f"{self.prefix}capacity"

    # -- Kueue workloads ---------------------------------------------------------------
    def workloads(self) -> str:
        """Hash: a Kueue workload's uid -> JSON of its latest `k8s.workloads` record, while
        the workload exists (public)."""
        return f"{self.prefix}workloads"

    def workloads_deleted(self) -> str:
        """Sorted set: uids of workloads deleted in the last day, by the deletion's time (a
        late record of before it is kept out)."""
        return f"{self.prefix}workloads:deleted"

    def pattern(self) -> str:
        """A SCAN pattern matching every key under this prefix."""
        escaped = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix)
        return f"{escaped}*"
