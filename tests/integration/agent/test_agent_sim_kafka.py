"""`gpuwatch node-agent --backend sim` against the real broker: what lands in Kafka, /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from support import reaped

from schemas import NVML_SAMPLES
from schemas.settings import Settings

pytestmark = pytest.mark.integration

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
STOPPED = re.compile(
    r"node agent stopped node=(\S+) samples=(\d+) sent=(\d+) dropped=(\d+) lost=(\d+)"
)


def scrape(port: int) -> str | None:
    """The agent's /metrics page, or None while it does not answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return bytes(response.read()).decode()
    except OSError:
        return None


def metric(text: str | None, name: str, node: str) -> float | None:
    """One sample's value from the exposition text, None when it is not there."""
    if text is None:
        return None
    found = re.search(rf'^{name}{{node="{re.escape(node)}"}} (\S+)$', text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def test_the_sim_agent_publishes_valid_samples_in_order_and_serves_metrics(
    scoped: Settings,
    port: Callable[[], int],
    consume: Callable[[Settings, str], list[Any]],
    nvml_schema: Draft202012Validator,
) -> None:
    node = f"gwtest-node-{uuid.uuid4().hex[:8]}"
    metrics_port = port()
    env = {
        **os.environ,
        "GPUWATCH_TOPIC_PREFIX": scoped.kafka.topic_prefix,
        "GPUWATCH_KAFKA_BOOTSTRAP": scoped.kafka.bootstrap,
        "GPUWATCH_AGENT_METRICS_PORT": str(metrics_port),
        "GPUWATCH_NODE_NAME": node,
    }
    argv = [str(GPUWATCH), "node-agent", "--backend", "sim", "--sim-gpus", "4"]
    argv += ["--interval", "0.1", "--duration", "3"]
    agent = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with reaped(agent):
        # Scrape while it runs: the endpoint answers with samples counted.
        deadline = time.monotonic() + 15
        page = None
        while agent.poll() is None and time.monotonic() < deadline:
            page = scrape(metrics_port)
            if (metric(page, "gpuwatch_agent_samples_total", node) or 0) > 0:
                break
            time.sleep(0.05)
        assert agent.poll() is None, "the agent ended before /metrics showed a sample"
        assert (metric(page, "gpuwatch_agent_samples_total", node) or 0) > 0, page
        assert metric(page, "gpuwatch_agent_gpus", node) == 4.0
        assert metric(page, "gpuwatch_agent_dropped_total", node) == 0.0
        out, err = agent.communicate(timeout=30)
    assert agent.returncode == 0, err

    stopped = STOPPED.search(err)
    assert stopped is not None, err
    assert stopped.group(1) == node
    samples, sent, dropped, lost = (int(g) for g in stopped.groups()[1:])
    assert (sent, dropped, lost) == (samples, 0, 0)
    assert samples >= 10  # 3 s at 0.1 s: about 30, unless the machine is very busy

    records = consume(scoped, NVML_SAMPLES.full_name(scoped.kafka.topic_prefix))
    assert len(records) == samples
    assert {r.key for r in records} == {node.encode()}
    assert len({r.partition for r in records}) == 1  # keyed by node: one partition, in order
    decoded = []
    for record in records:
        errors = [e.message for e in nvml_schema.iter_errors(json.loads(record.value))]
        assert errors == [], f"offset {record.offset}: {errors}"
        decoded.append(NVML_SAMPLES.decode(record.value))
    assert [s.seq for s in decoded] == list(range(samples))
    assert {s.node for s in decoded} == {node}
    assert all(len(s.gpus) == 4 and len(s.allocations) == 4 for s in decoded)
    assert decoded[0].interval_ms == 100
    # Consecutive samples never overlap; on schedule they tile exactly.
    ends = [s.ts + s.interval_ms for s in decoded]
    assert all(nxt.ts >= end for nxt, end in zip(decoded[1:], ends, strict=False))
    tiled = sum(nxt.ts == end for nxt, end in zip(decoded[1:], ends, strict=False))
    assert tiled >= (samples - 1) // 2, [(s.ts, s.interval_ms) for s in decoded]
    assert out == ""
