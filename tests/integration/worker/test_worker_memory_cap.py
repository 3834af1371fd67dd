"""A worker far behind on uneven partitions: a day of history, aligned, under a memory cap.

Behind a backlog the pod side holds, in memory, the usage of every node partition ahead of
the slowest one; watermark alignment (`streams/core/alignment.py`) pauses the partitions
that run ahead. Here partition 0 holds twenty nodes of one GPU and every other partition
one node of eight: read evenly by bytes, the others would run through the day while
partition 0 is a few hours in, so alignment pauses and resumes them all the way. The
worker starts on empty topics; once it is in its group its address space is capped
(`RLIMIT_AS` through `prlimit`, the nearest to a cgroup limit an unprivileged test has: a
cgroup limit counts resident memory, this one every mapping, so the cap sits on top of
what the idle worker has mapped), and the day is produced at once. It must work all of it
off without leaving (an allocation refused is a `MemoryError`), every pod adding up to its
samples (`complete`): pausing and resuming loses and doubles nothing.

At this size the usage held without alignment is small (about 250 MB over idle against
about 180 MB aligned): the cap is the bound BENCHMARKS.md states, not a line the old code
crossed; a day of 1,000 GPUs (`gpuwatch bench --only-backlog`) is where they part.
"""

from __future__ import annotations

import json
import re
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from backlog_runs import HOUR_MS, complete, messages
from histories import History, long_history
from kafka.partitioner.default import murmur2
from topic_io import NewScope, topic_scopes
from worker_fixtures import StartWorker, group_members, produce, wait_for

from schemas.settings import Settings

pytestmark = pytest.mark.integration

MB = 1 << 20
PARTITIONS = 12
CAP_MB = 300
"""Address space the worker may map beyond what it had idle: the bound BENCHMARKS.md
states for working off a backlog (peak memory over idle)."""


def _status(pid: int, field: str) -> int:
    """A `VmSize`/`VmRSS`/`VmHWM` line of /proc/<pid>/status, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


SLOW_NODES = 20


def _on(history: History, wanted: Callable[[int], int]) -> History:
    """`history` with `wanted(partition)` of its nodes on each partition, and their pods."""
    chosen: dict[int, list[str]] = {}
    for node in history.nodes:
        partition = (murmur2(node.name.encode()) & 0x7FFFFFFF) % PARTITIONS
        if len(chosen.setdefault(partition, [])) < wanted(partition):
            chosen[partition].append(node.name)
    names = {name for names in chosen.values() for name in names}
    assert len(names) == sum(wanted(p) for p in range(PARTITIONS))
    return replace(
        history,
        nodes=tuple(n for n in history.nodes if n.name in names),
        pods=tuple(p for p in history.pods if p.node in names),
        _memo={},
    )


def history() -> History:
    """A day sampled every 57 s: partition 0 holds SLOW_NODES nodes of one GPU, every other
    partition one node of 8. Read evenly by bytes, the others run through the day while
    partition 0 is a few hours in: the pod side holds the rest of their day, unaligned."""
    t0 = (int(time.time() * 1000) - 25 * HOUR_MS) // 60_000 * 60_000
    day = {"hours": 24, "interval_ms": 57_000}
    slow = _on(
        long_history(t0, nodes=400, gpus=1, seed=371, **day),
        lambda p: SLOW_NODES if p == 0 else 0,
    )
    fast = _on(long_history(t0, nodes=160, gpus=8, seed=372, **day), lambda p: int(p != 0))
    return replace(fast, nodes=slow.nodes + fast.nodes, pods=slow.pods + fast.pods, _memo={})


@pytest.fixture
def scope12(stack: Settings) -> Iterator[NewScope]:
    with topic_scopes(stack, partitions=PARTITIONS) as scope:
        yield scope


def test_a_day_behind_on_uneven_partitions_adds_up_and_stays_under_a_memory_cap(
    scope12: NewScope, start_worker: StartWorker
) -> None:
    day = history()
    backlog = scope12()
    # Two malloc arenas, as the image sets: each thread's own arena would map 64 MB of
    # address space that it never touches.
    worker = start_worker(backlog, env={"MALLOC_ARENA_MAX": "2"})
    pid = worker.process.pid
    wait_for("the worker in its group", lambda: group_members(backlog) == 1, worker, 60.0)
    time.sleep(3.0)
    idle_size, idle_rss = _status(pid, "VmSize"), _status(pid, "VmRSS")
    cap = idle_size + CAP_MB * MB
    resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
    started = time.monotonic()
    produce(backlog, messages(backlog, day))
    complete(backlog, day, worker)
    took = time.monotonic() - started
    figures = {
        "gpus": sum(node.gpus for node in day.nodes),
        "pods": len(day.pods),
        "idle_vm_mb": idle_size // MB,
        "idle_rss_mb": idle_rss // MB,
        "peak_rss_over_idle_mb": (_status(pid, "VmHWM") - idle_rss) // MB,
        "vm_over_idle_mb": (_status(pid, "VmSize") - idle_size) // MB,
        "worked_off_s": round(took, 1),
    }
    print("FIGURES memory", json.dumps(figures))
    assert worker.process.poll() is None, worker.log  # never left: worked off in place
    worker.stop()
    counters = worker.counters()
    assert counters["late"] == 0
    assert counters["deadletter"] == 0
    assert "MemoryError" not in worker.log
    assert re.search(r"alignment paused=\[\d", worker.log), "no partition was ever paused"
