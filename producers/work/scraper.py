"""Scrapes the units of work of a node's opted-in pods into `work.units` records.

`WorkScraper.scrape_once` is one round: every target of the source is fetched and read
(a few at a time, in threads: a pod that does not answer holds one thread for
`timeout_s`, not the round), each good reading is turned into increases since the pod's
previous good one, and each pod with a previous one gets a record over
`[previous scrape, this scrape)`. A failure of any kind is counted and logged (once per
pod until it is scraped again) and never ends a round. `WorkScraperThread` runs rounds
every `interval_s` of a clock that may be a simulated one running faster than wall time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from producers.work.deltas import CounterDeltas
from producers.work.exposition import BadExposition, Counters, read_counters
from producers.work.fetch import Fetch, HttpFetcher, ScrapeFailed
from producers.work.targets import TargetSource, WorkTarget
from schemas.ids import NodeName, PodUid
from schemas.nvml_sample import PodWork
from schemas.work_units import WorkUnits

__all__ = [
    "OUTCOMES",
    "SCHEMA",
    "WorkScraper",
    "WorkScraperThread",
    "WorkStats",
    "pod_work",
]

log = logging.getLogger(__name__)

SCHEMA: Final = "gpuwatch.work.units/v1"
OUTCOMES: Final = ("ok", "failed", "too_large", "bad_exposition")
"""`ok`: read (a record, or a pod's baseline); `too_large`: the body passed `max_bytes`;
`bad_exposition`: the text could not be read; `failed`: anything else (no answer, not
200, an error of ours); `WorkStats.failures` says why by reason."""
WORKERS = 8  # pods answer in milliseconds; 8 keep a round short with a few slow ones


class WorkStats:
    """Counts of a scraper's outcomes, read by the metrics endpoint from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: Counter[str] = Counter(dict.fromkeys(OUTCOMES, 0))
        self._failures: Counter[str] = Counter()
        self.rounds = 0
        """Rounds run (`scrape_once` calls)."""
        self.records = 0
        """Records produced."""
        self.targets = 0
        """Targets of the last round."""
        self.dropped = 0
        """Records a thread dropped, oldest first, because nobody drained them."""
        self.last_round_s = 0.0
        """Wall seconds the last round took."""

    def count(self, outcome: str, reason: str | None = None) -> None:
        """One scrape's outcome, and the reason of one that was not ok."""
        with self._lock:
            self._outcomes[outcome] += 1
            if reason is not None:
                self._failures[reason] += 1

    def outcomes(self) -> dict[str, int]:
        """Scrapes by outcome (every one of OUTCOMES, 0 until it happens)."""
        with self._lock:
            return dict(self._outcomes)

    def failures(self) -> dict[str, int]:
        """Scrapes not ok by reason (`timeout`, `status`, `unparsable`, `error`...)."""
        with self._lock:
            return dict(self._failures)


@dataclass(frozen=True)
class _Result:
    counters: Counters | None = None
    outcome: str = "ok"
    reason: str | None = None
    detail: str = ""


class WorkScraper:
    """Rounds of scrapes of the targets of `source`; `close` releases its connections."""

    def __init__(
        self,
        source: TargetSource,
        *,
        node: str,
        cluster: str,
        interval_s: float,
        timeout_s: float,
        max_bytes: int,
        max_series: int,
        clock_ms: Callable[[], int],
        fetch: Fetch | None = None,
        workers: int = WORKERS,
    ) -> None:
        """`clock_ms` is the time of records (epoch ms), the agent's own clock; `fetch`
        defaults to an `HttpFetcher` the scraper owns. Up to `workers` pods are scraped at
        once, each round in a pool of its own (1: one after the other, in the caller)."""
        self._source = source
        self.node = NodeName(node)
        self.cluster = cluster
        self.interval_s = interval_s
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._max_series = max_series
        self.clock_ms = clock_ms
        self._owned: HttpFetcher | None = None
        if fetch is None:
            self._owned = fetch = HttpFetcher()
        self._fetch = fetch
        self._workers = max(1, workers)
        self._deltas = CounterDeltas()
        self._last_ok: dict[str, int] = {}
        """uid -> time of the pod's last good scrape: the start of its next record."""
        self._failing: set[str] = set()
        self.stats = WorkStats()

    def scrape_once(self, now_ms: int) -> list[WorkUnits]:
        """Scrape every target now; the records of the pods read well and read before."""
        began = time.monotonic()
        self.stats.rounds += 1
        try:
            targets = list(self._source.targets())
        except Exception:  # a source of another's making: the round is skipped, not the loop
            log.exception("work targets unavailable; round skipped")
            self.stats.count("failed", "targets")
            return []
        self.stats.targets = len(targets)
        self._forget_all_but({t.uid for t in targets})
        workers = min(self._workers, len(targets))
        if workers <= 1:  # one target, or `workers=1`: no thread at all
            results = [self._read(target) for target in targets]
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="work-scrape") as pool:
                results = list(pool.map(self._read, targets))
        records = [
            record
            for target, result in zip(targets, results, strict=True)
            if (record := self._record(target, result, now_ms)) is not None
        ]
        self.stats.records += len(records)
        self.stats.last_round_s = time.monotonic() - began
        return records

    def close(self) -> None:
        """Release the connections of the fetcher the scraper made (not one it was given)."""
        if self._owned is not None:
            self._owned.close()

    def _forget_all_but(self, current: set[PodUid]) -> None:
        for uid in self._deltas.uids() - current:
            self._deltas.forget(uid)
            self._last_ok.pop(uid, None)
        self._failing &= current

    def _read(self, target: WorkTarget) -> _Result:
        """Runs in a pool thread: fetch and parse, every error turned into an outcome."""
        try:
            body = self._fetch(target.url, self._timeout_s, self._max_bytes)
            return _Result(read_counters(body, target.units, self._max_series))
        except ScrapeFailed as exc:
            outcome = "too_large" if exc.reason == "too_large" else "failed"
            return _Result(None, outcome, exc.reason, str(exc))
        except BadExposition as exc:
            return _Result(None, "bad_exposition", exc.reason, str(exc))
        except Exception as exc:  # a bug of ours or a fetch's: one pod fails, not the round
            log.debug("scrape of %s raised", target.url, exc_info=True)
            return _Result(None, "failed", "error", f"{type(exc).__name__}: {exc}")

    def _record(self, target: WorkTarget, result: _Result, now_ms: int) -> WorkUnits | None:
        pod = f"{target.namespace}/{target.pod}"
        if result.counters is None:
            self.stats.count(result.outcome, result.reason)
            level = logging.DEBUG if target.uid in self._failing else logging.WARNING
            log.log(level, "units of work of pod=%s not scraped: %s", pod, result.detail)
            self._failing.add(target.uid)
            return None
        try:
            record = self._increase(target, result.counters, now_ms)
        except Exception:  # a bug of ours: this pod's record is lost, not the round
            log.exception("units of work of pod=%s not recorded", pod)
            self.stats.count("failed", "error")
            return None
        self.stats.count("ok")
        if target.uid in self._failing:
            log.info("units of work of pod=%s scraped again", pod)
            self._failing.discard(target.uid)
        return record

    def _increase(self, target: WorkTarget, counters: Counters, now_ms: int) -> WorkUnits | None:
        """The record of a good scrape; None for a pod's first (its baseline)."""
        increase = self._deltas.observe(target.uid, counters.values, counters.process_start)
        start = self._last_ok.get(target.uid)
        self._last_ok[target.uid] = now_ms
        if increase is None or start is None:
            return None
        return WorkUnits(
            schema=SCHEMA,
            uid=target.uid,
            namespace=target.namespace,
            pod=target.pod,
            node=target.node,
            ts=now_ms,
            start=min(start, now_ms),  # a clock set back: an empty interval, not a negative one
            units=increase.units,
            resets=increase.resets,
            missing=tuple(sorted(counters.missing)),
            cluster=self.cluster,
        )


class WorkScraperThread:
    """Runs `scraper.scrape_once` every `interval_s` of the scraper's clock in a thread.

    The clock may run faster than wall time (a simulation): the thread sleeps on wall time
    in steps of `poll_s` and scrapes when the clock has reached the next round's time, so at
    60x a 15 s interval is a scrape every quarter of a wall second. The first round runs at
    `start`. Records wait in the thread until `drain` (at most `max_pending`, oldest
    dropped and counted in `stats.dropped`).
    """

    def __init__(
        self,
        scraper: WorkScraper,
        *,
        poll_s: float = 0.05,
        sleep: Callable[[float], object] | None = None,
        max_pending: int = 10_000,
    ) -> None:
        """`sleep` is called with `poll_s` between looks at the clock; by default the
        thread waits on its stop event, so `stop` ends it at once."""
        self.scraper = scraper
        self._poll_s = poll_s
        self._sleep = sleep
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._pending: deque[WorkUnits] = deque()
        self._max_pending = max_pending
        self._thread = threading.Thread(target=self._run, name="work-scraper", daemon=True)
        self.errors = 0
        """Rounds that raised (logged; the thread goes on)."""

    def start(self) -> WorkScraperThread:
        """Start the thread; the first round runs now."""
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the thread to end after its current round and wait up to `timeout`; whether
        it ended. The scraper is not closed (its owner does that)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def drain(self) -> list[WorkUnits]:
        """The records produced since the last drain, oldest first."""
        with self._lock:
            records = list(self._pending)
            self._pending.clear()
        return records

    def step(self, due_ms: int | None) -> int:
        """One look at the clock: a round when `due_ms` is None or reached; the next
        round's time. Rounds keep their cadence; one late by more than an interval (a
        slow round, a paused clock) is not caught up, the next is an interval on."""
        now = self.scraper.clock_ms()
        if due_ms is not None and now < due_ms:
            return due_ms
        try:
            self._keep(self.scraper.scrape_once(now))
        except Exception:
            self.errors += 1
            log.exception("work scrape round failed")
        interval_ms = max(1, round(self.scraper.interval_s * 1000))
        following = (now if due_ms is None else due_ms) + interval_ms
        return following if following > now else now + interval_ms

    def _keep(self, records: Iterable[WorkUnits]) -> None:
        with self._lock:
            self._pending.extend(records)
            overflow = len(self._pending) - self._max_pending
            for _ in range(max(0, overflow)):
                self._pending.popleft()
            self.scraper.stats.dropped += max(0, overflow)

    def _run(self) -> None:
        due: int | None = None
        while not self._stopping.is_set():
            due = self.step(due)
            if self._sleep is None:
                self._stopping.wait(self._poll_s)
            else:
                self._sleep(self._poll_s)


def pod_work(records: Iterable[WorkUnits]) -> tuple[PodWork, ...]:
    """The records' units per pod, summed (a sample's interval may hold two scrapes), in
    the order the pods first appear."""
    merged: dict[PodUid, dict[str, float]] = {}
    for record in records:
        units = merged.setdefault(record.uid, {})
        for name, count in record.units.items():
            units[name] = units.get(name, 0.0) + count
    return tuple(PodWork(pod_uid=uid, units=units) for uid, units in merged.items())
