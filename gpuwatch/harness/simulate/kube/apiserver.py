"""An in-process Kubernetes API server: list and watch of Pods and Nodes (and get of the
ReplicaSets and Jobs that own pods), with the failure modes a watcher must survive.

It speaks the wire protocol the real `kubernetes` client expects, so tests and the
cluster simulator drive the real watcher through it. The objects, their resourceVersions
and history, and what a selector sees of them are `gpuwatch.harness.simulate.kube.store`'s;
this module serves them over HTTP:

- lists with `limit`/`continue` from a consistent snapshot (410 once the token expires);
- watches as chunked JSON lines, `labelSelector` and `fieldSelector` applied,
  `timeoutSeconds` ending the stream cleanly, BOOKMARK events when `allowWatchBookmarks`
  is set;
- a watch from a resourceVersion older than the history it keeps gets `410 Gone`, as an
  ERROR event in the stream or, optionally, as the HTTP status.

What only tests do to it (compaction on cue, ERROR 410 on open watches, abruptly dropped
connections, HTTP errors for the next requests) is in tests/support/fake_apiserver.py: it
sets the flags of the open watches (`_flag`) and answers `_take_failure`, which the
serving here reads.

Standard library only; one thread per connection. Use it as a context manager.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Self
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
from gpuwatch.harness.simulate.kube.labelselector import parse_selector
from gpuwatch.harness.simulate.kube.store import (
    RESOURCES,
    Obj,
    ObjectStore,
    Query,
    Snapshot,
    Watch,
    parse_field_selector,
)

log = logging.getLogger(__name__)

__all__ = ["FakeApiServer", "RequestRecord"]

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


@dataclass(frozen=True)
class RequestRecord:
    """One request the server answered, for assertions (which resourceVersion, selector)."""

    path: str
    params: Mapping[str, str]

    @property
    def watch(self) -> bool:
        """Whether it was a watch."""
        return self.params.get("watch") in ("true", "1")


class FakeApiServer(ObjectStore):
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
        super().__init__(history_limit=history_limit, clock=clock)
        self.bookmark_interval_s = bookmark_interval_s
        self.kueue = kueue
        """Whether Kueue's API group is served (its CRDs installed)."""
        self.dra = dra
        """Whether `resource.k8s.io` is served (Kubernetes 1.34 and later: DRA is GA)."""
        self.expired_as_status = expired_as_status
        self.requests: deque[RequestRecord] = deque(maxlen=REQUESTS_KEPT)
        """The latest requests answered, oldest first."""
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
        query = Query(resource, namespace, matches, fields=fields)
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

    def _list(self, request: Handler, query: Query, params: Mapping[str, str]) -> None:
        token = params.get("continue")
        with self._cond:
            if token:
                snapshot = self._snapshots.pop(token, None)
            else:
                snapshot = Snapshot(self._rv, self._selected(query))
            metadata: Obj = {}
            items: list[Obj] = []
            if snapshot is not None:
                limit = int(params.get("limit") or 0)
                cut = limit if 0 < limit < len(snapshot.items) else len(snapshot.items)
                items, rest = snapshot.items[:cut], snapshot.items[cut:]
                metadata["resourceVersion"] = str(snapshot.rv)
                if rest:
                    next_token = secrets.token_urlsafe(12)
                    self._snapshots[next_token] = Snapshot(snapshot.rv, rest)
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

    def _watch(self, request: Handler, query: Query, params: Mapping[str, str]) -> None:
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
            watch = Watch(
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

    def _stream(self, request: Handler, watch: Watch, deadline: float) -> None:
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
