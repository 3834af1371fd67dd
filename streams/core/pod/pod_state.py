"""The per-pod state the stream processors keep: lifecycle inputs, open windows, alert flags.

One `PodState` per pod uid lives in a Faust Table; every function of `lifecycle`,
`pod_attribution` and `pod_alerts` takes one and returns the next (states are frozen,
never mutated). It is a msgspec Struct, so it round-trips through JSON (`to_dict` /
`from_dict`, `encode` / `decode`) exactly; every field has a default, so a state
written by an older worker still decodes after a field is added.

Pod uids are unique across clusters, so states stay keyed by uid; a state of a named
cluster keeps it in `cluster`, one of the default cluster leaves the field unset (so it
is stored exactly as before clusters existed).
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec

from schemas.fields import DEFAULT_CLUSTER, AttributionMethod, LifecycleState, Sharing
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.k8s_pod import K8sPod, Owner
from schemas.pod_usage import PodUsage
from streams.core.integrals import PodGpuIntegrals

__all__ = [
    "ClosedWindow",
    "Forgotten",
    "GpuTotals",
    "Held",
    "OpenWindow",
    "PodNames",
    "PodState",
    "decode",
    "decode_forgotten",
    "encode",
    "encode_forgotten",
    "forgotten",
    "new_state",
    "stored_cluster",
]


class PodNames(TypedDict):
    """How each record about a pod names it (`pod.lifecycle`, `attribution`)."""

    uid: PodUid
    namespace: str
    pod: str
    node: NodeName | None
    labels: dict[str, str]
    cluster: str


class _State(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Base of the stored structs: frozen, keyword-only, lenient about unknown fields."""


# msgspec lets a frozen Struct extend a mutable one; mypy applies the dataclass rule.
class GpuTotals(_State, PodGpuIntegrals, frozen=True, kw_only=True):  # type: ignore[misc]
    """One GPU's integrals for the pod within one open window."""

    uuid: GpuUuid
    model: str
    sharing: Sharing
    method: AttributionMethod


class OpenWindow(_State, frozen=True, kw_only=True, omit_defaults=True):
    """A window `[start, start + window_s)` that has usage and has not been emitted yet."""

    start: int
    gpus: tuple[GpuTotals, ...] = ()
    units: tuple[tuple[str, float], ...] = ()
    """Units of work done in the window (`pod.usage` units), by name, in name order."""


class ClosedWindow(_State, frozen=True, kw_only=True, omit_defaults=True):
    """A closed window that usage coming late may still revise (`pod_attribution`)."""

    window: OpenWindow
    end: int
    """The end its record carries (a finished pod's last window ends at the finish)."""
    copies: int = 0
    """Copies of its record emitted so far: the next one's `revision`."""


class Held(_State, frozen=True, kw_only=True):
    """An input of the pod that waits for the watermark to reach its event time.

    `key` is a pod event's `ts`, or a usage's `ts + 1`: once the watermark reaches it, no
    pod event before it and no usage starting before it can still come (SEMANTICS.md,
    Time). Held
    inputs live in memory only: the partition's stored positions stay at the oldest one
    held, so after a crash they are read again.
    """

    key: int
    event: K8sPod | None = None
    usage: PodUsage | None = None

    def order(self) -> tuple[int, int]:
        """Release order: by event time; at one time a pod event before usage ending there."""
        return self.key, 0 if self.event is not None else 1


class PodState(_State, frozen=True, kw_only=True):
    """Everything the processors remember about one pod, keyed by its uid.

    Four groups of fields, each owned by one module: what the pod is (from its latest pod
    event; `node` from usage until one arrives), the state machine's inputs and outputs
    (`lifecycle`), the open windows (`pod_attribution`) and the alert flags (`pod_alerts`).
    """

    uid: PodUid
    # What the pod is.
    cluster: str | msgspec.UnsetType = msgspec.UNSET
    """A named cluster the pod is of (`stored_cluster`); unset: the default cluster."""
    namespace: str = ""
    name: str = ""
    node: NodeName | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    owner: Owner | None = None
    created_at: int | None = None
    gpu_request: dict[str, int] = msgspec.field(default_factory=dict)
    """GPU resource name -> count, from the latest pod event."""
    gpu_products: tuple[str, ...] | None = None
    """The GPU models the pod allows (`K8sPod.gpu_products`); None: any."""
    # Pod events applied: the latest one's resource version, event time and type.
    resource_version: str | None = None
    event_ts: int | None = None
    deleted: bool = False
    # What the pod events and usage say (the state machine's inputs).
    base: LifecycleState | None = None
    """queued, running or finished from the pod event; None before a usable pod event."""
    base_reason: str | None = None
    crashloop: bool = False
    """A container crash-loops after the pod started; cleared when it runs and is ready."""
    idle_since: int | None = None
    usage_until: int | None = None
    """End of the newest usage seen by the state machine (older usage is a replay)."""
    horizon: int = 0
    """The latest event time this pod has seen: pod events, usage ends, watermarks."""
    # The state machine's output.
    state: LifecycleState | None = None
    reason: str | None = None
    since: int = 0
    """When the current state began (a reason change within a state keeps it)."""
    accrued_until: int = 0
    """Time up to which `queued_ms`, `running_ms` and `stalled_ms` are counted."""
    stall_idle_since: int | None = None
    """The `idle_since` the current Idle stall was derived from."""
    queued_ms: int = 0
    running_ms: int = 0
    stalled_ms: int = 0
    history: tuple[tuple[int, LifecycleState], ...] = ()
    """(ts, state) of recent state changes, enough to tell each open window's end state."""
    # Attribution windows.
    windows: tuple[OpenWindow, ...] = ()
    """Open windows, by start."""
    attributed_until: int | None = None
    """End of the newest usage counted into windows (older usage is a replay)."""
    closed_until: int = 0
    """Every window that starts before this is closed: usage for it revises it, within the
    revision horizon, and is late after."""
    revisable: tuple[ClosedWindow, ...] = ()
    """Closed windows usage may still come for (the pod's usage had not reached their end
    when they closed), and those late usage made, within the horizon; by start."""
    # Alerts.
    queued_alert_since: int | None = None
    """Start of the current queued spell as the alert rules saw it; None when not queued."""
    queued_alert_firing: bool = False
    stalled_alert_since: int | None = None
    """`since` of the firing PodStalled alert; None when it is not firing."""

    def names(self) -> PodNames:
        """The pod's names as its records carry them (what its latest pod event said)."""
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "pod": self.name,
            "node": self.node,
            "labels": self.labels,
            "cluster": self.cluster_name(),
        }

    def cluster_name(self) -> str:
        """The pod's cluster (the default one where the state names none)."""
        cluster = self.cluster
        return DEFAULT_CLUSTER if isinstance(cluster, msgspec.UnsetType) else cluster

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON-ready builtins (a Faust Table value)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PodState:
        """The state back from `to_dict`'s output."""
        return msgspec.convert(data, cls)


class Forgotten(msgspec.Struct, frozen=True, array_like=True):
    """What is kept of a pod forgotten an hour after it finished, to tell its inputs read
    again, or sent again, from new ones: with no state, either would start it anew and
    re-emit its windows with only what came again, over the complete records.

    An input read again after a restart is at or before `read` (the newest input offsets
    by topic). Usage sent again by a restarted node side, at new offsets, ends at or
    before `attributed_until`, as it would have for the state. Stored as a JSON array; a
    JSON object is the older form, `read` alone.
    """

    read: dict[str, int]
    attributed_until: int | None = None
    since: int = 0
    """When the pod finished (an older form's 0: kept by `read` alone)."""

    def replays(self, topic: str, offset: int, usage: PodUsage | None) -> bool:
        """Whether an input of the pod was applied before it was forgotten."""
        if offset <= self.read.get(topic, -1):
            return True
        until = self.attributed_until
        return usage is not None and until is not None and usage.end_ts <= until


def forgotten(state: PodState, read: dict[str, int]) -> Forgotten:
    """What is kept of a pod forgotten with `state`, its inputs' newest offsets `read`."""
    return Forgotten(read=read, attributed_until=state.attributed_until, since=state.since)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(PodState)
_FORGOTTEN_DECODER = msgspec.json.Decoder(Forgotten | dict[str, int])


def new_state(uid: PodUid) -> PodState:
    """The state of a pod nothing is known of yet."""
    return PodState(uid=uid)


def stored_cluster(cluster: str) -> str | msgspec.UnsetType:
    """A cluster as `PodState.cluster` keeps it: unset for the default cluster."""
    return msgspec.UNSET if cluster == DEFAULT_CLUSTER else cluster


def encode(state: PodState) -> bytes:
    """The state as compact JSON."""
    return _ENCODER.encode(state)


def decode(raw: bytes | str) -> PodState:
    """The state back from `encode`'s output."""
    return _DECODER.decode(raw)


def encode_forgotten(kept: Forgotten) -> bytes:
    """A forgotten pod's record as compact JSON."""
    return _ENCODER.encode(kept)


def decode_forgotten(raw: bytes | str) -> Forgotten:
    """A forgotten pod's record back, from `encode_forgotten`'s output or the older form."""
    kept = _FORGOTTEN_DECODER.decode(raw)
    return kept if isinstance(kept, Forgotten) else Forgotten(read=kept)
