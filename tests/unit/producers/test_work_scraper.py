"""WorkScraper rounds over scripted pods (no thread: one worker), the thread's step, the
merge into PodWork and the agent's metrics of the scrapes."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from producers.agent.metrics import WorkCollector
from producers.work.fetch import ScrapeFailed
from producers.work.scraper import WorkScraper, WorkScraperThread, pod_work
from producers.work.targets import WorkTarget
from schemas.ids import NodeName, PodUid
from schemas.nvml_sample import PodWork
from schemas.work_units import TOPIC, WorkUnits

T0 = 1_764_412_320_000


def target(name: str, units: dict[str, str] | None = None) -> WorkTarget:
    return WorkTarget(
        uid=PodUid(f"uid-{name}"),
        namespace="ml",
        pod=name,
        node=NodeName("gpu-node-1"),
        url=f"http://{name}:8000/metrics",
        units=units or {"steps": "train_steps_total", "tokens": "tokens"},
    )


class Pods:
    """A TargetSource and a Fetch: each pod's next answer (bytes or an exception)."""

    def __init__(self, *targets: WorkTarget) -> None:
        self.current: list[WorkTarget] = list(targets)
        self.answers: dict[str, bytes | Exception] = {}
        self.fetched: list[tuple[str, float, int]] = []

    def targets(self) -> Sequence[WorkTarget]:
        return self.current

    def __call__(self, url: str, timeout_s: float, max_bytes: int) -> bytes:
        self.fetched.append((url, timeout_s, max_bytes))
        answer = self.answers[url.split("//")[1].split(":", maxsplit=1)[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def steps(value: float, start: float = 1.7e9) -> bytes:
    return (
        f"# TYPE train_steps_total counter\ntrain_steps_total {value}\n"
        f"process_start_time_seconds {start}\n"
    ).encode()


def scraper(pods: Pods, cluster: str = "default") -> WorkScraper:
    return WorkScraper(
        pods,
        node="gpu-node-1",
        cluster=cluster,
        interval_s=15.0,
        timeout_s=5.0,
        max_bytes=1 << 20,
        max_series=100,
        clock_ms=lambda: T0,
        fetch=pods,
        workers=1,
    )


def test_the_second_good_scrape_of_a_pod_is_its_first_record() -> None:
    pods = Pods(target("a"))
    work = scraper(pods)
    pods.answers["a"] = steps(1000)
    assert work.scrape_once(T0) == []  # the baseline
    pods.answers["a"] = steps(1150)
    [record] = work.scrape_once(T0 + 15_000)
    assert record == WorkUnits(
        schema="gpuwatch.work.units/v1",
        uid=PodUid("uid-a"),
        namespace="ml",
        pod="a",
        node=NodeName("gpu-node-1"),
        ts=T0 + 15_000,
        start=T0,
        units={"steps": 150.0},
        resets=(),
        missing=("tokens",),
    )
    assert pods.fetched[0] == ("http://a:8000/metrics", 5.0, 1 << 20)
    # A valid message of the topic, its key the pod uid, the default cluster left out.
    encoded = msgspec.json.encode(record)
    assert b"cluster" not in encoded
    assert msgspec.json.decode(encoded, type=WorkUnits) == record
    assert TOPIC.key_of(record) == "uid-a"
    assert work.stats.outcomes() == {"ok": 2, "failed": 0, "too_large": 0, "bad_exposition": 0}
    assert (work.stats.rounds, work.stats.records, work.stats.targets) == (2, 1, 1)


def test_a_reset_and_a_restart_are_named_and_a_cluster_is_carried() -> None:
    pods = Pods(target("a"))
    work = scraper(pods, cluster="eu-1")
    pods.answers["a"] = steps(1000)
    work.scrape_once(T0)
    pods.answers["a"] = steps(20)
    [reset] = work.scrape_once(T0 + 15_000)
    pods.answers["a"] = steps(2000, start=1.8e9)
    [restart] = work.scrape_once(T0 + 30_000)
    assert (reset.units, reset.resets) == ({"steps": 20.0}, ("steps",))
    assert (restart.units, restart.resets) == ({"steps": 2000.0}, ("steps",))
    assert restart.cluster == "eu-1"


def test_failures_are_counted_by_outcome_and_the_next_good_scrape_covers_the_gap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pods = Pods(target("a"), target("b"))
    work = scraper(pods)
    pods.answers = {"a": steps(100), "b": steps(5)}
    work.scrape_once(T0)
    failures: list[Exception] = [
        ScrapeFailed("timeout", "no answer within 5 s"),
        ScrapeFailed("status", "HTTP 500", 500),
        ScrapeFailed("too_large", "more than 1048576 bytes"),
        RuntimeError("a bug"),
    ]
    texts = [b"\xff\xfe", b"train_steps_total NaN\n"]
    with caplog.at_level(logging.DEBUG, logger="producers.work.scraper"):
        for i, failure in enumerate([*failures, *texts]):
            pods.answers["a"] = failure
            pods.answers["b"] = steps(5 + i + 1)
            [record] = work.scrape_once(T0 + (i + 1) * 15_000)
            assert record.pod == "b"  # one pod failing fails nothing else
        pods.answers["a"] = steps(190)
        records = {r.pod: r for r in work.scrape_once(T0 + 7 * 15_000)}
    assert (records["a"].start, records["a"].ts, records["a"].units) == (
        T0,
        T0 + 7 * 15_000,
        {"steps": 90.0},
    )
    assert records["b"].start == T0 + 6 * 15_000
    assert work.stats.outcomes() == {"ok": 10, "failed": 3, "too_large": 1, "bad_exposition": 2}
    assert work.stats.failures() == {
        "timeout": 1, "status": 1, "too_large": 1, "error": 1, "not_utf8": 1, "bad_value": 1,
    }  # fmt: skip
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["units of work of pod=ml/a not scraped: timeout: no answer within 5 s"]
    assert any("ml/a scraped again" in r.getMessage() for r in caplog.records)


def test_a_pod_gone_is_forgotten_and_seen_again_starts_with_a_baseline() -> None:
    a, b = target("a"), target("b")
    pods = Pods(a, b)
    work = scraper(pods)
    pods.answers = {"a": steps(1), "b": steps(1)}
    work.scrape_once(T0)
    pods.current = [b]
    pods.answers["b"] = steps(2)
    assert [r.pod for r in work.scrape_once(T0 + 15_000)] == ["b"]
    pods.current = [a, b]
    pods.answers = {"a": steps(50), "b": steps(3)}
    assert [r.pod for r in work.scrape_once(T0 + 30_000)] == ["b"]  # a: a baseline again
    pods.answers = {"a": steps(52), "b": steps(4)}
    by_pod = {r.pod: r for r in work.scrape_once(T0 + 45_000)}
    assert (by_pod["a"].start, by_pod["a"].units) == (T0 + 30_000, {"steps": 2.0})


def test_a_source_that_raises_skips_the_round_only() -> None:
    class Broken:
        def targets(self) -> Sequence[WorkTarget]:
            raise RuntimeError("no pods")

    work = WorkScraper(
        Broken(), node="n", cluster="default", interval_s=15, timeout_s=1, max_bytes=1024,
        max_series=10, clock_ms=lambda: T0, fetch=Pods(), workers=1,
    )  # fmt: skip
    assert work.scrape_once(T0) == []
    assert work.stats.failures() == {"targets": 1}
    work.close()  # a fetch it was given is not its to close


def test_a_clock_set_back_gives_an_empty_interval_not_a_negative_one() -> None:
    pods = Pods(target("a"))
    work = scraper(pods)
    pods.answers["a"] = steps(1)
    work.scrape_once(T0)
    pods.answers["a"] = steps(3)
    [record] = work.scrape_once(T0 - 1000)
    assert (record.start, record.ts) == (T0 - 1000, T0 - 1000)


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_the_thread_step_keeps_the_cadence_of_the_clock() -> None:
    pods = Pods(target("a"))
    clock = Clock(T0)
    work = WorkScraper(
        pods, node="gpu-node-1", cluster="default", interval_s=15.0, timeout_s=5.0,
        max_bytes=1 << 20, max_series=100, clock_ms=clock, fetch=pods, workers=1,
    )  # fmt: skip
    value = [0.0]

    def answer() -> None:
        value[0] += 10
        pods.answers["a"] = steps(value[0])

    thread = WorkScraperThread(work)
    answer()
    due = thread.step(None)  # the first round runs at once
    assert (due, work.stats.rounds) == (T0 + 15_000, 1)
    clock.now = T0 + 14_999
    assert thread.step(due) == due
    assert work.stats.rounds == 1
    clock.now = T0 + 15_400  # a poll late: the next round is still on the cadence
    answer()
    due = thread.step(due)
    assert due == T0 + 30_000
    clock.now = T0 + 61_000  # a paused clock: no catching up, an interval on
    answer()
    due = thread.step(due)
    assert due == T0 + 76_000
    records = thread.drain()
    assert [(r.start, r.ts, r.units["steps"]) for r in records] == [
        (T0, T0 + 15_400, 10.0),
        (T0 + 15_400, T0 + 61_000, 10.0),
    ]
    assert thread.drain() == []


def test_records_nobody_drains_are_dropped_oldest_first() -> None:
    pods = Pods(target("a"))
    clock = Clock(T0)
    work = WorkScraper(
        pods, node="n", cluster="default", interval_s=1.0, timeout_s=1.0, max_bytes=1024,
        max_series=10, clock_ms=clock, fetch=pods, workers=1,
    )  # fmt: skip
    thread = WorkScraperThread(work, max_pending=2)
    due = None
    for i in range(5):
        pods.answers["a"] = steps(i)
        clock.now = T0 + i * 1000
        due = thread.step(due)
    assert [r.ts for r in thread.drain()] == [T0 + 3000, T0 + 4000]
    assert work.stats.dropped == 2


def test_a_round_that_raises_is_counted_and_the_thread_goes_on() -> None:
    pods = Pods(target("a"))
    work = scraper(pods)

    def broken(now_ms: int) -> list[WorkUnits]:
        raise RuntimeError("boom")

    work.scrape_once = broken  # type: ignore[method-assign]
    thread = WorkScraperThread(work)
    assert thread.step(None) == T0 + 15_000
    assert thread.errors == 1


def test_pod_work_sums_the_records_of_each_pod() -> None:
    def record(uid: str, ts: int, units: dict[str, float]) -> WorkUnits:
        return WorkUnits(
            schema="gpuwatch.work.units/v1", uid=PodUid(uid), namespace="ml", pod=uid,
            node=NodeName("n"), ts=ts, start=ts - 15_000, units=units, resets=(), missing=(),
        )  # fmt: skip

    merged = pod_work(
        [
            record("b", T0, {"steps": 1.0}),
            record("a", T0, {"steps": 2.0, "tokens": 10.0}),
            record("b", T0 + 15_000, {"steps": 3.0, "tokens": 0.5}),
        ]
    )
    assert merged == (
        PodWork(pod_uid=PodUid("b"), units={"steps": 4.0, "tokens": 0.5}),
        PodWork(pod_uid=PodUid("a"), units={"steps": 2.0, "tokens": 10.0}),
    )
    assert pod_work([]) == ()


def test_the_agent_exports_the_scrapes_by_outcome_and_reason() -> None:
    pods = Pods(target("a"), target("b"))
    work = scraper(pods)
    pods.answers = {"a": steps(1), "b": ScrapeFailed("status", "HTTP 404", 404)}
    work.scrape_once(T0)

    class Listing:
        failures = 3
        bad_annotations = 2

    registry = CollectorRegistry()
    registry.register(WorkCollector("gpu-node-1", work.stats, Listing()))
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    node = ("node", "gpu-node-1")
    assert got == {
        ("gpuwatch_agent_work_scrapes_total", (node, ("outcome", "bad_exposition"))): 0.0,
        ("gpuwatch_agent_work_scrapes_total", (node, ("outcome", "failed"))): 1.0,
        ("gpuwatch_agent_work_scrapes_total", (node, ("outcome", "ok"))): 1.0,
        ("gpuwatch_agent_work_scrapes_total", (node, ("outcome", "too_large"))): 0.0,
        ("gpuwatch_agent_work_scrape_failures_total", (node, ("reason", "status"))): 1.0,
        ("gpuwatch_agent_work_targets", (node,)): 2.0,
        ("gpuwatch_agent_work_target_errors_total", (node,)): 3.0,
        ("gpuwatch_agent_work_bad_annotations_total", (node,)): 2.0,
    }
