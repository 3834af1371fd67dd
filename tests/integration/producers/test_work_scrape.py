"""Scrapes of units of work over real HTTP: pods served by local HTTP servers (one per
pod, as pods have an IP each) that change their counters, answer too slowly, drip, send
too much, fail, compress or are not there; the scraper's records and counts of each."""

from __future__ import annotations

import gzip
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support import free_port, wait_until

from producers.work.fetch import ACCEPT, HttpFetcher, ScrapeFailed
from producers.work.scraper import WorkScraper, WorkScraperThread
from producers.work.targets import WorkTarget
from schemas.ids import NodeName, PodUid

T0 = 1_764_412_320_000
TIMEOUT_S = 0.5
CAP = 64 << 10


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@dataclass
class Behaviour:
    """What a pod's endpoint does; a test changes it between scrapes."""

    body: bytes = b""
    status: int = 200
    hold: bool = False
    """Answer only when released (at the end of the test): a pod that hangs."""
    drip: bool = False
    """Send the body a byte every 50 ms: each read is quick, the whole is not."""
    length: bool = True
    """Send Content-Length (else the body ends when the connection closes)."""
    headers: dict[str, str] = field(default_factory=dict)
    seen: list[dict[str, str]] = field(default_factory=list)


class PodServer(ThreadingHTTPServer):
    """One pod's metrics endpoint on 127.0.0.1."""

    daemon_threads = False  # every handler joined at close: no thread left behind

    def __init__(self, behaviour: Behaviour, release: threading.Event) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.behaviour = behaviour
        self.release = release

    def handle_error(self, request: object, client_address: object) -> None:
        return None  # a client that gave up (timeout, too large) breaks the pipe: expected

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"


class Handler(BaseHTTPRequestHandler):
    server: PodServer

    def do_GET(self) -> None:
        behaviour = self.server.behaviour
        behaviour.seen.append({"path": self.path, **dict(self.headers.items())})
        if behaviour.hold:
            self.server.release.wait(30)
        self.send_response(behaviour.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        for name, value in behaviour.headers.items():
            self.send_header(name, value)
        if behaviour.length:
            self.send_header("Content-Length", str(len(behaviour.body)))
        self.end_headers()
        if not behaviour.drip:
            self.wfile.write(behaviour.body)
            return
        for i in range(len(behaviour.body)):
            if self.server.release.wait(0.05):
                return
            self.wfile.write(behaviour.body[i : i + 1])
            self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def pods() -> Iterator[Callable[[Behaviour], PodServer]]:
    """`pods(behaviour)`: a started pod endpoint; all stopped (and released) after the test."""
    release = threading.Event()
    started: list[tuple[PodServer, threading.Thread]] = []

    def start(behaviour: Behaviour) -> PodServer:
        server = PodServer(behaviour, release)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="pod-endpoint"
        )
        thread.start()
        started.append((server, thread))
        return server

    yield start
    release.set()
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join()


def target(name: str, url: str) -> WorkTarget:
    return WorkTarget(
        uid=PodUid(f"uid-{name}"),
        namespace="ml",
        pod=name,
        node=NodeName("gpu-node-1"),
        url=url,
        units={"tokens": "vllm:generation_tokens_total", "steps": "train_steps"},
    )


def vllm(tokens_a: float, tokens_b: float) -> bytes:
    return (
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{model_name="a"}} {tokens_a}\n'
        f'vllm:generation_tokens_total{{model_name="b"}} {tokens_b}\n'
        "process_start_time_seconds 1764400000.5\n"
    ).encode()


class Targets:
    def __init__(self, *targets: WorkTarget) -> None:
        self.current = list(targets)

    def targets(self) -> list[WorkTarget]:
        return self.current


def test_a_round_records_the_good_pods_and_counts_each_failure(
    pods: Callable[[Behaviour], PodServer],
) -> None:
    good = Behaviour(body=vllm(100, 50))
    other = Behaviour(body=b"# TYPE train_steps counter\ntrain_steps_total 10\n")
    servers = {
        "good": pods(good),
        "other": pods(other),
        "hangs": pods(Behaviour(body=vllm(1, 1), hold=True)),
        "drips": pods(Behaviour(body=vllm(1, 1) * 10, drip=True)),
        "huge": pods(Behaviour(body=b"x 1\n" * (CAP // 4 + 1))),
        "huge-unsized": pods(Behaviour(body=b"x 1\n" * (CAP // 4 + 1), length=False)),
        "fails": pods(Behaviour(body=b"oops", status=500)),
        "garbage": pods(Behaviour(body=b"\x00\x01\xff" * 100)),
    }
    targets = [target(name, server.url) for name, server in servers.items()]
    targets.append(target("gone", f"http://127.0.0.1:{free_port()}/metrics"))
    scraper = WorkScraper(
        Targets(*targets),
        node="gpu-node-1",
        cluster="default",
        interval_s=15.0,
        timeout_s=TIMEOUT_S,
        max_bytes=CAP,
        max_series=1000,
        clock_ms=lambda: T0,
    )
    try:
        began = time.monotonic()
        assert scraper.scrape_once(T0) == []  # baselines of the two good pods
        took = time.monotonic() - began
        good.body = vllm(160.5, 50)
        other.body = b"# TYPE train_steps counter\ntrain_steps_total 4\n"  # reset
        records = {r.pod: r for r in scraper.scrape_once(T0 + 15_000)}
    finally:
        scraper.close()
    # The hanging and dripping pods cost their timeout, in parallel, not 30 s each.
    assert took < TIMEOUT_S + 2.0
    assert set(records) == {"good", "other"}
    assert (records["good"].start, records["good"].ts) == (T0, T0 + 15_000)
    assert (records["good"].units, records["good"].missing) == ({"tokens": 60.5}, ("steps",))
    assert (records["other"].units, records["other"].resets) == ({"steps": 4.0}, ("steps",))
    assert scraper.stats.outcomes() == {
        "ok": 4, "failed": 8, "too_large": 4, "bad_exposition": 2,
    }  # fmt: skip
    assert scraper.stats.failures() == {
        "timeout": 4, "too_large": 4, "status": 2, "connection": 2, "not_utf8": 2,
    }  # fmt: skip
    seen = good.seen[0]
    assert (seen["path"], seen["Accept"]) == ("/metrics", ACCEPT)


@pytest.mark.parametrize(
    ("behaviour", "reason", "status"),
    [
        (Behaviour(body=b"moved", status=302, headers={"Location": "/elsewhere"}), "status", 302),
        (Behaviour(body=b"", status=404), "status", 404),
        (Behaviour(body=gzip.compress(b"x 1\n"), headers={"Content-Encoding": "gzip"}),
         "compressed", None),
        (Behaviour(body=b"x" * (CAP + 1)), "too_large", None),
        (Behaviour(body=b"x" * (CAP + 1), length=False), "too_large", None),
        (Behaviour(body=b"x 1\n", hold=True), "timeout", None),
        (Behaviour(body=b"x 1\n" * 20, drip=True), "timeout", None),
    ],
)  # fmt: skip
def test_fetch_fails_with_a_reason(
    pods: Callable[[Behaviour], PodServer], behaviour: Behaviour, reason: str, status: int | None
) -> None:
    server = pods(behaviour)
    fetch = HttpFetcher()
    try:
        began = time.monotonic()
        with pytest.raises(ScrapeFailed) as failed:
            fetch(server.url, TIMEOUT_S, CAP)
        took = time.monotonic() - began
    finally:
        fetch.close()
    assert (failed.value.reason, failed.value.status) == (reason, status)
    assert took < TIMEOUT_S + 1.0  # a drip too: the limit is on the whole scrape


def test_fetch_reads_exactly_the_cap_and_reuses_its_connection(
    pods: Callable[[Behaviour], PodServer],
) -> None:
    behaviour = Behaviour(body=b"x" * CAP)
    server = pods(behaviour)
    fetch = HttpFetcher()
    try:
        assert fetch(server.url, TIMEOUT_S, CAP) == b"x" * CAP
        assert fetch(server.url + "?again", TIMEOUT_S, CAP) == b"x" * CAP
        behaviour.length = False
        assert fetch(server.url, TIMEOUT_S, CAP) == b"x" * CAP
    finally:
        fetch.close()
    assert [s["path"] for s in behaviour.seen] == ["/metrics", "/metrics?again", "/metrics"]
    assert behaviour.seen[0]["Accept-Encoding"] == "identity"


def test_nobody_listening_is_a_connection_failure() -> None:
    fetch = HttpFetcher()
    try:
        with pytest.raises(ScrapeFailed) as failed:
            fetch(f"http://127.0.0.1:{free_port()}/metrics", TIMEOUT_S, CAP)
    finally:
        fetch.close()
    assert failed.value.reason == "connection"


def test_the_thread_scrapes_every_interval_of_a_clock_60_times_faster(
    pods: Callable[[Behaviour], PodServer],
) -> None:
    behaviour = Behaviour(body=vllm(0, 0))
    server = pods(behaviour)
    began = time.monotonic()

    def clock_ms() -> int:  # a simulation at 60x: 15 simulated seconds in 0.25 s
        return T0 + round((time.monotonic() - began) * 60_000)

    served = [0]

    def count_up() -> None:
        served[0] += 1
        behaviour.body = vllm(served[0] * 10, 0)

    scraper = WorkScraper(
        Targets(target("a", server.url)),
        node="gpu-node-1",
        cluster="default",
        interval_s=15.0,
        timeout_s=TIMEOUT_S,
        max_bytes=CAP,
        max_series=1000,
        clock_ms=clock_ms,
    )
    thread = WorkScraperThread(scraper, poll_s=0.01).start()
    records = []
    try:
        while len(records) < 4:
            count_up()  # more tokens between scrapes
            records += thread.drain()
            assert time.monotonic() - began < 20, records
            time.sleep(0.02)
    finally:
        assert thread.stop(timeout=5)
        scraper.close()
    for before, after in itertools.pairwise(records):
        assert before.ts == after.start
    for record in records:
        # 15 simulated seconds, give or take a round late by a poll, a scrape and a busy
        # machine's pause (6 simulated seconds are 0.1 s of wall time)
        assert 15_000 - 6_000 <= record.ts - record.start <= 15_000 + 6_000
        assert record.units["tokens"] > 0
    assert records[0].start - T0 < 6_000  # the first round ran at start


def test_stop_ends_the_thread_with_a_sleep_of_the_callers(
    pods: Callable[[Behaviour], PodServer],
) -> None:
    server = pods(Behaviour(body=vllm(1, 1)))
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    scraper = WorkScraper(
        Targets(target("a", server.url)),
        node="gpu-node-1",
        cluster="default",
        interval_s=15.0,
        timeout_s=TIMEOUT_S,
        max_bytes=CAP,
        max_series=1000,
        clock_ms=lambda: T0,
    )
    thread = WorkScraperThread(scraper, poll_s=0.02, sleep=sleep).start()
    try:
        wait_until(lambda: scraper.stats.rounds == 1 and len(sleeps) > 2, timeout_s=10,
                   what="a round and a few sleeps")  # fmt: skip
    finally:
        assert thread.stop(timeout=5)
        scraper.close()
    assert set(sleeps) == {0.02}
    assert scraper.stats.rounds == 1  # a clock that stands still: one round only
