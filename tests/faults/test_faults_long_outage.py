"""Node agents (`gpuwatch node-agent` processes) through a broker frozen for longer than
their delivery timeout: every sample arrives, in order, and SIGTERM still stops them.

A delivery timeout of 12 s stands in for the default 600 s, and a broker frozen (SIGSTOP)
for 30 s for an outage of half an hour: the Kafka client gives up what it holds long
before the broker answers again. The broker is the isolated one of
tests/integration/agent/test_agent_broker_outage.py (a Kafka of this module alone), never
the shared one. Asserted: each node's samples all reach the topic, first copies in `seq`
order (a copy the frozen broker wrote before its acknowledgement was lost may come again:
the worker drops such a redelivery); the agents go on publishing afterwards; counted as
sent again (`retried`), nothing dropped or lost; and SIGTERM, with the broker frozen
again, stops each agent within its stop timeout, what was not acknowledged counted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import free_port
from test_agent_broker_outage import (
    SOCKET_LEFT_BY_KAFKA,
    collect_sockets_left_by_kafka,
    isolated,
    wait_for,
)
from test_agent_sim_kafka import metric, scrape
from topic_io import consume_all

from gpuwatch.harness.stack import processes
from gpuwatch.harness.stack.service import StackPaths
from gpuwatch.kafka import create_topics
from gpuwatch.run.agent import STOP_SAMPLES_S
from schemas import NVML_SAMPLES
from schemas.settings import Settings

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(f"ignore:{SOCKET_LEFT_BY_KAFKA}:ResourceWarning"),
]

__all__ = ["collect_sockets_left_by_kafka", "isolated"]  # fixtures, used by name

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
NODES = 2
INTERVAL_S = 0.2
# Stands in for 600 s; kafka-python's client refuses one under its 10 s request timeout.
DELIVERY_TIMEOUT_S = 12
FROZEN_S = 30  # two and a half delivery timeouts: the client gives its messages up twice
STOP_WITHIN_S = STOP_SAMPLES_S + 5  # its publisher's stop, plus the process's own start/end
STOPPED = re.compile(
    r"node agent stopped node=(\S+) samples=(\d+) sent=(\d+) dropped=(\d+) lost=(\d+) "
    r"undelivered=(\d+) retried=(\d+)"
)


@dataclass
class Agent:
    """One `gpuwatch node-agent` process and where it reports."""

    node: str
    process: subprocess.Popen[str]
    metrics_port: int
    log: Path

    def figure(self, name: str) -> float:
        return metric(scrape(self.metrics_port), f"gpuwatch_agent_{name}", self.node) or 0.0

    def stopped(self) -> dict[str, int]:
        found = STOPPED.search(self.log.read_text())
        assert found is not None, self.log.read_text()[-3000:]
        names = ("samples", "sent", "dropped", "lost", "undelivered", "retried")
        return dict(zip(names, (int(g) for g in found.groups()[1:]), strict=True))


@contextmanager
def agents(settings: Settings, tmp_path: Path) -> Iterator[list[Agent]]:
    """NODES agents on simulated GPUs, sampling into `settings`' topics; killed on the way
    out if a failed test left them running."""
    started: list[Agent] = []
    with ExitStack() as stack:
        for n in range(NODES):
            node = f"gwtest-long-{n}-{uuid.uuid4().hex[:6]}"
            port = free_port()
            log = tmp_path / f"{node}.log"
            env = {
                **os.environ,
                "GPUWATCH_TOPIC_PREFIX": settings.kafka.topic_prefix,
                "GPUWATCH_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
                "GPUWATCH_AGENT_METRICS_PORT": str(port),
                "GPUWATCH_NODE_NAME": node,
                "GPUWATCH_AGENT_DELIVERY_TIMEOUT_S": str(DELIVERY_TIMEOUT_S),
            }
            argv = [str(GPUWATCH), "node-agent", "--backend", "sim", "--sim-gpus", "2"]
            argv += ["--interval", str(INTERVAL_S)]
            out = stack.enter_context(log.open("w", encoding="utf-8"))
            process = subprocess.Popen(argv, env=env, stdout=out, stderr=out, text=True)
            stack.callback(_kill, process)
            started.append(Agent(node, process, port, log))
        yield started


def _kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


@contextmanager
def frozen(settings: Settings) -> Iterator[None]:
    """The isolated broker stopped (SIGSTOP) for the block, continued whatever happens."""
    root = StackPaths.of(settings.stack.state_dir).root
    pid = processes.read_pid(StackPaths.of(settings.stack.state_dir).pid_file("kafka"))
    assert pid is not None
    assert processes.is_ours(pid, root)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def terminate(agent: Agent) -> float:
    """SIGTERM `agent`; the seconds it took to exit (it must exit 0)."""
    started = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(timeout=60) == 0, agent.log.read_text()[-3000:]
    return time.monotonic() - started


def first_copies(seqs: list[int]) -> tuple[list[int], int]:
    """The seqs in arrival order without repeats of one already seen, and how many repeats."""
    seen: set[int] = set()
    firsts: list[int] = []
    for seq in seqs:
        if seq not in seen:
            seen.add(seq)
            firsts.append(seq)
    return firsts, len(seqs) - len(firsts)


def all_acked(group: list[Agent], at_least: Callable[[Agent], float]) -> Callable[[], bool]:
    return lambda: all(a.figure("sent_total") >= at_least(a) for a in group)


def test_agents_deliver_every_sample_after_an_outage_longer_than_their_delivery_timeout(
    isolated: Settings, tmp_path: Path
) -> None:
    prefix = f"gwtest-{uuid.uuid4().hex[:10]}."
    scoped = isolated.model_copy(
        update={"kafka": isolated.kafka.model_copy(update={"topic_prefix": prefix})}
    )
    assert all(row.ok for row in create_topics(scoped))
    figures: dict[str, float | int] = {
        "frozen_s": FROZEN_S,
        "delivery_timeout_s": DELIVERY_TIMEOUT_S,
    }
    with agents(scoped, tmp_path) as group:
        wait_for(all_acked(group, lambda _a: 10), 60, "10 samples acknowledged each")
        with frozen(scoped):
            went = {a.node: a.figure("samples_total") for a in group}
            time.sleep(FROZEN_S)  # the outage itself: nothing to poll for
            during = {a.node: a.figure("samples_total") - went[a.node] for a in group}
        back = time.monotonic()
        at_back = {a.node: a.figure("samples_total") for a in group}
        wait_for(all_acked(group, lambda a: at_back[a.node]), 90, "the outage's samples")
        figures["outage_acked_after_s"] = round(time.monotonic() - back, 1)
        # And the agents go on: 10 s more sampled and acknowledged.
        wait_for(all_acked(group, lambda a: at_back[a.node] + 50), 60, "10 s more samples")
        retried = {a.node: a.figure("retried_total") for a in group}

        with frozen(scoped):  # SIGTERM while the broker does not answer
            time.sleep(1)
            took = [terminate(a) for a in group]
    figures["stop_while_frozen_s"] = round(max(took), 1)

    stopped = {a.node: a.stopped() for a in group}
    records = consume_all(scoped, NVML_SAMPLES.full_name(prefix))
    repeats = 0
    for agent in group:
        got = stopped[agent.node]
        # Sampling went on through the outage (about FROZEN_S / INTERVAL_S samples).
        assert during[agent.node] >= FROZEN_S / INTERVAL_S / 2, during
        assert retried[agent.node] > 0  # the client gave its messages up; they went again
        assert (got["dropped"], got["lost"]) == (0, 0), got
        assert got["sent"] + got["undelivered"] == got["samples"], got
        mine = [r for r in records if r.key == agent.node.encode()]
        assert len({r.partition for r in mine}) == 1
        firsts, again = first_copies([NVML_SAMPLES.decode(r.value).seq for r in mine])
        repeats += again
        # Every acknowledged seq arrived, first copies in order; of what was not
        # acknowledged at the stop, the frozen broker may have written some.
        assert firsts == list(range(len(firsts))), firsts[:50]
        assert got["sent"] <= len(firsts) <= got["samples"], (got, len(firsts))
        assert got["sent"] >= at_back[agent.node] + 50
    for seconds in took:
        assert seconds < STOP_WITHIN_S, took
    figures |= {
        "samples": sum(s["samples"] for s in stopped.values()),
        "retried": sum(s["retried"] for s in stopped.values()),
        "undelivered_at_stop": sum(s["undelivered"] for s in stopped.values()),
        "repeated_copies": repeats,
    }
    print("FIGURES long_outage", json.dumps(figures))
