"""An in-process Kubernetes API server: list and watch of Pods and Nodes (and get of the
ReplicaSets and Jobs that own pods), with the failure modes a watcher must survive.

It speaks the wire protocol the real `kubernetes` client expects, so tests and the
cluster simulator drive the real watcher through it:

- one resourceVersion counter for every object (etcd's revision); lists return it and
  watches resume from it, replaying every change after it;
- lists with `limit`/`continue` from a consistent snapshot (410 once the token expires);
- watches as chunked JSON lines, `labelSelector` (and `fieldSelector`, such as
  `spec.nodeName=gpu-1`) applied with the real transitions
  (an object leaving the selection is DELETED, one entering it ADDED), `timeoutSeconds`
  ending the stream cleanly, BOOKMARK events when `allowWatchBookmarks` is set;
- a watch from a resourceVersion older than the history it keeps gets `410 Gone`, as an
  ERROR event in the stream or, optionally, as the HTTP status.

What only tests do to it (compaction on cue, ERROR 410 on open watches, abruptly dropped
connections, HTTP errors for the next requests) is in tests/support/fake_apiserver.py: it
sets the flags of the open watches (`_flag`) and answers `_take_failure`, which the
serving here reads.

Standard library only; one thread per connection. Use it as a context manager.
"""

from __future__ import annotations

import bisect
import copy
import json
import logging
import math
import re
import secrets
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Self
from urllib.parse import parse_qs, urlsplit

from gpuwatch.harness.simulate.kube.httpwire import (
    Handler,
    Server,
    Stop,
    event_line,
    send_json,
    send_status,
    status_body,
)
from gpuwatch.harness.simulate.kube.labelselector import Matcher, parse_selector

log = logging.getLogger(__name__)

__all__ = [
    "RESOURCES",
    "FakeApiServer",
    "RequestRecord",
    "ResourceType",
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
KUEUE_GROUP_PATH = "/apis/kueue.x-k8s.io"
DRA_GROUP_PATH = "/apis/resource.k8s.io"

_ROUTE = re.compile(
    r"^(?P<prefix>/api/v1|/apis/apps/v1|/apis/batch/v1|/apis/kueue\.x-k8s\.io/v1beta2"
    r"|/apis/resource\.k8s\.io/v1)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+))?/?$"
)
DEFAULT_WATCH_TIMEOUT_S = 1800  # the real server picks 30-60 minutes when none is asked
REQUESTS_KEPT = 10_000  # the request log of a long simulation stays bounded
SNAPSHOTS_KEPT = 100  # unfinished paginated lists; older continue tokens expire (410)


def _api_group(name: str, versions: tuple[str, ...]) -> Obj:
    """The APIGroup discovery document of `name`, its first version preferred."""
    served = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": served,
        "preferredVersion": served[0],
    }


def rfc3339(epoch_s: float) -> str:
    """A time as the API writes it: `2024-05-01T10:00:00Z` (whole seconds)."""
    return datetime.fromtimestamp(int(epoch_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class RequestRecord:
    """One request the server answered, for assertions (which resourceVersion, selector)."""

    path: str
    params: Mapping[str, str]

    @property
    def watch(self) -> bool:
        """Whether it was a watch."""
        return self.params.get("watch") in ("true", "1")


@dataclass(frozen=True)
class _Event:
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
class _Query:
    """What a list or watch selects: a resource, in one namespace or all, by labels and
    fields."""

    resource: str
    namespace: str | None
    matches: Matcher
    fields: FieldMatcher = field(default=_every_object, kw_only=True)


@dataclass(eq=False)
class _Watch(_Query):
    bookmarks: bool
    position: int
    drop: bool = False
    expire: bool = False
    bookmark_now: bool = False


@dataclass
class _Snapshot:
    rv: int
    items: list[Obj]


class FakeApiServer:
    """The test API server. `url` is where the `kubernetes` client should point."""

    def __init__(
        self,
        *,
        bookmark_interval_s: float | None = 60.0,
        history_limit: int = 10_000,
        expired_as_status: bool = False,
        clock: Callable[[], float] = time.time,
        kueue: bool = True,
        dra: bool = True,
    ) -> None:
        self.bookmark_interval_s = bookmark_interval_s
        self.kueue = kueue
        """Whether Kueue's API group is served (its CRDs installed)."""
        self.dra = dra
        """Whether `resource.k8s.io` is served (Kubernetes 1.34 and later: DRA is GA)."""
        self.history_limit = history_limit
        self.expired_as_status = expired_as_status
        self.requests: deque[RequestRecord] = deque(maxlen=REQUESTS_KEPT)
        """The latest requests answered, oldest first."""
        self._clock = clock
        self._cond = threading.Condition()
        self._store: dict[tuple[str, str, str], Obj] = {}
        self._rv = 1
        self._history: list[_Event] = []
        self._history_rvs: list[int] = []
        self._floor = 1  # a watch may resume from this resourceVersion or later
        self._watches: set[_Watch] = set()
        self._snapshots: dict[str, _Snapshot] = {}
        self._stopping = False
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> Self:
        """Listen on 127.0.0.1 (a free port) and serve on a thread of its own."""
        self._server = Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-apiserver"
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, cut every connection and join every thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.cut_all()
        server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

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
        self._history.append(_Event(self._rv, resource, type_, old, copy.deepcopy(new)))
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

    # ---- serving -------------------------------------------------------------------

    def handle(self, request: Handler) -> None:
        """Answer one GET."""
        url = urlsplit(request.path)
        params = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        route = _ROUTE.match(url.path)
        resource = route["resource"] if route else None
        with self._cond:
            self.requests.append(RequestRecord(url.path, params))
            failure = self._take_failure(resource)
        if url.path.rstrip("/") == KUEUE_GROUP_PATH and self.kueue:
            return send_json(request, 200, _api_group("kueue.x-k8s.io", ("v1beta2", "v1beta1")))
        if url.path.rstrip("/") == DRA_GROUP_PATH and self.dra:
            return send_json(request, 200, _api_group("resource.k8s.io", ("v1",)))
        kind = RESOURCES.get(resource or "")
        if (resource == "workloads" and not self.kueue) or (
            kind is not None and kind.prefix.startswith(DRA_GROUP_PATH) and not self.dra
        ):
            kind = None
        if route is None or kind is None or kind.prefix != route["prefix"]:
            return send_status(request, 404, "NotFound", f"the server could not find {url.path}")
        if route["namespace"] and not kind.namespaced:
            return send_status(request, 404, "NotFound", f"{resource} are not namespaced")
        if failure is not None:
            return send_status(request, failure, "InternalError", "injected failure")
        assert resource is not None
        try:
            matches = parse_selector(params.get("labelSelector"))
            fields = parse_field_selector(params.get("fieldSelector"))
        except ValueError as exc:
            return send_status(request, 400, "BadRequest", str(exc))
        namespace, name = route["namespace"], route["name"]
        if name is not None:
            return self._get(request, resource, namespace, name)
        query = _Query(resource, namespace, matches, fields=fields)
        if params.get("watch") in ("true", "1"):
            return self._watch(request, query, params)
        return self._list(request, query, params)

    def _take_failure(self, resource: str | None) -> int | None:
        """The HTTP status to answer this request of `resource` with instead, taken under
        the lock; none here (tests inject failures)."""
        return None

    def _get(self, request: Handler, resource: str, namespace: str | None, name: str) -> None:
        found = self.get(resource, namespace, name)
        if found is None:
            kind = RESOURCES[resource]
            message = f'{resource}.{kind.api_version.split("/")[0]} "{name}" not found'
            return send_status(request, 404, "NotFound", message)
        return send_json(request, 200, found)

    def _selected(self, query: _Query) -> list[Obj]:
        return [
            copy.deepcopy(obj)
            for (res, ns, _), obj in sorted(self._store.items())
            if res == query.resource
            and query.namespace in (None, ns)
            and query.matches(obj["metadata"].get("labels") or {})
            and query.fields(obj)
        ]

    def _list(self, request: Handler, query: _Query, params: Mapping[str, str]) -> None:
        token = params.get("continue")
        with self._cond:
            if token:
                snapshot = self._snapshots.pop(token, None)
            else:
                snapshot = _Snapshot(self._rv, self._selected(query))
            metadata: Obj = {}
            items: list[Obj] = []
            if snapshot is not None:
                limit = int(params.get("limit") or 0)
                cut = limit if 0 < limit < len(snapshot.items) else len(snapshot.items)
                items, rest = snapshot.items[:cut], snapshot.items[cut:]
                metadata["resourceVersion"] = str(snapshot.rv)
                if rest:
                    next_token = secrets.token_urlsafe(12)
                    self._snapshots[next_token] = _Snapshot(snapshot.rv, rest)
                    while len(self._snapshots) > SNAPSHOTS_KEPT:
                        del self._snapshots[next(iter(self._snapshots))]
                    metadata["continue"] = next_token
                    metadata["remainingItemCount"] = len(rest)
        if snapshot is None:
            message = (
                "The provided continue parameter is too old to display a consistent list result."
            )
            return send_status(request, 410, "Expired", message)
        for item in items:  # list items carry no kind/apiVersion: the list says it
            item.pop("kind", None)
            item.pop("apiVersion", None)
        kind = RESOURCES[query.resource]
        body = {
            "kind": kind.list_kind,
            "apiVersion": kind.api_version,
            "metadata": metadata,
            "items": items,
        }
        return send_json(request, 200, body)

    def _watch(self, request: Handler, query: _Query, params: Mapping[str, str]) -> None:
        asked = params.get("resourceVersion") or "0"
        timeout_s = float(params.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        if not asked.isdigit():
            return send_status(request, 400, "BadRequest", f"invalid resourceVersion {asked!r}")
        with self._cond:
            position = int(asked)
            initial: list[Obj] = []
            expired = None
            if position == 0:  # "any": the current state as ADDED events, then changes
                initial = self._selected(query)
                position = self._rv
            elif position < self._floor:
                expired = f"too old resource version: {position} ({self._floor})"
            watch = _Watch(
                query.resource,
                query.namespace,
                query.matches,
                bookmarks,
                position,
                fields=query.fields,
            )
            if expired is None:
                self._watches.add(watch)
        if expired is not None:
            if self.expired_as_status:
                return send_status(request, 410, "Expired", expired)
            request.start_stream()
            request.write_chunk(event_line("ERROR", status_body(410, "Expired", expired)))
            return request.end_stream()
        try:
            request.start_stream()
            for obj in initial:
                request.write_chunk(event_line("ADDED", obj))
            self._stream(request, watch, time.monotonic() + timeout_s)
        except Stop:
            request.close_connection = True
        finally:
            with self._cond:
                self._watches.discard(watch)

    def _stream(self, request: Handler, watch: _Watch, deadline: float) -> None:
        interval = self.bookmark_interval_s
        next_bookmark = time.monotonic() + interval if interval else math.inf
        while True:
            wake_at = min(deadline, next_bookmark)
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._stopping
                        or watch.drop
                        or watch.expire
                        or watch.bookmark_now
                        or self._rv > watch.position
                    ),
                    timeout=max(0.0, wake_at - time.monotonic()),
                )
                if self._stopping or watch.drop:
                    request.cut()
                    raise Stop
                lines = list(self._pending(watch))
                watch.position = self._rv
                expire, watch.expire = watch.expire, False
                bookmark_now, watch.bookmark_now = watch.bookmark_now, False
            for line in lines:
                request.write_chunk(line)
            if expire:
                message = f"too old resource version: {watch.position} ({self._floor})"
                request.write_chunk(event_line("ERROR", status_body(410, "Expired", message)))
                return request.end_stream()
            now = time.monotonic()
            due = now >= next_bookmark
            if watch.bookmarks and (bookmark_now or due):
                request.write_chunk(
                    event_line("BOOKMARK", _bookmark(watch.resource, watch.position))
                )
            if due and interval:
                next_bookmark = now + interval
            if now >= deadline:
                return request.end_stream()

    def _pending(self, watch: _Watch) -> Iterator[bytes]:
        start = bisect.bisect_right(self._history_rvs, watch.position)
        for event in self._history[start:]:
            if event.resource != watch.resource:
                continue
            seen = self._visible(watch, event)
            if seen is not None:
                yield event_line(*seen)

    @staticmethod
    def _visible(watch: _Watch, event: _Event) -> tuple[EventType, Obj] | None:
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


def _bookmark(resource: str, rv: int) -> Obj:
    kind = RESOURCES[resource]
    body: Obj = {
        "kind": kind.kind,
        "apiVersion": kind.api_version,
        "metadata": {"resourceVersion": str(rv), "creationTimestamp": None},
    }
    if resource == "pods":  # what the real server sends: an empty object, containers null
        body["spec"] = {"containers": None}
        body["status"] = {}
    return body
