"""Kubernetes objects as the API serialises them: typed dicts, their decoders, times, quantities.

The watcher works on the JSON the API sends, decoded straight into `TypedDict`s by
msgspec: no model classes, only the fields it reads, unknown fields ignored. Every field
is optional and nullable, because the API omits empty fields and writes `null` for zero
times (`startedAt: null` in a terminated state, `lastProbeTime: null`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Generic, Literal, TypedDict, TypeVar

import msgspec

__all__ = [
    "NODE_DECODER",
    "POD_DECODER",
    "Bookmark",
    "Change",
    "Container",
    "ContainerState",
    "ContainerStatusObject",
    "MalformedObject",
    "Node",
    "ObjectMeta",
    "OwnedObject",
    "OwnerReference",
    "Page",
    "Pod",
    "Quantity",
    "StatusError",
    "WatchEvent",
    "decode_event",
    "decode_list",
    "decode_node_list",
    "decode_owner",
    "decode_pod_list",
    "parse_quantity",
    "parse_time",
]

Quantity = str | int | float
T = TypeVar("T")


class OwnerReference(TypedDict, total=False):
    apiVersion: str | None
    kind: str | None
    name: str | None
    uid: str | None
    controller: bool | None


class ObjectMeta(TypedDict, total=False):
    name: str | None
    namespace: str | None
    uid: str | None
    resourceVersion: str | None
    creationTimestamp: str | None
    deletionTimestamp: str | None
    labels: dict[str, str] | None
    annotations: dict[str, str] | None
    ownerReferences: list[OwnerReference] | None


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, Quantity] | None
    limits: dict[str, Quantity] | None


class Container(TypedDict, total=False):
    name: str | None
    resources: ResourceRequirements | None
    restartPolicy: str | None
    """`Always` on an init container makes it a sidecar (runs beside the app containers)."""


class NodeSelectorRequirement(TypedDict, total=False):
    key: str | None
    operator: str | None
    values: list[str] | None


class NodeSelectorTerm(TypedDict, total=False):
    matchExpressions: list[NodeSelectorRequirement] | None


class NodeSelector(TypedDict, total=False):
    nodeSelectorTerms: list[NodeSelectorTerm] | None


class NodeAffinity(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None


class Affinity(TypedDict, total=False):
    nodeAffinity: NodeAffinity | None


class SchedulingGate(TypedDict, total=False):
    name: str | None


class PodResourceClaim(TypedDict, total=False):
    """One entry of `spec.resourceClaims`: a claim by name, or made from a template."""

    name: str | None
    resourceClaimName: str | None
    resourceClaimTemplateName: str | None


class PodSpec(TypedDict, total=False):
    nodeName: str | None
    containers: list[Container] | None
    initContainers: list[Container] | None
    priorityClassName: str | None
    nodeSelector: dict[str, str] | None
    affinity: Affinity | None
    resourceClaims: list[PodResourceClaim] | None
    schedulingGates: list[SchedulingGate] | None


class Condition(TypedDict, total=False):
    type: str | None
    status: str | None
    reason: str | None
    message: str | None
    lastTransitionTime: str | None


class StateWaiting(TypedDict, total=False):
    reason: str | None
    message: str | None


class StateRunning(TypedDict, total=False):
    startedAt: str | None


class StateTerminated(TypedDict, total=False):
    exitCode: int | None
    reason: str | None
    message: str | None
    startedAt: str | None
    finishedAt: str | None


class ContainerState(TypedDict, total=False):
    waiting: StateWaiting | None
    running: StateRunning | None
    terminated: StateTerminated | None


class ContainerStatusObject(TypedDict, total=False):
    name: str | None
    state: ContainerState | None
    lastState: ContainerState | None
    restartCount: int | None


class PodStatus(TypedDict, total=False):
    phase: str | None
    reason: str | None
    message: str | None
    conditions: list[Condition] | None
    containerStatuses: list[ContainerStatusObject] | None
    initContainerStatuses: list[ContainerStatusObject] | None
    startTime: str | None


class Pod(TypedDict, total=False):
    metadata: ObjectMeta | None
    spec: PodSpec | None
    status: PodStatus | None


class Taint(TypedDict, total=False):
    key: str | None
    effect: str | None
    timeAdded: str | None


class NodeSpec(TypedDict, total=False):
    unschedulable: bool | None
    taints: list[Taint] | None


class NodeStatus(TypedDict, total=False):
    capacity: dict[str, Quantity] | None
    allocatable: dict[str, Quantity] | None
    conditions: list[Condition] | None


class Node(TypedDict, total=False):
    metadata: ObjectMeta | None
    spec: NodeSpec | None
    status: NodeStatus | None


class OwnedObject(TypedDict, total=False):
    """A ReplicaSet or Job, read only for its own controlling owner."""

    metadata: ObjectMeta | None


class MalformedObject(ValueError):  # noqa: N818 - a kind of bad input, like msgspec's
    """An object or watch line the watcher cannot use (not JSON, or fields of the wrong type)."""


# ---- lists -------------------------------------------------------------------------


class _ListMeta(msgspec.Struct):
    resourceVersion: str | None = None  # noqa: N815 - the API's field names
    continue_: str | None = msgspec.field(default=None, name="continue")


class _List(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] | None = None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list: its items, the list's resourceVersion and the continue token.

    Items are decoded one by one: one unusable object is `skipped`, not the whole list.
    """

    items: list[T]
    resource_version: str
    continue_token: str | None
    skipped: list[MalformedObject] = field(default_factory=list)


_LIST = msgspec.json.Decoder(_List)


def decode_list(raw: bytes, decoder: msgspec.json.Decoder[T], kind: str) -> Page[T]:
    """A list body of `kind` (PodList...), each item through `decoder`; MalformedObject
    when it does not have the shape of a list, an unusable item skipped and counted."""
    try:
        decoded = _LIST.decode(raw)
    except msgspec.DecodeError as exc:
        raise MalformedObject(f"not a {kind}: {exc}") from exc
    meta = decoded.metadata
    if not meta.resourceVersion:
        raise MalformedObject(f"{kind} without metadata.resourceVersion")
    page: Page[T] = Page([], meta.resourceVersion, meta.continue_ or None)
    for item in decoded.items or ():
        try:
            page.items.append(decoder.decode(item))
        except msgspec.DecodeError as exc:
            page.skipped.append(MalformedObject(f"unusable item of a {kind}: {exc}"))
    return page


def decode_pod_list(raw: bytes) -> Page[Pod]:
    """A PodList body; MalformedObject when it does not have the shape of one."""
    return decode_list(raw, POD_DECODER, "PodList")


def decode_node_list(raw: bytes) -> Page[Node]:
    """A NodeList body; MalformedObject when it does not have the shape of one."""
    return decode_list(raw, NODE_DECODER, "NodeList")


_OWNED = msgspec.json.Decoder(OwnedObject)


def decode_owner(raw: bytes) -> OwnedObject:
    """A ReplicaSet or Job body (only its metadata)."""
    try:
        return _OWNED.decode(raw)
    except msgspec.DecodeError as exc:
        raise MalformedObject(f"not an object: {exc}") from exc


# ---- watch events ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """ADDED, MODIFIED or DELETED with the object's state after the change."""

    type: Literal["ADDED", "MODIFIED", "DELETED"]
    object: T


@dataclass(frozen=True, slots=True)
class Bookmark:
    """The collection is at `resource_version`; nothing changed that this watch selects."""

    resource_version: str


@dataclass(frozen=True, slots=True)
class StatusError:
    """An ERROR event: a Status with `code` (410 Expired: the resourceVersion is compacted)."""

    code: int
    reason: str
    message: str


WatchEvent = Change[T] | Bookmark | StatusError


class _Envelope(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _BookmarkMeta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815


class _BookmarkObject(msgspec.Struct):
    metadata: _BookmarkMeta = msgspec.field(default_factory=_BookmarkMeta)


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


_ENVELOPE = msgspec.json.Decoder(_Envelope)
_BOOKMARK = msgspec.json.Decoder(_BookmarkObject)
_STATUS = msgspec.json.Decoder(_Status)
_CHANGES = ("ADDED", "MODIFIED", "DELETED")


def decode_event(line: bytes, decoder: msgspec.json.Decoder[T]) -> WatchEvent[T]:
    """One line of a watch stream. A bookmark's object is never decoded as a full object
    (the API sends a skeleton: `"spec": {"containers": null}`)."""
    try:
        envelope = _ENVELOPE.decode(line)
        if envelope.type == "BOOKMARK":
            version = _BOOKMARK.decode(envelope.object).metadata.resourceVersion
            if not version:
                raise MalformedObject("bookmark without a resourceVersion")
            return Bookmark(version)
        if envelope.type == "ERROR":
            status = _STATUS.decode(envelope.object)
            return StatusError(status.code, status.reason, status.message)
        if envelope.type not in _CHANGES:
            raise MalformedObject(f"unknown watch event type {envelope.type!r}")
        return Change(envelope.type, decoder.decode(envelope.object))  # type: ignore[arg-type]
    except msgspec.DecodeError as exc:
        raise MalformedObject(f"bad watch event: {exc}") from exc


POD_DECODER = msgspec.json.Decoder(Pod)
NODE_DECODER = msgspec.json.Decoder(Node)


# ---- values ------------------------------------------------------------------------


def parse_time(value: str | None) -> int | None:
    """An RFC 3339 time (`2024-05-01T10:00:00Z`, fractions allowed) as epoch milliseconds.

    None for null, empty, unparseable or pre-epoch values (the API's zero time
    `0001-01-01T00:00:00Z` means unknown, and `EpochMs` cannot be negative).
    """
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    ms = math.floor(parsed.timestamp() * 1000)
    return ms if ms >= 0 else None


_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?"
)
_SCALE = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(value: Quantity) -> int:
    """A resource quantity as a whole count, rounded up (GPUs are always whole numbers;
    `1k` or `500m` are legal quantities all the same). Raises ValueError when not one."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a quantity: {value!r}")
        return math.ceil(value)
    found = _QUANTITY.fullmatch(value.strip())
    if found is None:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        amount = Decimal(found["number"]) * _SCALE[found["suffix"]]
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"not a quantity: {value!r}") from exc
    return math.ceil(amount)
