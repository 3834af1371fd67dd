"""The arguments of each Redis Lua script by name: one frozen dataclass per script.

A script takes its KEYS and ARGV by position; the header of each `lua/<name>.lua` names
them, one line each (`-- KEYS[2] last`, `-- ARGV[5..] fields` for a variable tail, a `?`
after the name for a trailing key that may be left out). Here each call is built by name
and `command` flattens it in the order of the class's fields, which is the script's order:
tests/unit/sinks/test_redis_script_args.py reads every header and fails when a name, its
place or its kind differs on one side, so neither side can add or move an argument alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, NamedTuple

__all__ = [
    "AlertState",
    "FieldIfNewer",
    "GpuLiveCall",
    "HsetIfNewer",
    "Param",
    "PodTransition",
    "PodWindow",
    "Positions",
    "Rebuild",
    "ScriptCall",
    "ScriptName",
    "TimelineAdd",
    "WorkloadCall",
    "params",
]

ScriptName = Literal[
    "pod_transition",
    "pod_window",
    "timeline_add",
    "alert_state",
    "hset_if_newer",
    "gpu_live",
    "positions",
    "field_if_newer",
    "workload",
    "rebuild",
]

_SLOT, _REST = "slot", "rest"


def _key(*, rest: bool = False) -> Any:
    """A KEYS entry; `rest`: the entries from here on (a tuple)."""
    return field(metadata={_SLOT: "KEYS", _REST: rest})


def _optional_key() -> Any:
    """A trailing KEYS entry left out when None."""
    return field(default=None, metadata={_SLOT: "KEYS", _REST: False})


def _arg(*, rest: bool = False) -> Any:
    """An ARGV entry; `rest`: the entries from here on (a tuple)."""
    return field(metadata={_SLOT: "ARGV", _REST: rest})


class Param(NamedTuple):
    """One named argument of a script: KEYS or ARGV, its name, a variable tail or one that
    may be left out (a trailing key)."""

    slot: Literal["KEYS", "ARGV"]
    name: str
    rest: bool
    optional: bool


class ScriptCall:
    """A script call by name; `command`'s keys and args are the fields in order."""

    __slots__ = ()
    SCRIPT: ClassVar[ScriptName]
    _LAYOUT: ClassVar[tuple[tuple[str, bool, bool], ...]]  # (name, is a key, rest), cached

    def flat(self) -> tuple[ScriptName, tuple[str, ...], tuple[str, ...]]:
        """The script's name, its KEYS and its ARGV, in the script's order."""
        layout = type(self).__dict__.get("_LAYOUT")
        if layout is None:
            layout = tuple(
                (f.name, f.metadata[_SLOT] == "KEYS", f.metadata[_REST])
                for f in fields(self)  # type: ignore[arg-type]
            )
            type(self)._LAYOUT = layout
        keys: list[str] = []
        args: list[str] = []
        for name, is_key, rest in layout:
            value = getattr(self, name)
            out = keys if is_key else args
            if rest:
                out += value
            elif value is not None:
                out.append(value)
        return self.SCRIPT, tuple(keys), tuple(args)


def params(call: type[ScriptCall]) -> list[Param]:
    """The named arguments of a script call class, in order."""
    return [
        Param(f.metadata[_SLOT], f.name, f.metadata[_REST], f.default is None)
        for f in fields(call)  # type: ignore[arg-type]
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodTransition(ScriptCall):
    """pod_transition.lua: a lifecycle transition of a pod."""

    SCRIPT: ClassVar[ScriptName] = "pod_transition"
    pod: str = _key()
    windows: str = _key()
    timeline: str = _key()
    seen: str = _key()
    states: tuple[str, ...] = _key(rest=True)
    uid: str = _arg()
    ts: str = _arg()
    to_state: str = _arg()
    reason: str = _arg()
    namespace: str = _arg()
    pod_name: str = _arg()
    node: str = _arg()
    labels: str = _arg()
    ttl_s: str = _arg()
    cluster: str = _arg()


@dataclass(frozen=True, slots=True, kw_only=True)
class PodWindow(ScriptCall):
    """pod_window.lua: one attribution window of a pod."""

    SCRIPT: ClassVar[ScriptName] = "pod_window"
    pod: str = _key()
    windows: str = _key()
    timeline: str = _key()
    seen: str = _key()
    waste_pods_window: str = _key()
    waste_namespaces_window: str = _key()
    waste_pods: str = _key()
    waste_namespaces: str = _key()
    waste_windows: str = _key()
    uid: str = _arg()
    namespace: str = _arg()
    pod_name: str = _arg()
    node: str = _arg()
    labels: str = _arg()
    window_start: str = _arg()
    window_end: str = _arg()
    cost_nusd: str = _arg()
    waste_nusd: str = _arg()
    vram_bytes: str = _arg()
    share: str = _arg()
    gpus: str = _arg()
    state: str = _arg()
    ttl_s: str = _arg()
    hour_ms: str = _arg()
    pods_window_prefix: str = _arg()
    namespaces_window_prefix: str = _arg()
    cluster: str = _arg()
    work_units: str = _arg()
    revision: str = _arg()


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineAdd(ScriptCall):
    """timeline_add.lua: one entry of a capped stream, once per identity."""

    SCRIPT: ClassVar[ScriptName] = "timeline_add"
    stream: str = _key()
    seen: str = _key()
    pod: str | None = _optional_key()
    identity: str = _arg()
    ts: str = _arg()
    maxlen: str = _arg()
    ttl_s: str = _arg()
    fields: tuple[str, ...] = _arg(rest=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertState(ScriptCall):
    """alert_state.lua: the latest status of an alert."""

    SCRIPT: ClassVar[ScriptName] = "alert_state"
    firing: str = _key()
    last: str = _key()
    fingerprint: str = _arg()
    status: str = _arg()
    ts: str = _arg()
    json: str = _arg()
    ttl_ms: str = _arg()


@dataclass(frozen=True, slots=True, kw_only=True)
class HsetIfNewer(ScriptCall):
    """hset_if_newer.lua: hash fields unless a later (order, tie) wrote them."""

    SCRIPT: ClassVar[ScriptName] = "hset_if_newer"
    hash: str = _key()
    index: str | None = _optional_key()
    order_field: str = _arg()
    order_value: str = _arg()
    tie_field: str = _arg()
    tie_value: str = _arg()
    index_member: str = _arg()
    fields: tuple[str, ...] = _arg(rest=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuLiveCall(ScriptCall):
    """gpu_live.lua: the live fields of many GPU hashes."""

    SCRIPT: ClassVar[ScriptName] = "gpu_live"
    index: str = _key()
    gpus: tuple[str, ...] = _key(rest=True)
    rows: str = _arg()


@dataclass(frozen=True, slots=True, kw_only=True)
class Positions(ScriptCall):
    """positions.lua: offsets that only move forward."""

    SCRIPT: ClassVar[ScriptName] = "positions"
    positions: str = _key()
    offsets: tuple[str, ...] = _arg(rest=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldIfNewer(ScriptCall):
    """field_if_newer.lua: a record's JSON in a hash field unless a later one is there."""

    SCRIPT: ClassVar[ScriptName] = "field_if_newer"
    hash: str = _key()
    field: str = _arg()
    ts: str = _arg()
    json: str = _arg()


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadCall(ScriptCall):
    """workload.lua: a Kueue workload's latest record, or its deletion."""

    SCRIPT: ClassVar[ScriptName] = "workload"
    workloads: str = _key()
    deleted: str = _key()
    uid: str = _arg()
    ts: str = _arg()
    json: str = _arg()
    deletes: str = _arg()
    keep_ms: str = _arg()
    resource_version: str = _arg()


@dataclass(frozen=True, slots=True, kw_only=True)
class Rebuild(ScriptCall):
    """rebuild.lua: every key of the prefix deleted once per eviction count of a run."""

    SCRIPT: ClassVar[ScriptName] = "rebuild"
    rebuild: str = _key()
    pattern: str = _arg()
    keep_prefix: str = _arg()
    evicted: str = _arg()
    run_id: str = _arg()
