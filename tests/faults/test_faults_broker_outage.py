"""The broker stopped for 60 s while two node agents sample: nothing in the buffer is lost.

The node agent's own outage test (tests/integration/agent/test_agent_broker_outage.py)
stops the broker for about 5 s; this one for a minute, on the same isolated stack (a
Kafka of this module alone, so the shared one is never touched), with its helpers. One
agent has a buffer that holds the minute, one a buffer of three samples. Asserted: sampling
never waits for the broker; the big buffer delivers every `seq` exactly once, in order;
the tiny one delivers what it kept, in order, and counts exactly what it dropped.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from test_agent_broker_outage import (
    INTERVAL_S,
    SOCKET_LEFT_BY_KAFKA,
    Run,
    collect_sockets_left_by_kafka,
    isolated,
    sample_bytes,
    start_agent,
    stop_kafka,
    ticked,
    wait_for,
)
from topic_io import consume_all

from gpuwatch.stack import manager
from schemas import NVML_SAMPLES
from schemas.settings import Settings

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(f"ignore:{SOCKET_LEFT_BY_KAFKA}:ResourceWarning"),
]

__all__ = ["collect_sockets_left_by_kafka", "isolated"]  # fixtures, used by name

OUTAGE_S = 60
OUTAGE_TICKS = round(OUTAGE_S / INTERVAL_S)  # the outage lasts this many samples: a minute


def test_a_minute_without_the_broker_loses_nothing_the_buffer_holds(isolated: Settings) -> None:
    figures: dict[str, float | int] = {"outage_ticks": OUTAGE_TICKS}
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
            target = run.at_outage + OUTAGE_TICKS
            wait_for(ticked(run, target), OUTAGE_S + 30, f"{run.node}: a minute of samples")
            run.outage_ticks_s = time.monotonic() - went
            run.dropped_during_outage = run.publisher.outbox.dropped
        figures["broker_down_s"] = round(time.monotonic() - went, 1)
        big_pub = runs["big"].publisher
        figures["buffered_bytes_big"] = big_pub.outbox.size_bytes + big_pub.in_flight_bytes

        up = time.monotonic()
        statuses = {s.name: s for s in manager.up(isolated)}
        assert statuses["kafka"].state == "up"
        assert statuses["kafka"].pid not in (None, old_pid)
        figures["broker_restart_s"] = round(time.monotonic() - up, 1)
        acked = {r.node: r.publisher.stats.sent for r in both}
        wait_for(
            lambda: all(r.publisher.stats.sent > acked[r.node] for r in both),
            60,
            "an ack each after the broker is back",
        )
        figures["first_ack_after_up_s"] = round(time.monotonic() - up, 1)
        big = runs["big"]
        wait_for(
            lambda: len(big.publisher.outbox) == 0 and big.publisher.in_flight_bytes == 0,
            60,
            "the big buffer to drain",
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
    wait_for(lambda: not set(threading.enumerate()) - threads_before, 10, "the agents' threads")

    for run in both:
        assert len(run.publisher.outbox) == 0
        assert run.publisher.in_flight_bytes == 0
        records = consume_all(run.settings, run.topic)
        assert {r.key for r in records} == {run.node.encode()}
        run.seqs = tuple(NVML_SAMPLES.decode(r.value).seq for r in records)
        # Sampling never waited for the broker: a minute of ticks took about a minute.
        assert run.outage_ticks_s < OUTAGE_S * 1.25, run.outage_ticks_s
        assert run.publisher.stats.failed == 0

    big, tiny = runs["big"], runs["tiny"]
    assert big.seqs == tuple(range(big.agent.seq))  # every seq once, in order
    assert big.publisher.outbox.dropped == 0
    assert big.publisher.stats.sent == big.agent.seq

    missing = set(range(tiny.agent.seq)) - set(tiny.seqs)
    assert list(tiny.seqs) == sorted(set(tiny.seqs)), "out of order or duplicated"
    assert len(missing) == tiny.publisher.outbox.dropped > OUTAGE_TICKS - 10
    assert min(missing) >= tiny.at_outage - 5  # only what waited when the broker went
    assert tiny.seqs[-1] == tiny.agent.seq - 1  # what was sampled after it all arrived
    figures |= {
        "big_delivered": len(big.seqs),
        "tiny_delivered": len(tiny.seqs),
        "tiny_dropped_counted": tiny.publisher.outbox.dropped,
    }
    print("FIGURES broker", json.dumps(figures))
