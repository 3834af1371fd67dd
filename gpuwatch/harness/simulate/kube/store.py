"""The fake API server's objects: the resources it serves, every object at one
resourceVersion counter with the history of its changes, and what a list or watch with
selectors sees of them.

- one resourceVersion counter for every object (etcd's revision); lists return it and
  watches resume from it, replaying every change after it;
- `labelSelector` and `fieldSelector` (such as `spec.nodeName=gpu-1`) applied with the
  real transitions (an object leaving the selection is DELETED, one entering it ADDED);
- the history kept is bounded (`history_limit`): a watch from a resourceVersion older than
  its floor is answered 410 Gone.

How it is served over HTTP is `gpuwatch.harness.simulate.kube.apiserver`'s.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from gpuwatch.harness.simulate.kube.httpwire import event_line
from gpuwatch.harness.simulate.kube.labelselector import Matcher

__all__ = [
    "RESOURCES",
    "Event",
    "FieldMatcher",
    "Obj",
    "ObjectStore",
    "Query",
    "ResourceType",
    "Snapshot",
    "Watch",
    "parse_field_selector",
    "rfc3339",
]

Obj = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class ResourceType:
    """How one resource is served: its kinds, API group path and scope."""

    kind: str
    api_version: str
    prefix: str
    namespaced: bool

    @property
    def list_kind(self) -> str:
        """The kind of its lists (`PodList`)."""
        return f"{self.kind}List"


RESOURCES: Mapping[str, ResourceType] = {
    "pods": ResourceType("Pod", "v1", "/api/v1", namespaced=True),
    "nodes": ResourceType("Node", "v1", "/api/v1", namespaced=False),
    "replicasets": ResourceType("ReplicaSet", "apps/v1", "/apis/apps/v1", namespaced=True),
    "jobs": ResourceType("Job", "batch/v1", "/apis/batch/v1", namespaced=True),
    "workloads": ResourceType(
        "Workload", "kueue.x-k8s.io/v1beta2", "/apis/kueue.x-k8s.io/v1beta2", namespaced=True
    ),
    "resourceclaimtemplates": ResourceType(
        "ResourceClaimTemplate", "resource.k8s.io/v1", "/apis/resource.k8s.io/v1", namespaced=True
    ),
    "resourceclaims": ResourceType(
        "ResourceClaim", "resource.k8s.io/v1", "/apis/resource.k8s.io/v1", namespaced=True
    ),
    "resourceslices": ResourceType(
        "ResourceSlice", "resource.k8s.io/v1", "/apis/resource.k8s.io/v1", namespaced=False
    ),
}


def rfc3339(epoch_s: float) -> str:
    """A time as the API writes it: `2024-05-01T10:00:00Z` (whole seconds)."""
    return datetime.fromtimestamp(int(epoch_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    """One change of an object, at the resourceVersion it made."""

    rv: int
    resource: str
    type: EventType
    old: Obj | None
    new: Obj


FieldMatcher = Callable[[Obj], bool]


def _every_object(_obj: Obj) -> bool:
    return True


def parse_field_selector(selector: str | None) -> FieldMatcher:
    """A `fieldSelector` (`spec.nodeName=gpu-1,status.phase!=Failed`) as a predicate of an
    object: terms of a dotted field path, `=`, `==` or `!=`, and a value, all to hold; a
    field the object lacks is "" (an unscheduled pod's `spec.nodeName`), as the real
    server has it. ValueError for a term that is none of these."""
    terms: list[tuple[list[str], bool, str]] = []
    for term in (selector or "").split(","):
        if not term.strip():
            continue
        found = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(\S*)\s*$", term)
        if found is None:
            raise ValueError(f"invalid field selector term {term!r}")
        terms.append((found[1].split("."), found[2] != "!=", found[3]))

    def matches(obj: Obj) -> bool:
        for path, equal, value in terms:
            here: Any = obj
            for part in path:
                here = here.get(part) if isinstance(here, dict) else None
            actual = "" if here is None else str(here)
            actual = actual.lower() if isinstance(here, bool) else actual
            if (actual == value) != equal:
                return False
        return True

    return matches if terms else _every_object


@dataclass(eq=False)
class Query:
    """What a list or watch selects: a resource, in one namespace or all, by labels and
    fields."""

    resource: str
    namespace: str | None
    matches: Matcher
    fields: FieldMatcher = field(default=_every_object, kw_only=True)


@dataclass(eq=False)
class Watch(Query):
    """An open watch: where it has got to, and the flags set on it while it waits."""

    bookmarks: bool
    position: int
    drop: bool = False
    expire: bool = False
    bookmark_now: bool = False


@dataclass
class Snapshot:
    """What is left of a paginated list, at the resourceVersion it was taken."""

    rv: int
    items: list[Obj]


class ObjectStore:
    """The objects of the API server and their history, under one lock (`_cond`, notified
    on every change and every flag set on an open watch)."""

    def __init__(
        self, *, history_limit: int = 10_000, clock: Callable[[], float] = time.time
    ) -> None:
        self.history_limit = history_limit
        self._clock = clock
        self._cond = threading.Condition()
        self._store: dict[tuple[str, str, str], Obj] = {}
        self._rv = 1
        self._history: list[Event] = []
        self._history_rvs: list[int] = []
        self._floor = 1  # a watch may resume from this resourceVersion or later
        self._watches: set[Watch] = set()
        self._snapshots: dict[str, Snapshot] = {}

    # ---- objects -------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion (of any object)."""
        with self._cond:
            return str(self._rv)

    def create(self, resource: str, obj: Obj) -> Obj:
        """Add an object; uid, creationTimestamp and namespace ("default") filled in when
        missing. Returns the stored copy (with its resourceVersion)."""
        kind = RESOURCES[resource]
        stored = self._prepared(resource, obj)
        meta = stored["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", rfc3339(self._clock()))
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        with self._cond:
            key = self._key(resource, meta)
            if key in self._store:
                raise KeyError(f"{resource} {key[1]}/{key[2]} exists")
            self._record(resource, "ADDED", None, stored)
            self._store[key] = stored
            return copy.deepcopy(stored)

    def update(self, resource: str, obj: Obj) -> Obj:
        """Replace an object (found by namespace and name); its uid and creation time stay."""
        stored = self._prepared(resource, obj)
        with self._cond:
            key = self._key(resource, stored["metadata"])
            old = self._store[key]
            for kept in ("uid", "creationTimestamp"):
                stored["metadata"][kept] = old["metadata"][kept]
            self._record(resource, "MODIFIED", old, stored)
            self._store[key] = stored
            return copy.deepcopy(stored)

    def modify(
        self, resource: str, namespace: str | None, name: str, change: Callable[[Obj], None]
    ) -> Obj:
        """Update an object by applying `change` to a copy of it."""
        current = self.get(resource, namespace, name)
        if current is None:
            raise KeyError(f"{resource} {namespace}/{name} not found")
        change(current)
        return self.update(resource, current)

    def delete(self, resource: str, namespace: str | None, name: str) -> Obj:
        """Remove an object; its DELETED event carries its last state at a new version."""
        with self._cond:
            key = (resource, namespace or "", name)
            old = self._store.pop(key)
            final = copy.deepcopy(old)
            self._record(resource, "DELETED", old, final)
            return copy.deepcopy(final)

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """A copy of an object, None when absent."""
        with self._cond:
            found = self._store.get((resource, namespace or "", name))
            return copy.deepcopy(found) if found is not None else None

    def objects(self, resource: str) -> list[Obj]:
        """Copies of every object of a resource, by namespace and name."""
        with self._cond:
            return [copy.deepcopy(o) for k, o in sorted(self._store.items()) if k[0] == resource]

    def _prepared(self, resource: str, obj: Obj) -> Obj:
        kind = RESOURCES[resource]
        stored: Obj = json.loads(json.dumps(obj))  # a deep copy that is plain JSON
        stored["kind"] = kind.kind
        stored["apiVersion"] = kind.api_version
        stored.setdefault("metadata", {})
        if not stored["metadata"].get("name"):
            raise ValueError("an object needs metadata.name")
        return stored

    @staticmethod
    def _key(resource: str, meta: Obj) -> tuple[str, str, str]:
        return (resource, meta.get("namespace") or "", meta["name"])

    def _record(self, resource: str, type_: EventType, old: Obj | None, new: Obj) -> None:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append(Event(self._rv, resource, type_, old, copy.deepcopy(new)))
        self._history_rvs.append(self._rv)
        if len(self._history) > self.history_limit:
            dropped = len(self._history) - self.history_limit
            self._floor = self._history[dropped - 1].rv
            del self._history[:dropped]
            del self._history_rvs[:dropped]
        self._cond.notify_all()

    # ---- watches -------------------------------------------------------------------

    def bookmark(self, resource: str | None = None) -> int:
        """Send a BOOKMARK now on the open watches that allow bookmarks."""
        return self._flag(resource, "bookmark_now")

    def open_watches(self, resource: str | None = None) -> int:
        """Watches being served now."""
        with self._cond:
            return sum(1 for w in self._watches if resource in (None, w.resource))

    def _flag(self, resource: str | None, name: str) -> int:
        with self._cond:
            hit = [w for w in self._watches if resource in (None, w.resource)]
            for watch in hit:
                setattr(watch, name, True)
            self._cond.notify_all()
            return len(hit)

    def _selected(self, query: Query) -> list[Obj]:
        return [
            copy.deepcopy(obj)
            for (res, ns, _), obj in sorted(self._store.items())
            if res == query.resource
            and query.namespace in (None, ns)
            and query.matches(obj["metadata"].get("labels") or {})
            and query.fields(obj)
        ]

    def _pending(self, watch: Watch) -> Iterator[bytes]:
        start = bisect.bisect_right(self._history_rvs, watch.position)
        for event in self._history[start:]:
            if event.resource != watch.resource:
                continue
            seen = self._visible(watch, event)
            if seen is not None:
                yield event_line(*seen)

    @staticmethod
    def _visible(watch: Watch, event: Event) -> tuple[EventType, Obj] | None:
        """What a watch with a namespace and selector sees of an event."""
        namespace = event.new["metadata"].get("namespace")
        if watch.namespace is not None and namespace != watch.namespace:
            return None

        def selected(obj: Obj | None) -> bool:
            return (
                obj is not None
                and watch.matches(obj["metadata"].get("labels") or {})
                and watch.fields(obj)
            )

        was, now = selected(event.old), selected(event.new)
        if event.type == "ADDED":
            return ("ADDED", event.new) if now else None
        if event.type == "DELETED":
            return ("DELETED", event.new) if was else None
        if was and now:
            return ("MODIFIED", event.new)
        if now:
            return ("ADDED", event.new)
        return ("DELETED", event.new) if was else None
