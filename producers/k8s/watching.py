"""One list+watch of one collection: a thin loop around a testable `step` (kopf's style).

`step` does one unit of work: a (paginated) list, then the relist difference published;
or one watch request, its events applied until the server ends the stream. `run`
repeats it until stopped, with jittered exponential backoff after failures. A watch
that times out or drops is resumed from the last resourceVersion (the API replays what
was missed), so renewals are invisible downstream; only a 410 (the resourceVersion was
compacted away) costs a relist, published as the difference against what was sent.

A watch given `recall` (what Kafka holds of its objects, `producers.k8s.recall`) is seeded
with it before its first list, so a restarted watcher publishes the deletions it missed
and the changes that never arrived; that first list, like every periodic one, re-sends
every live object, so each has a message within `full_resync_s` (plus a watch request)
of the last one the watcher wrote, which bounds how far back a restart reads.

What was published (`published`) is changed under a lock: `refresh` publishes again,
from another thread, an object whose value changed without an event of its own (a node
whose DRA devices changed), and `relist_soon` asks for a relist (an object now wanted).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tenacity import RetryCallState, Retrying, wait_exponential

from producers.base.kubeapi import ApiError, Collection, Disconnected, Expired, KubeApi, WatchLines
from producers.k8s.dra import SliceDevices
from producers.k8s.kinds import Kind
from producers.k8s.objects import Bookmark, Change, MalformedObject, StatusError
from producers.k8s.recall import RecallFailed
from producers.k8s.resync import Observed, Published, on_change, relist
from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.k8s_workload import K8sWorkload

log = logging.getLogger(__name__)

O = TypeVar("O")  # noqa: E741 - the object type
V = TypeVar("V", K8sPod, K8sNode, K8sWorkload, SliceDevices)

PAGE_SIZE = 500  # items per list page, as client-go's reflector asks for
FULL_RESYNC_S = 6 * 3600.0  # re-send every live object well inside the topics' 7-day retention
MAX_LIST_RESTARTS = 3  # a continue token that keeps expiring: give up, back off, relist


def wall_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits between half and all of
    min(cap, base * 2**(n-1)) (tenacity's `wait_exponential`), so restarted watchers do
    not hit the API in step; the jitter draws from `rng`, which tests seed."""

    base_s: float = 0.5
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (1 = first retry)."""
        state = RetryCallState(Retrying(), None, (), {})
        state.attempt_number = attempt
        ceiling = wait_exponential(multiplier=self.base_s, max=self.cap_s)(state)
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)


@dataclass
class WatchStats:
    """What one watch has done, for the watcher's metrics (read from another thread)."""

    events: Counter[str] = field(default_factory=Counter)
    """Watch events received by type: ADDED, MODIFIED, DELETED, BOOKMARK, ERROR."""
    published: Counter[str] = field(default_factory=Counter)
    """Messages published by type: ADDED, MODIFIED, DELETED, RESYNC."""
    relists: Counter[str] = field(default_factory=Counter)
    """Lists by reason: initial, expired (410), malformed, periodic, or the reason given
    to `relist_soon` (dra: a node's DRA devices made it a GPU node)."""
    api_errors: Counter[str] = field(default_factory=Counter)
    """Failed requests by HTTP status ("none": no answer, "disconnect": a stream broke)."""
    malformed: int = 0
    """Objects or events that could not be used (skipped, logged)."""
    watch_requests: int = 0
    last_event_at: float | None = None
    """Monotonic time of the last watch event or list (bookmarks count: the API is alive)."""
    tracked: int = 0
    """Objects published and not deleted."""
    recalled: int | None = None
    """Live objects the first list was compared with (read back from Kafka); None: none."""
    recall_failures: int = 0
    """Read-backs that failed (Kafka away) and were tried again."""


class Watch(Generic[O, V]):
    """List+watch of one collection, publishing the values of `kind` through `emit`."""

    def __init__(
        self,
        *,
        api: KubeApi,
        collection: Collection,
        kind: Kind[O, V],
        emit: Callable[[V], None],
        watch_timeout_s: int,
        now_ms: Callable[[], int] = wall_ms,
        monotonic: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
        page_size: int = PAGE_SIZE,
        full_resync_s: float | None = FULL_RESYNC_S,
        recall: Callable[[], Mapping[str, V]] | None = None,
    ) -> None:
        self.collection = collection
        self.kind: Kind[O, V] = kind
        self.stats = WatchStats()
        self.published: dict[str, Published[V]] = {}
        self.resource_version: str | None = None
        self._api = api
        self._emit_value: Callable[[V], None] = emit
        self._timeout_s = watch_timeout_s
        self._now_ms = now_ms
        self._monotonic = monotonic
        self._backoff = backoff or Backoff()
        self._page_size = page_size
        self._full_resync_s = full_resync_s
        self._full_resync_at: float | None = None
        self._relist_reason = "initial"
        self._listed = False
        self._lock = threading.Lock()
        self._state = threading.RLock()
        self._connection: WatchLines | None = None
        self._stopping = False
        self._relist_wanted: str | None = None
        self._recall: Callable[[], Mapping[str, V]] | None = recall

    # ---- the loop ------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Step until `stop` is set; back off after failures, never raise an API error."""
        failures = 0
        while not stop.is_set():
            try:
                progressed = self.step()
            except ApiError as exc:
                if stop.is_set() or self._stopping:
                    break
                failures += 1
                self._count_error(exc)
                delay = self._backoff.delay(failures)
                log.warning(
                    "API error collection=%s status=%s attempt=%d retry_in_s=%.2f error=%s",
                    self.collection,
                    exc.status,
                    failures,
                    delay,
                    exc,
                )
            except RecallFailed as exc:
                if stop.is_set() or self._stopping:
                    break
                failures += 1
                self.stats.recall_failures += 1
                delay = self._backoff.delay(failures)
                log.warning(
                    "read-back failed collection=%s attempt=%d retry_in_s=%.2f error=%s",
                    self.collection,
                    failures,
                    delay,
                    exc,
                )
            else:
                if progressed:
                    failures = 0
                    continue
                failures += 1
                delay = self._backoff.delay(failures)
            stop.wait(delay)

    def interrupt(self) -> None:
        """Stop for good: close the open watch so a blocked read returns (any thread)."""
        with self._lock:
            self._stopping = True
            connection = self._connection
        if connection is not None:
            connection.close()

    def relist_soon(self, reason: str) -> None:
        """List again (the difference published) before watching on (any thread): an
        object not published may be wanted now though it did not change. Requests made
        before the list starts are answered by one list."""
        with self._lock:
            self._relist_wanted = reason
            connection = self._connection
        if connection is not None:
            connection.close()

    def refresh(
        self, keys: Iterable[str], observe: Callable[[str], Observed[V] | None]
    ) -> set[str]:
        """Publish again, as MODIFIED at the watcher's clock, the published objects of
        `keys` whose value (`observe`: None for unknown) changed without an event of their
        own (any thread). The keys not published are returned."""
        unpublished: set[str] = set()
        with self._state:
            for key in keys:
                previous = self.published.get(key)
                if previous is None:
                    unpublished.add(key)
                    continue
                observed = observe(key)
                if observed is None:
                    continue
                entry, message = on_change(previous, "MODIFIED", observed, self._now_ms())
                if entry is not None:
                    self.published[key] = entry
                if message is not None:
                    self._emit(message)
        return unpublished

    def step(self) -> bool:
        """One list or one watch request; False when it made no progress (back off).

        Raises ApiError when a request fails, RecallFailed when the read-back before the
        first list does; the state is then unchanged but for the events already applied,
        so the next step resumes where this one stopped.
        """
        with self._lock:
            wanted, self._relist_wanted = self._relist_wanted, None
        if wanted is not None and self.resource_version is not None:
            self._relist_reason = wanted
            try:
                self._relist(resend_all=False)
            except ApiError:
                with self._lock:
                    self._relist_wanted = self._relist_wanted or wanted
                raise
            return True
        if self.resource_version is None:
            if not self._listed:
                self._seed()
            # The first list re-sends everything, as a periodic one does (see the module doc).
            self._relist(resend_all=not self._listed)
            return True
        if self._full_resync_at is not None and self._monotonic() >= self._full_resync_at:
            self._relist_reason = "periodic"
            self._relist(resend_all=True)
            return True
        return self._watch(self.resource_version)

    # ---- list ----------------------------------------------------------------------

    def _seed(self) -> None:
        """Before the first list: what Kafka holds of the live objects, as published."""
        if self._recall is None or self.stats.recalled is not None:
            return
        recalled = self._recall()
        with self._state:
            for key, value in recalled.items():
                # No resourceVersion: the list compares content; no stamps: a change's time
                # is its latest recorded transition, never before the value Kafka holds.
                self.published.setdefault(key, Published("", value, frozenset()))
            self.stats.recalled = len(recalled)
            self.stats.tracked = len(self.published)
        log.info("read back collection=%s live=%d", self.collection, len(recalled))

    def _relist(self, *, resend_all: bool) -> None:
        objects, version = self._list_all()
        with self._state:
            observed: list[Observed[V]] = []
            for obj in objects:
                try:
                    if self.kind.key(obj) in self.published or self.kind.wanted(obj):
                        observed.append(self.kind.observe(obj))
                except MalformedObject as exc:
                    self._malformed(exc)
            outcome = relist(
                self.published,
                observed,
                self._now_ms(),
                cold=not self._listed,
                resend_all=resend_all,
            )
            for message in outcome.messages:
                self._emit(message)
            for key in self.published.keys() - outcome.published.keys():
                self.kind.forget(key)
            self.published = outcome.published
            self.stats.tracked = len(self.published)
        self.stats.relists[self._relist_reason] += 1
        self.stats.last_event_at = self._monotonic()
        log.info(
            "listed collection=%s reason=%s objects=%d tracked=%d published=%d resource_version=%s",
            self.collection,
            self._relist_reason,
            len(objects),
            len(self.published),
            len(outcome.messages),
            version,
        )
        self.resource_version = version
        self._listed = True
        self._relist_reason = "expired"
        if resend_all and self._full_resync_s is not None:
            # Only a list that re-sent everything restarts the period: a 410's does not.
            self._full_resync_at = self._monotonic() + self._full_resync_s

    def _list_all(self) -> tuple[list[O], str]:
        objects: list[O] = []
        token: str | None = None
        restarts = 0
        while True:
            try:
                raw = self._api.list(self.collection, limit=self._page_size, continue_token=token)
            except Expired:
                # The continue token outlived the API's snapshot: start a consistent list
                # again (a continued list from the latest state could miss deletions).
                if token is None or restarts >= MAX_LIST_RESTARTS:
                    raise
                restarts += 1
                objects, token = [], None
                continue
            try:
                page = self.kind.decode_list(raw)
            except MalformedObject as exc:
                raise ApiError(f"unusable list of {self.collection}: {exc}") from exc
            objects.extend(page.items)
            for skipped in page.skipped:
                self._malformed(skipped)
            if page.continue_token is None:
                return objects, page.resource_version
            token = page.continue_token

    # ---- watch ---------------------------------------------------------------------

    def _watch(self, version: str) -> bool:
        self.stats.watch_requests += 1
        started = self._monotonic()
        try:
            lines = self._api.watch(
                self.collection, resource_version=version, timeout_s=self._timeout_s
            )
        except Expired as exc:
            self._expired(str(exc))
            return False
        with self._lock:
            self._connection = lines
            stopping = self._stopping
            relist_wanted = self._relist_wanted is not None
        events = 0
        try:
            if stopping:
                return False
            if relist_wanted:
                return True
            for line in lines:
                events += 1
                self.stats.last_event_at = self._monotonic()
                if not self._apply(line):
                    return events > 1
        finally:
            with self._lock:
                self._connection = None
            lines.close()
        # The server ended the stream (its timeout), or `relist_soon` did: go on at once,
        # unless it ended suspiciously early with nothing in it.
        if self._relist_wanted is not None:
            return True
        return events > 0 or self._monotonic() - started >= self._timeout_s / 2

    def _apply(self, line: bytes) -> bool:
        """Apply one watch line; False when the watch must end (410, unusable event)."""
        try:
            event = self.kind.decode_event(line)
        except MalformedObject as exc:
            # An event we cannot read is an event we would miss: relist to converge.
            self._malformed(exc)
            self.stats.events["MALFORMED"] += 1
            self._relist_reason = "malformed"
            self.resource_version = None
            return False
        if isinstance(event, Bookmark):
            self.stats.events["BOOKMARK"] += 1
            self.resource_version = event.resource_version
            return True
        if isinstance(event, StatusError):
            self.stats.events["ERROR"] += 1
            if event.code == 410:
                self._expired(event.message)
                return False
            raise ApiError(f"watch error {event.reason}: {event.message}", event.code or None)
        self.stats.events[event.type] += 1
        self._change(event)
        return True

    def _change(self, change: Change[O]) -> None:
        obj = change.object
        try:
            with self._state:
                key = self.kind.key(obj)
                previous = self.published.get(key)
                if previous is not None or (change.type != "DELETED" and self.kind.wanted(obj)):
                    entry, message = on_change(
                        previous, change.type, self.kind.observe(obj), self._now_ms()
                    )
                    if entry is None:
                        self.published.pop(key, None)
                        self.kind.forget(key)
                    else:
                        self.published[key] = entry
                    if message is not None:
                        self._emit(message)
                    self.stats.tracked = len(self.published)
        except MalformedObject as exc:
            self._malformed(exc)
        self.resource_version = self.kind.version(obj) or self.resource_version

    # ---- helpers -------------------------------------------------------------------

    def _expired(self, message: str) -> None:
        log.info("watch expired, relisting collection=%s detail=%s", self.collection, message)
        self._relist_reason = "expired"
        self.resource_version = None

    def _emit(self, message: V) -> None:
        self.stats.published[message.type] += 1
        self._emit_value(message)

    def _malformed(self, exc: MalformedObject) -> None:
        self.stats.malformed += 1
        log.error("unusable object skipped collection=%s error=%s", self.collection, exc)

    def _count_error(self, exc: ApiError) -> None:
        if isinstance(exc, Disconnected):
            self.stats.api_errors["disconnect"] += 1
        else:
            self.stats.api_errors[str(exc.status) if exc.status else "none"] += 1
