"""The agent rides out a Kafka outage: sampling goes on, and what reaches Kafka is accounted for.

A stack of its own (state dir and ports of this module), so stopping its broker does not
disturb the shared one the other integration tests use.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support import free_ports, threads_left, wait_until
from topic_io import consume_all

from gpuwatch.config import load_settings
from gpuwatch.harness.simulate.node import simple_node
from gpuwatch.harness.stack import manager, processes
from gpuwatch.harness.stack.service import StackPaths
from gpuwatch.kafka import create_topics
from producers.agent.loop import NodeAgent
from producers.base.kafka import KafkaSender
from producers.base.publisher import Publisher
from schemas import NVML_SAMPLES
from schemas.settings import Settings

# kafka-python 3.0 (kafka/net/inet.py, KafkaNetSocket.connect) does not close the socket of
# a refused connect; it is closed when garbage-collected, with a ResourceWarning. Each
# reconnect attempt during the outage (and each probe while the broker restarts) leaves
# one, so this module ignores exactly that warning and collects them before the next test.
SOCKET_LEFT_BY_KAFKA = r"unclosed <socket\.socket"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(f"ignore:{SOCKET_LEFT_BY_KAFKA}:ResourceWarning"),
]

MAIN_PORTS = {9092, 9093, 6379, 9090}  # the shared stack's
INTERVAL_S = 0.1
Consume = Callable[[Settings, str], list[Any]]
GPUS = 2


def _free_ports(count: int) -> list[int]:
    ports = free_ports(count)
    assert not MAIN_PORTS & set(ports)
    return ports


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A running stack of this module alone; stopped afterwards whatever happened."""
    kafka_port, controller_port, redis_port, prometheus_port = _free_ports(4)
    settings = load_settings(
        overrides={
            "stack.state_dir": tmp_path_factory.mktemp("outage") / "state",
            "stack.kafka_port": kafka_port,
            "stack.kafka_controller_port": controller_port,
            "stack.redis_port": redis_port,
            "stack.prometheus_port": prometheus_port,
            "stack.ready_timeout_s": 60,
            "kafka.bootstrap": f"127.0.0.1:{kafka_port}",
            "kafka.partitions": 3,
        }
    )
    try:
        statuses = manager.up(settings)
        assert {s.name: s.state for s in statuses}["kafka"] == "up"
        yield settings
    finally:
        manager.down(settings)


@pytest.fixture(autouse=True)
def collect_sockets_left_by_kafka(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    # Kafka's threads first: they may still be making sockets (conftest fails a test whose
    # threads outlive it; here it is only waited for).
    threads_left(before, timeout_s=10)
    # The records of kafka's "Connection failed: %s" hold the error, whose traceback holds
    # the socket; the report has its text already, so the records can go now.
    for when in ("setup", "call"):
        caplog.get_records(when).clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", SOCKET_LEFT_BY_KAFKA, ResourceWarning)
        gc.collect()


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `check` until it holds; the seconds it took. Fails naming `what` at the deadline."""
    started = time.monotonic()
    wait_until(check, timeout_s=timeout_s, what=what, interval_s=0.02)
    return time.monotonic() - started


def stop_kafka(settings: Settings) -> int:
    """SIGTERM the stack's broker (only it) and wait until it is gone; its pid."""
    pid_file = StackPaths.of(settings.stack.state_dir).pid_file("kafka")
    pid = processes.read_pid(pid_file)
    assert pid is not None
    assert processes.is_ours(pid, StackPaths.of(settings.stack.state_dir).root)
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not processes.is_running(pid), 40, f"kafka (pid {pid}) to exit")
    return pid


def sample_bytes() -> int:
    """What one sample of a test node takes in the outbox (key and value)."""
    reader, pods = simple_node("gwtest-tiny", gpus=GPUS, seed=1)
    sizes: list[int] = []
    agent = NodeAgent(
        node="gwtest-tiny",
        reader=reader,
        resolver=pods,
        allocations=pods,
        publish=lambda key, value: sizes.append(len(key) + len(value)),
        interval_s=INTERVAL_S,
    )
    for _ in range(5):
        agent.tick()
    return max(sizes)


@dataclass
class Run:
    """One agent and its publisher, sampling into a topic of its own."""

    node: str
    topic: str
    settings: Settings
    agent: NodeAgent
    publisher: Publisher
    stop: threading.Event
    loop: threading.Thread
    at_outage: int = 0
    outage_ticks_s: float = 0.0
    """Seconds it took for OUTAGE_TICKS ticks while the broker was away."""
    dropped_during_outage: int = 0
    seqs: tuple[int, ...] = ()
    """The seqs consumed from its topic afterwards, in offset order."""


def start_agent(settings: Settings, node: str, **publisher_options: Any) -> Run:
    prefix = f"gwtest-{uuid.uuid4().hex[:10]}."
    scoped = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"topic_prefix": prefix})}
    )
    assert all(row.ok for row in create_topics(scoped))
    topic = NVML_SAMPLES.full_name(prefix)
    reader, pods = simple_node(node, gpus=GPUS, seed=1)
    sender = KafkaSender(scoped.kafka, topic, client_id=node, delivery_timeout_s=120)
    publisher = Publisher(sender, **publisher_options)
    agent = NodeAgent(
        node=node,
        reader=reader,
        resolver=pods,
        allocations=pods,
        publish=publisher.publish,
        interval_s=INTERVAL_S,
    )
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), name=f"gwtest-loop-{node}")
    publisher.start()
    loop.start()
    return Run(node, topic, scoped, agent, publisher, stop, loop)


OUTAGE_TICKS = 50  # 5 s of schedule with Kafka gone, then the broker's restart on top


def ticked(run: Run, seq: int) -> Callable[[], bool]:
    return lambda: run.agent.seq >= seq


def ride_out_outage(
    isolated: Settings, ticks: int, figures: dict[str, float | int] | None = None
) -> dict[str, Run]:
    """Two agents, one with a big buffer and one with a tiny one, through a Kafka outage of
    `ticks` samples; their runs once stopped, with the seqs that reached the topic."""
    figures = {} if figures is None else figures
    threads_before = set(threading.enumerate())
    one = sample_bytes() + 64  # readings vary a little in length
    runs: dict[str, Run] = {}
    try:
        runs["big"] = start_agent(isolated, "gwtest-big", max_buffer_bytes=16 << 20)
        runs["tiny"] = start_agent(
            isolated, "gwtest-tiny", max_buffer_bytes=3 * one, in_flight_bytes=2 * one
        )
        both = list(runs.values())
        wait_for(lambda: all(r.publisher.stats.sent >= 10 for r in both), 30, "10 acks each")
        for run in both:
            run.at_outage = run.agent.seq
        went = time.monotonic()
        old_pid = stop_kafka(isolated)
        for run in both:
            wait_for(
                ticked(run, run.at_outage + ticks),
                ticks * INTERVAL_S + 30,
                f"{run.node}: {ticks} samples without the broker",
            )
            run.outage_ticks_s = time.monotonic() - went
            run.dropped_during_outage = run.publisher.outbox.dropped
        figures["broker_down_s"] = round(time.monotonic() - went, 1)
        big = runs["big"].publisher
        figures["buffered_bytes_big"] = big.outbox.size_bytes  # waiting and in flight

        up = time.monotonic()
        statuses = {s.name: s for s in manager.up(isolated)}
        assert statuses["kafka"].state == "up"
        assert statuses["kafka"].pid not in (None, old_pid)
        figures["broker_restart_s"] = round(time.monotonic() - up, 1)
        acked = {r.node: r.publisher.stats.sent for r in both}
        wait_for(
            lambda: all(r.publisher.stats.sent > acked[r.node] for r in both),
            60,
            "an ack each after Kafka is back",
        )
        figures["first_ack_after_up_s"] = round(time.monotonic() - up, 1)
        wait_for(
            lambda: len(big.outbox) == 0 and big.in_flight_bytes == 0, 60, "the big buffer to drain"
        )
        figures["drained_after_up_s"] = round(time.monotonic() - up, 1)
        at_back = {r.node: r.agent.seq for r in both}
        wait_for(lambda: all(r.agent.seq >= at_back[r.node] + 20 for r in both), 30, "20 ticks")
    finally:
        for run in runs.values():
            run.stop.set()
        for run in runs.values():
            run.loop.join(timeout=10)
            run.publisher.stop(timeout_s=60)
    wait_for(
        lambda: not set(threading.enumerate()) - threads_before, 10, "the agents' threads to end"
    )
    for run in runs.values():
        assert len(run.publisher.outbox) == 0
        assert run.publisher.in_flight_bytes == 0
        records = consume_all(run.settings, run.topic)
        assert {r.key for r in records} == {run.node.encode()}
        assert len({r.partition for r in records}) == 1
        run.seqs = tuple(NVML_SAMPLES.decode(r.value).seq for r in records)
    return runs


@pytest.fixture(scope="module")
def outage(isolated: Settings) -> dict[str, Run]:
    """Two agents, one with a big buffer and one with a tiny one, through one Kafka outage."""
    return ride_out_outage(isolated, OUTAGE_TICKS)


def test_a_big_buffer_rides_out_the_outage_without_loss(outage: dict[str, Run]) -> None:
    got = outage["big"]

    # Sampling never waited for the broker: 50 ticks took about 5 s (not 0.5 s of
    # max_block_ms each, and not "until Kafka is back", which never came before them).
    assert got.outage_ticks_s < 12.0
    total = got.agent.seq
    assert total >= 10 + OUTAGE_TICKS + 20
    assert got.seqs == tuple(range(total))  # every seq once, in order
    assert got.publisher.outbox.dropped == 0
    assert got.publisher.stats.failed == 0
    assert got.publisher.stats.sent == total
    assert got.agent.stats.ticks == total


def test_a_tiny_buffer_drops_the_oldest_and_counts_exactly_what_is_missing(
    outage: dict[str, Run],
) -> None:
    got = outage["tiny"]

    assert got.outage_ticks_s < 12.0
    total = got.agent.seq
    assert got.dropped_during_outage > 0
    seqs = got.seqs
    assert list(seqs) == sorted(set(seqs)), "out of order or duplicated"
    missing = set(range(total)) - set(seqs)
    assert len(missing) == got.publisher.outbox.dropped
    assert min(missing) >= got.at_outage - 5  # only what waited when Kafka went: 3 at most
    assert seqs[-1] == total - 1  # what was sampled after the outage all arrived
    assert got.publisher.stats.failed == 0
    assert got.publisher.stats.sent == len(seqs)


def test_with_no_broker_at_start_the_sender_blocks_briefly_and_stop_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No stack needed: a port nobody listens on is a broker that is away."""
    (port,) = _free_ports(1)
    kafka = load_settings().kafka.model_copy(update={"bootstrap": f"127.0.0.1:{port}"})
    sender = KafkaSender(kafka, "gwtest.nvml.samples", client_id="gwtest-agent")
    publisher = Publisher(sender, max_buffer_bytes=1 << 20)
    publisher.start()
    try:
        started = time.monotonic()
        for n in range(20):
            publisher.publish(b"node", b"%d" % n)
        assert time.monotonic() - started < 0.5
        # The client's constructor gives up within its bootstrap timeout, not 30 s.
        took = wait_for(lambda: publisher.stats.blocked >= 1, 15, "the client to give up")
        assert took < 10
        assert publisher.stats.sent == publisher.stats.failed == 0
    finally:
        stopping = time.monotonic()
        publisher.stop(timeout_s=0.1)  # while the thread waits to retry: it ends at once
    assert time.monotonic() - stopping < 2.0
    # A retry may still sit in the client's constructor; it gives up and ends soon.
    wait_for(lambda: not is_publishing(), 10, "the sender thread to end")
    assert [e.value for e in publisher.outbox.take(1 << 20)] == [b"%d" % n for n in range(20)]
    warned = [r for r in caplog.records if r.getMessage().startswith("kafka unreachable")]
    assert len(warned) == 1  # once per outage, not once per retry


def is_publishing() -> bool:
    return any(t.name == "gpuwatch-publisher" for t in threading.enumerate())
