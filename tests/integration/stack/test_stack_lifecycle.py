"""`stack up | status | down` for real, in a state dir and on ports of this test alone."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from support import free_ports, holds_within

from gpuwatch.config import load_settings
from gpuwatch.harness.stack import manager, processes, prometheus
from gpuwatch.harness.stack.kafka import KAFKA_IMPORT_WARNING
from gpuwatch.harness.stack.service import ServiceStatus, StackError
from schemas.settings import Settings

pytestmark = pytest.mark.integration

# The main stack's ports (9092/9093/6379/9090) belong to the other integration tests.
MAIN_PORTS = {9092, 9093, 6379, 9090}


def _free_ports(count: int) -> list[int]:
    ports = free_ports(count)
    assert not MAIN_PORTS & set(ports)
    return ports


def _isolated(tmp_path: Path, **ports: int) -> Settings:
    """Settings of a stack of its own; the Kafka jar cache stays the shared default."""
    kafka_port, controller_port, redis_port, prometheus_port = _free_ports(4)
    overrides: dict[str, Any] = {
        "stack.state_dir": tmp_path / "state",
        "stack.kafka_port": kafka_port,
        "stack.kafka_controller_port": controller_port,
        "stack.redis_port": redis_port,
        "stack.prometheus_port": prometheus_port,
        "stack.ready_timeout_s": 60,
    }
    overrides.update({f"stack.{key}": value for key, value in ports.items()})
    return load_settings(overrides=overrides)


@pytest.fixture
def messages() -> list[str]:
    return []


@pytest.fixture
def isolated(tmp_path: Path, messages: list[str]) -> Iterator[Settings]:
    """An isolated stack's settings; whatever the test started is stopped afterwards."""
    settings = _isolated(tmp_path)
    yield settings
    manager.down(settings, messages.append)


def _by_name(statuses: list[ServiceStatus]) -> dict[str, ServiceStatus]:
    return {s.name: s for s in statuses}


def _get_json(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        return json.loads(response.read())


def _kafka_round_trip(port: int) -> bytes | None:
    """Create a topic, produce one message, read it back; the value read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", KAFKA_IMPORT_WARNING, DeprecationWarning)
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
        from kafka.admin import NewTopic

    bootstrap = f"127.0.0.1:{port}"
    topic = f"gwtest-stack-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send(topic, key=b"k", value=b"hello stack").get(timeout=10)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=1000)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    return bytes(record.value)
    finally:
        consumer.close()
    return None


def test_up_status_down_lifecycle(isolated: Settings, messages: list[str]) -> None:
    stack = isolated.stack
    started = time.monotonic()
    first = _by_name(manager.up(isolated, messages.append))
    took = time.monotonic() - started
    assert {name: s.state for name, s in first.items()} == {
        "kafka": "up",
        "redis": "up",
        "prometheus": "up",
    }, messages
    assert took < 60, f"up took {took:.1f} s"
    pids = {name: s.pid for name, s in first.items()}
    assert all(isinstance(pid, int) for pid in pids.values())
    assert any(m.startswith("waiting for kafka on 127.0.0.1:") for m in messages)
    root = stack.state_dir.resolve()
    for name, pid in pids.items():
        assert pid is not None
        assert processes.read_pid(root / "run" / f"{name}.pid") == pid
        assert first[name].log == root / "logs" / f"{name}.log"
        assert processes.is_ours(pid, root)
    assert (root / "kafka" / "data" / "meta.properties").is_file()

    # Kafka: a topic of our own, one message through it.
    assert _kafka_round_trip(stack.kafka_port) == b"hello stack"

    # Redis: SET then GET.
    client = redis.Redis(host="127.0.0.1", port=stack.redis_port, socket_timeout=5)
    try:
        assert client.set("gwtest:stack", "42") is True
        assert client.get("gwtest:stack") == b"42"
    finally:
        client.close()

    # Prometheus: ready, running the checkout's configuration (its jobs), answering queries.
    base = f"http://127.0.0.1:{stack.prometheus_port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base}/-/ready", timeout=5) as response:
        assert response.status == 200

    def jobs_up() -> set[str]:
        body = _get_json(f"{base}/api/v1/query?query=up")
        assert body["status"] == "success"
        return {series["metric"]["job"] for series in body["data"]["result"]}

    # Every job of deploy/prometheus/prometheus.yml has an `up` series once scraped once.
    config = yaml.safe_load(prometheus.default_config().read_text(encoding="utf-8"))
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"gpuwatch-worker", "gpuwatch-sink", "gpuwatch-sink-metrics", "prometheus"} <= jobs
    assert holds_within(lambda: jobs_up() == jobs, timeout_s=20, interval_s=0.2), jobs_up()

    # up again: the same processes, nothing restarted.
    messages.clear()
    again = _by_name(manager.up(isolated, messages.append))
    assert {name: s.pid for name, s in again.items()} == pids
    assert {s.state for s in again.values()} == {"up"}
    assert not [m for m in messages if m.startswith("starting")], messages
    kafka_log = (root / "logs" / "kafka.log").read_text()
    assert kafka_log.count("--- gpuwatch: ") == 2  # formatting, then one start

    now = _by_name(manager.status(isolated))
    assert {name: (s.state, s.pid) for name, s in now.items()} == {
        name: ("up", pid) for name, pid in pids.items()
    }

    stopped = _by_name(manager.down(isolated, messages.append))
    assert {s.state for s in stopped.values()} == {"down"}
    for name, pid in pids.items():
        assert pid is not None
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) still exists"
        assert not (root / "run" / f"{name}.pid").exists()
    assert (root / "kafka" / "data" / "meta.properties").is_file()  # data is kept
    after = _by_name(manager.status(isolated))
    assert {name: (s.state, s.pid) for name, s in after.items()} == {
        "kafka": ("down", None),
        "redis": ("down", None),
        "prometheus": ("down", None),
    }


def test_foreign_listener_on_a_port_is_an_error_naming_it(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = int(sock.getsockname()[1])
        settings = _isolated(tmp_path, redis_port=port)
        with pytest.raises(StackError) as caught:
            manager.up(settings)
    assert f"port {port} on 127.0.0.1 is in use" in str(caught.value)
    assert "does not answer as redis" in str(caught.value)
    assert not list((tmp_path / "state").rglob("*.pid"))


def test_foreign_redis_is_external_and_left_running(tmp_path: Path) -> None:
    settings = _isolated(tmp_path)
    port = settings.stack.redis_port
    foreign_dir = tmp_path / "foreign"
    foreign_dir.mkdir()
    foreign = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        cwd=foreign_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        try:
            assert holds_within(lambda: _pings(client), timeout_s=10, interval_s=0.2)
        finally:
            client.close()
        seen = _by_name(manager.status(settings))
        assert (seen["redis"].state, seen["redis"].pid) == ("external", None)
        assert seen["kafka"].state == "down"
        left = _by_name(manager.down(settings))
        assert left["redis"].state == "external"
        assert "left running" in left["redis"].detail
        assert foreign.poll() is None
    finally:
        foreign.terminate()
        foreign.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return client.ping() is True
    except redis.RedisError:
        return False
