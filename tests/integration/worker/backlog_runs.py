"""A long generated history through `gpuwatch worker`: produced paced or as a backlog.

Helpers of `test_worker_backlog.py` and the replay tests: the history (`histories.py`),
its messages, producing them all at once or paced while a worker runs, waiting until every
pod's attribution adds up to its samples, and the derived records by identity.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from histories import History, long_history
from kafka import TopicPartition
from support import WaitTimeoutError, wait_until
from topic_io import consume_all
from worker_fixtures import Message, Worker

from gpuwatch import kafka
from schemas import ALERTS, ATTRIBUTION, GPU_WINDOWS, K8S_PODS, NVML_SAMPLES, POD_LIFECYCLE
from schemas.settings import Settings

S = 1000
DONE_S = 240.0  # a 12-hour backlog takes 20-40 s on this machine; room for a busy hour
HOUR_MS = 3_600_000
PARTITIONS = 12
IDENTITY: dict[str, tuple[Any, Callable[[dict[str, Any]], tuple[Any, ...]]]] = {
    "pod.lifecycle": (POD_LIFECYCLE, lambda c: (c["uid"], c["ts"], c["to_state"])),
    "alerts": (ALERTS, lambda a: (a["fingerprint"], a["status"], a["ts"])),
    "attribution": (ATTRIBUTION, lambda a: (a["uid"], a["window_start"])),
    "gpu.windows": (GPU_WINDOWS, lambda w: (w["uuid"], w["window_start"])),
}


def twelve_hours(seed: int) -> History:
    """12 hours of 10 nodes of 4 GPUs sampled every 57 s, a window start 13 hours ago."""
    t0 = (int(time.time() * 1000) - 13 * HOUR_MS) // 60_000 * 60_000
    return long_history(t0, hours=12, nodes=10, gpus=4, interval_ms=57_000, seed=seed)


def a_day(seed: int) -> History:
    """24 hours of 10 nodes of 4 GPUs sampled every 57 s (some 500 pods), from 25 hours ago."""
    t0 = (int(time.time() * 1000) - 25 * HOUR_MS) // 60_000 * 60_000
    return long_history(t0, hours=24, nodes=10, gpus=4, interval_ms=57_000, seed=seed)


def messages(settings: Settings, history: History) -> list[Message]:
    """The history's input messages, (topic, key, value, partition by key), in time order."""
    prefix = settings.kafka.topic_prefix
    names = {
        K8S_PODS.name: K8S_PODS.full_name(prefix),
        NVML_SAMPLES.name: NVML_SAMPLES.full_name(prefix),
    }
    return [(names[m.spec.name], m.key, m.value, None) for m in history.inputs()]


def produce_paced(
    settings: Settings, history: History, seconds: float, step_ms: int = 5_000
) -> threading.Thread:
    """Produce the history as it happens, over about `seconds`, in a thread (joined by the
    caller): `step_ms` of event time at a time, each acknowledged before the next is sent,
    as the agents and the watcher publish live (within a step the topics interleave as the
    client sends them, a few milliseconds, here shorter than the allowed lateness)."""
    batch = messages(settings, history)
    times = [m.ts for m in history.inputs()]

    def run() -> None:
        producer = kafka.producer(settings.kafka, acks="all", linger_ms=0)
        try:
            steps = max(1, history.duration_ms // step_ms)
            pause = seconds / steps
            i = 0
            for step in range(steps + 1):
                until = history.t0 + (step + 1) * step_ms
                sent = False
                while i < len(batch) and times[i] < until:
                    topic, key, value, _ = batch[i]
                    producer.send(topic, key=key, value=value)
                    i += 1
                    sent = True
                if sent:
                    producer.flush(timeout=30)
                time.sleep(pause)
            producer.flush(timeout=60)
        finally:
            producer.close()

    thread = threading.Thread(target=run, name="paced-producer")
    thread.start()
    return thread


def records(settings: Settings) -> dict[str, dict[tuple[Any, ...], list[str]]]:
    """Every derived record, as canonical JSON, grouped by topic and identity."""
    out: dict[str, dict[tuple[Any, ...], list[str]]] = {}
    for name, (spec, key) in IDENTITY.items():
        grouped: dict[tuple[Any, ...], list[str]] = {}
        for record in consume_all(settings, spec.full_name(settings.kafka.topic_prefix)):
            value = json.loads(record.value)
            grouped.setdefault(key(value), []).append(json.dumps(value, sort_keys=True))
        out[name] = grouped
    return out


def produced(settings: Settings, name: str) -> int:
    """How many records a derived topic holds now (its end offsets: no need to read them)."""
    topic = IDENTITY[name][0].full_name(settings.kafka.topic_prefix)
    consumer = kafka.consumer(settings.kafka, enable_auto_commit=False)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        consumer.close()
    return sum(ends.values())


def totals(settings: Settings) -> dict[str, tuple[float, float]]:
    """Per pod uid, (allocated, idle) GPU-seconds summed over its attribution records."""
    seen: dict[tuple[str, int], tuple[float, float]] = {}
    for record in consume_all(settings, ATTRIBUTION.full_name(settings.kafka.topic_prefix)):
        a = json.loads(record.value)
        seen[(a["uid"], a["window_start"])] = (a["allocated_gpu_seconds"], a["idle_gpu_seconds"])
    out: dict[str, tuple[float, float]] = {}
    for (uid, _), (allocated, idle) in seen.items():
        before = out.get(uid, (0.0, 0.0))
        out[uid] = (before[0] + allocated, before[1] + idle)
    return out


def mismatches(
    got: dict[str, tuple[float, float]], want: dict[str, tuple[float, float]]
) -> list[str]:
    """Pods whose allocated or idle seconds differ from the samples' by more than 1e-6."""
    out = []
    for uid, (allocated, idle) in sorted(want.items()):
        have = got.get(uid, (0.0, 0.0))
        if abs(have[0] - allocated) > 1e-6 or abs(have[1] - idle) > 1e-6:
            out.append(f"{uid}: {have} != {(allocated, idle)}")
    return out


def complete(settings: Settings, history: History, worker: Worker) -> dict[str, Any]:
    """Wait until every pod's attribution adds up to its samples; the records then.

    On failure the message says which it was: a timeout (input left past the worker's
    commits; the worker's stacks, logged on SIGUSR1, say what it waited in) or a loss (all
    input read), with the worker's counters and every copy of the short pods' windows
    (`diagnosis`)."""
    want = history.expected()
    last: list[str] = []

    def added_up() -> bool:
        last[:] = mismatches(totals(settings), want)
        return not last

    def added_up_or_exited() -> bool:
        return added_up() or worker.process.poll() is not None

    try:
        wait_until(added_up_or_exited, timeout_s=DONE_S, what="pods adding up", interval_s=0.2)
    except WaitTimeoutError:
        # What each of its tasks and threads waits in, logged by Faust (mode) on SIGUSR1.
        worker.process.send_signal(signal.SIGUSR1)
        time.sleep(STACKS_S)
    if last:
        exited = worker.process.poll()
        short = [line.split(":", 1)[0] for line in last]
        detail = diagnosis(settings, history, worker, short)
        what = "pods do not add up" if exited is None else f"pods short, the worker exited {exited}"
        raise AssertionError(f"{len(last)} {what}: {last[:10]}\n{detail}")
    return records(settings)


INPUTS = (K8S_PODS, NVML_SAMPLES)
SHOWN_PODS = 5
STACKS_S = 2.0  # for the worker to log its stacks


def input_lag(settings: Settings) -> dict[str, int]:
    """Per input topic, the records past the worker group's committed offsets."""
    prefix = settings.kafka.topic_prefix
    admin = kafka.admin(settings.kafka)
    consumer = kafka.consumer(settings.kafka, enable_auto_commit=False)
    try:
        group = settings.kafka.app_id
        committed = admin.list_group_offsets({group: None}).get(group, {})
        out = {}
        for spec in INPUTS:
            topic = spec.full_name(prefix)
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            ends = consumer.end_offsets(tps)
            at = {tp: (committed[tp].offset if tp in committed else 0) for tp in tps}
            out[spec.name] = sum(max(0, ends[tp] - at[tp]) for tp in tps)
    finally:
        consumer.close()
        admin.close()
    return out


def copies(settings: Settings, uids: list[str]) -> dict[str, list[str]]:
    """Every attribution record of the pods, in topic order: (partition, offset) window,
    revision, allocated and idle seconds."""
    out: dict[str, list[str]] = {uid: [] for uid in uids}
    for record in consume_all(settings, ATTRIBUTION.full_name(settings.kafka.topic_prefix)):
        a = json.loads(record.value)
        if a["uid"] in out:
            out[a["uid"]].append(
                f"p{record.partition}@{record.offset} [{a['window_start']}, {a['window_end']})"
                f" rev {a.get('revision', 0)} alloc {a['allocated_gpu_seconds']:.3f}"
                f" idle {a['idle_gpu_seconds']:.3f}"
            )
    return out


def diagnosis(settings: Settings, history: History, worker: Worker, short: list[str]) -> str:
    """Timed out or lost: the input the worker left unread when it was stopped (it commits
    what it processed on SIGTERM), its counters and log tail, the newest window (the pod
    side's watermark at most) against the history's end, and the short pods' samples' span
    with every copy of their windows."""
    log = worker.stop()  # stopped already where the wait timed out
    lines = []
    try:
        lag = input_lag(settings)
        verdict = "TIMED OUT: input left unread" if any(lag.values()) else "LOST: all input read"
        lines.append(f"{verdict}; records past the worker's commits: {lag}")
        topic = ATTRIBUTION.full_name(settings.kafka.topic_prefix)
        ends = [json.loads(r.value)["window_end"] for r in consume_all(settings, topic)]
        lines.append(
            f"newest attribution window end {max(ends, default=None)};"
            f" history {history.t0} to {history.t0 + history.duration_ms}"
        )
        spans: dict[str, list[int]] = {}
        for sample in history.samples():
            for alloc in sample["allocations"]:
                spans.setdefault(alloc["pod_uid"], []).append(sample["ts"])
        for uid, kept in copies(settings, short[:SHOWN_PODS]).items():
            ts = spans.get(uid, [])
            lines.append(f"pod {uid}: samples {min(ts, default=None)} to {max(ts, default=None)}")
            lines.extend(f"  {line}" for line in kept)
    except Exception as exc:  # the diagnosis must not hide the failure it explains
        lines.append(f"(diagnosis failed: {exc!r})")
    found = [line for line in log.splitlines() if "worker stopped" in line]
    lines.append(f"worker: {found[-1] if found else 'no stop line'}; log tail:")
    tail = log.splitlines()
    start = next((i for i, line in enumerate(tail) if line.startswith("THREAD ")), None)
    lines.extend(tail[-20:] if start is None else tail[start - 20 :])  # the stacks whole
    return "\n".join(lines)
