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

import pytest
from test_agent_broker_outage import (
    INTERVAL_S,
    SOCKET_LEFT_BY_KAFKA,
    collect_sockets_left_by_kafka,
    isolated,
    ride_out_outage,
)

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
    runs = ride_out_outage(isolated, OUTAGE_TICKS, figures)
    both = list(runs.values())

    for run in both:
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
