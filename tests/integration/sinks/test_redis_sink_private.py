"""The Redis sink against private redis-servers: restarts, outages, password and TLS."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import redis
from pydantic import SecretStr

from gpuwatch.harness.examples import POD_UID, POD_UID_2, example
from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.pod_lifecycle import PodLifecycle
from schemas.settings import RedisSettings, Settings
from sinks.redis.plan import SinkRecord
from sinks.redis.sink import Backoff, RedisSink, SinkUnavailable, redact_url

pytestmark = pytest.mark.integration

T = TypeVar("T")
PASSWORD = "s3cret/pw"  # a '/' to prove the URL's percent-encoding is honoured
PREFIX = "gwtest-private:"


def _record(schema: str, cls: type[T], **changes: Any) -> T:
    return msgspec.convert({**example(schema), **changes}, cls)


def batches() -> list[list[SinkRecord]]:
    """Three batches of one run: transitions, windows and alerts of two pods."""
    move = "gpuwatch.pod.lifecycle/v1"
    win = "gpuwatch.attribution/v1"
    return [
        [
            _record(move, PodLifecycle, ts=1000, from_state=None, to_state="queued"),
            _record(move, PodLifecycle, uid=POD_UID_2, ts=1000, from_state=None, to_state="queued"),
            _record(move, PodLifecycle, ts=2000, from_state="queued", to_state="running"),
        ],
        [
            _record(win, Attribution, window_start=0, window_end=60_000, ts=60_000),
            _record(win, Attribution, uid=POD_UID_2, window_start=0, window_end=60_000, ts=60_000),
            _record("gpuwatch.alert/v1", Alert),
        ],
        [
            _record(win, Attribution, window_start=60_000, window_end=120_000, ts=120_000),
            _record(move, PodLifecycle, ts=400_000, from_state="running", to_state="stalled"),
            _record(move, PodLifecycle, uid=POD_UID_2, ts=5000, to_state="finished"),
        ],
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateRedis:
    """A redis-server of one test, without persistence, that can be killed and restarted."""

    def __init__(self, workdir: Path, *extra: str, tls: bool = False) -> None:
        self.port, self.workdir, self.extra, self.tls = _free_port(), workdir, extra, tls
        self.proc: subprocess.Popen[bytes] | None = None
        self.client_kwargs: dict[str, Any] = {}

    def start(self) -> None:
        port_args = (
            ["--port", "0", "--tls-port", str(self.port)]
            if self.tls
            else ["--port", str(self.port)]
        )
        args = [
            "redis-server",
            *port_args,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        log = (self.workdir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [*args, "--dir", str(self.workdir), *self.extra], stdout=log, stderr=log
        )
        log.close()
        probe = redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=1, **self.client_kwargs
        )
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    probe.ping()
                    return
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.kill()
                        log_text = (self.workdir / "redis.log").read_text()
                        pytest.fail(f"redis-server did not answer in 10 s:\n{log_text}")
                    time.sleep(0.02)  # poll until the deadline
        finally:
            probe.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


class FakeTime:
    """A clock that only moves when the sink sleeps: retry budgets pass instantly."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, list[float]()

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def dump(client: redis.Redis) -> dict[str, Any]:
    """Every key: hashes and sets as they are, streams as their entries without ids."""
    out: dict[str, Any] = {}
    for key in client.scan_iter(f"{PREFIX}*"):
        kind = client.type(key)
        if kind == "hash":
            out[key] = client.hgetall(key)
        elif kind == "zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = sorted(msgspec.json.encode(e, order="sorted") for _, e in client.xrange(key))
    return out


def _sink(url: str, **kw: Any) -> RedisSink:
    return RedisSink(RedisSettings(url=SecretStr(url)), key_prefix=PREFIX, **kw)


def test_outage_raises_sink_unavailable_and_restart_converges(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeTime()
    url = f"redis://127.0.0.1:{private_redis.port}/0"
    client = redis.Redis(port=private_redis.port, decode_responses=True)
    run = batches()
    backoff = Backoff(base_s=0.1, cap_s=1.0, budget_s=5.0)
    with _sink(url, backoff=backoff, sleep=fake.sleep, clock=fake.clock) as sink:
        for batch in run:
            sink.apply(batch)
        expected = dump(client)
        private_redis.kill()
        with pytest.raises(SinkUnavailable, match="unavailable after") as raised:
            sink.apply(run[2])
        assert fake.sleeps[:5] == [0.1, 0.2, 0.4, 0.8, 1.0]
        assert max(fake.sleeps) == 1.0
        assert sum(fake.sleeps) <= backoff.budget_s
        assert isinstance(raised.value.__cause__, redis.ConnectionError)
        private_redis.start()  # empty: no persistence, no scripts loaded
        sink.apply(run[2])  # reconnects and reloads the scripts
        assert client.hget(f"{PREFIX}pod:{POD_UID}", "state") == "stalled"
        for batch in run:  # the worker re-delivers from its committed offsets
            sink.apply(batch)
    assert dump(client) == expected
    assert "retrying" in caplog.text
    client.close()


def test_restart_during_apply_is_absorbed_by_the_retry_budget(private_redis: PrivateRedis) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}/0"
    client = redis.Redis(port=private_redis.port, decode_responses=True)
    run = batches()
    retrying = threading.Event()
    failures: list[BaseException] = []

    def sleep(seconds: float) -> None:
        retrying.set()
        time.sleep(seconds)  # the sink's own backoff, as in production

    with _sink(url, backoff=Backoff(base_s=0.02, cap_s=0.2, budget_s=30), sleep=sleep) as sink:
        sink.apply(run[0])
        sink.apply(run[1])
        private_redis.kill()

        def apply_last() -> None:
            try:
                sink.apply(run[2])
            except BaseException as err:  # reported by the test thread
                failures.append(err)

        worker = threading.Thread(target=apply_last)
        worker.start()
        assert retrying.wait(timeout=10), "the sink never retried"
        private_redis.start()
        worker.join(timeout=30)
        assert not worker.is_alive()
        assert failures == []
        assert client.hget(f"{PREFIX}pod:{POD_UID}", "state") == "stalled"
        for batch in run:
            sink.apply(batch)
    with _sink(url) as fresh:  # the same run on an untouched prefix... after a flush
        state = dump(client)
        client.flushdb()
        for batch in run:
            fresh.apply(batch)
        assert dump(client) == state
    assert f"{PREFIX}state:stalled" in state
    client.close()


def test_script_cache_flush_is_recovered(private_redis: PrivateRedis) -> None:
    client = redis.Redis(port=private_redis.port, decode_responses=True)
    with _sink(f"redis://127.0.0.1:{private_redis.port}") as sink:
        sink.apply(batches()[0])
        client.script_flush()
        sink.apply(batches()[2])
    assert client.hget(f"{PREFIX}pod:{POD_UID}", "state") == "stalled"
    client.close()


def _tls_files(workdir: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_password_and_tls_url(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = _tls_files(tmp_path)
    tls = [
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-ca-cert-file",
        str(cert),
    ]
    server = PrivateRedis(
        tmp_path, *tls, "--tls-auth-clients", "no", "--requirepass", PASSWORD, tls=True
    )
    server.client_kwargs = {"password": PASSWORD, "ssl": True, "ssl_ca_certs": str(cert)}
    try:
        server.start()
        plain_base = f"127.0.0.1:{server.port}/0"
        base = f"{plain_base}?ssl_ca_certs={cert}"
        with _sink(f"rediss://:s3cret%2Fpw@{base}") as sink:
            sink.apply(batches()[0])
        client = redis.Redis(
            host="127.0.0.1", port=server.port, decode_responses=True, **server.client_kwargs
        )
        assert client.hget(f"{PREFIX}pod:{POD_UID}", "state") == "running"
        client.close()
        fake = FakeTime()
        wrong = f"rediss://:wrong-{PASSWORD.replace('/', '%2F')}@{base}"
        with (
            _sink(wrong, backoff=Backoff(budget_s=1), sleep=fake.sleep, clock=fake.clock) as sink,
            pytest.raises(SinkUnavailable) as raised,
        ):
            sink.apply(batches()[0])
        with (
            caplog.at_level(logging.DEBUG),
            _sink(
                f"redis://:s3cret%2Fpw@{plain_base}",
                backoff=Backoff(budget_s=1),
                sleep=fake.sleep,
                clock=fake.clock,
            ) as plain,
            pytest.raises(SinkUnavailable) as plain_raised,
        ):
            plain.apply(batches()[0])  # plain TCP to a TLS-only port
    finally:
        server.kill()
    for text in (caplog.text, str(raised.value), str(plain_raised.value), plain.target):
        assert "s3cret" not in text
    assert plain.target == f"redis://:***@{plain_base}"


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert (
        redact_url("rediss://user:pw@host:6380/1?ssl_ca_certs=/x")
        == "rediss://user:***@host:6380/1?ssl_ca_certs=/x"
    )
    assert redact_url("redis://:p%40ss@h/0") == "redis://:***@h/0"


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(base_s=0.05, cap_s=2.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert backoff.delay(500) == 2.0


def test_uses_the_stack_settings_url(stack: Settings) -> None:
    with RedisSink(stack.redis, key_prefix=PREFIX + "stack:") as sink:
        assert sink.target == redact_url(stack.redis.url.get_secret_value())
        assert sink.plan([]) == []
        sink.apply([])  # an empty batch sends nothing
