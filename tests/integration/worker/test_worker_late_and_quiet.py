"""Late and missing data on the real broker, with one `gpuwatch worker` (SEMANTICS.md, Time).

- A node whose agent is cut off from Kafka for two minutes, then sends its buffer: every
  pod's and GPU's allocated seconds (newest revision of each window) equal its samples'.
- A fleet that goes silent: NodeTelemetryMissing fires for every node within its threshold
  plus 30 s of wall time, and a queued pod deleted after the last sample is finished.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from backlog_runs import complete, totals
from histories import History, NodePlan, PodPlan, WaitPlan, pod_uid, sent
from topic_io import consume_all, topic_scopes
from worker_fixtures import S, StartWorker, group_members, wait_for

from gpuwatch import kafka
from schemas import ALERTS, ATTRIBUTION, GPU_WINDOWS, K8S_PODS, NVML_SAMPLES, POD_LIFECYCLE
from schemas.settings import Settings

pytestmark = pytest.mark.integration

WINDOW_MS = 60 * S


def names(settings: Settings) -> dict[str, str]:
    prefix = settings.kafka.topic_prefix
    return {spec.name: spec.full_name(prefix) for spec in (K8S_PODS, NVML_SAMPLES)}


def pod_on(node: NodePlan, n: int, end_ms: int) -> PodPlan:
    """A pod holding the node's GPU from the start to `end_ms`, busy throughout."""
    return PodPlan(
        uid=pod_uid(35, n),
        node=node.name,
        gpu=0,
        created_ms=0,
        start_ms=0,
        end_ms=end_ms,
        finish="Succeeded",
        deleted_after_ms=None,
        steps_per_s=None,
    )


def gpu_seconds(history: History) -> dict[str, float]:
    """Allocated seconds per GPU, from the samples' JSON."""
    out: dict[str, float] = {}
    for sample in history.samples():
        for alloc in sample["allocations"]:
            for uuid in alloc["device_ids"]:
                out[uuid] = out.get(uuid, 0.0) + sample["interval_ms"] / S
    return out


def newest_gpu_windows(settings: Settings) -> dict[tuple[str, int], dict[str, Any]]:
    """Each GPU window at its newest revision (the later of two equal ones)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for record in consume_all(settings, GPU_WINDOWS.full_name(settings.kafka.topic_prefix)):
        w = json.loads(record.value)
        key = (w["uuid"], w["window_start"])
        if key not in out or w.get("revision", 0) >= out[key].get("revision", 0):
            out[key] = w
    return out


def test_a_node_cut_off_for_two_minutes_then_flushing_its_buffer_loses_nothing(
    stack: Settings, start_worker: StartWorker
) -> None:
    """Two nodes on one partition, a pod on each holding its GPU; one agent cut off from
    Kafka from 30 s to 150 s, its 120 samples sent together then, as the worker runs."""
    t0 = (int(time.time() * 1000) - 20 * 60 * S) // WINDOW_MS * WINDOW_MS  # history, not live
    nodes = (NodePlan("gwlate-a", 1, 1_000), NodePlan("gwlate-b", 1, 1_000))
    pods = tuple(pod_on(node, i, 200 * S) for i, node in enumerate(nodes))
    history = History(t0, 300 * S, nodes, pods, ())
    order = sent(history.inputs(), {b"gwlate-b": (t0 + 30 * S, t0 + 150 * S)})
    with topic_scopes(stack, partitions=1) as scope:
        settings = scope()
        worker = start_worker(settings)
        topics = names(settings)
        producer = kafka.producer(settings.kafka, acks="all", linger_ms=0)
        try:
            # 10 s of event time at a time, each acknowledged before the next, as the
            # agents publish live: the windows of the cut-off close before its buffer comes.
            step = 10 * S
            i = 0
            for until in range(t0 + step, t0 + history.duration_ms + step, step):
                while i < len(order) and order[i][0] < until:
                    message = order[i][1]
                    producer.send(topics[message.spec.name], key=message.key, value=message.value)
                    i += 1
                producer.flush(timeout=30)
                time.sleep(0.25)
        finally:
            producer.close()
        complete(settings, history, worker)
        want = gpu_seconds(history)

        def gpus_add_up() -> bool:
            got: dict[str, float] = {}
            for w in newest_gpu_windows(settings).values():
                got[w["uuid"]] = got.get(w["uuid"], 0.0) + w["allocated_seconds"]
            return set(got) >= set(want) and all(
                abs(got[uuid] - seconds) < 1e-6 for uuid, seconds in want.items()
            )

        wait_for("every GPU's windows to add up to its samples", gpus_add_up, worker)
        windows = newest_gpu_windows(settings)
        revised = sorted(
            (w["node"], (w["window_start"] - t0) // S, w.get("revision", 0), w["allocated_seconds"])
            for w in windows.values()
            if w.get("revision", 0) > 0
        )
        print("FIGURES revised gpu windows", revised)
        assert revised, "the cut-off node's windows were emitted again"
        per_pod = totals(settings)
        print("FIGURES pods", {uid[:13]: v for uid, v in per_pod.items()})
        # The cut-off node's pod, window by window, at the newest revision of each.
        newest: dict[int, dict[str, Any]] = {}
        topic = ATTRIBUTION.full_name(settings.kafka.topic_prefix)
        for record in consume_all(settings, topic):
            a = json.loads(record.value)
            start = (a["window_start"] - t0) // S
            if a["uid"] == pods[1].uid and a.get("revision", 0) >= newest.get(start, a).get(
                "revision", 0
            ):
                newest[start] = a
        by_window = [
            (s, newest[s].get("revision", 0), newest[s]["allocated_gpu_seconds"])
            for s in sorted(newest)
        ]
        print("FIGURES cut-off pod's windows (start s, revision, allocated s)", by_window)
        assert [seconds for _, _, seconds in by_window] == [60.0, 60.0, 60.0, 20.0]
        assert any(revision > 0 for _, revision, _ in by_window)
        worker.stop()
        counters = worker.counters()
        print("FIGURES counters", counters)
        assert counters["late"] == 0, counters


def produce_live(
    settings: Settings, history: History, stop_after_s: float, done: threading.Event
) -> threading.Thread:
    """Produce the history's inputs as their times come by the wall clock (a sample once it
    has ended, as an agent publishes it), until `stop_after_s` after t0."""
    topics = names(settings)
    inputs = [m for m in history.inputs() if m.ts < history.t0 + stop_after_s * S]

    def run() -> None:
        producer = kafka.producer(settings.kafka, acks="all", linger_ms=0)
        try:
            for message in inputs:
                at = message.ts + (S if message.spec.name == NVML_SAMPLES.name else 0)
                while time.time() * 1000 < at:
                    time.sleep(0.05)
                producer.send(topics[message.spec.name], key=message.key, value=message.value)
                producer.flush(timeout=30)
        finally:
            producer.close()
            done.set()

    thread = threading.Thread(target=run, name="live-producer", daemon=True)
    thread.start()
    return thread


def test_a_fleet_gone_silent_is_seen_missing_and_queued_work_deleted_after_finishes(
    stack: Settings, start_worker: StartWorker
) -> None:
    """Three nodes on two partitions sample live at 1 Hz for 20 s, then every agent stops.
    A pod queued (Unschedulable) from the start is deleted 5 s after the last sample."""
    with topic_scopes(stack, partitions=2) as scope:
        settings = scope()
        worker = start_worker(settings)
        # Its group formed: the data below is read live.
        wait_for("the worker's group", lambda: group_members(settings) >= 1, worker, 60)
        t0 = int(time.time() * 1000) // S * S + 2 * S
        nodes = tuple(NodePlan(f"gwquiet-{i}", 1, 1_000) for i in range(3))
        pods = (pod_on(nodes[0], 0, 60 * S),)
        queued = WaitPlan(uid=pod_uid(35, 9), created_ms=0, gpus=8, gone_ms=25 * S)
        history = History(t0, 60 * S, nodes, pods, (), waiting=(queued,))
        done = threading.Event()
        producer = produce_live(settings, history, stop_after_s=26, done=done)
        producer.join(timeout=60)
        assert done.is_set()
        last_end = t0 + 20 * S  # the agents' last samples end at 20 s
        seen: dict[str, float] = {}

        def all_missing() -> bool:
            for record in consume_all(settings, ALERTS.full_name(settings.kafka.topic_prefix)):
                alert = json.loads(record.value)
                node = alert["subject"].get("node")
                if alert["name"] == "NodeTelemetryMissing" and alert["status"] == "firing":
                    seen.setdefault(node, time.time())
            return {n.name for n in nodes} <= set(seen)

        wait_for("NodeTelemetryMissing for every node", all_missing, worker, timeout_s=90)
        after = {node: round(at - last_end / S, 1) for node, at in sorted(seen.items())}
        print("FIGURES NodeTelemetryMissing seen s after the last sample's end", after)
        threshold_s = 30  # GPUWATCH_TELEMETRY_MISSING_AFTER_S
        assert all(s <= threshold_s + 30 for s in after.values()), after

        def finished() -> list[dict[str, Any]]:
            topic = POD_LIFECYCLE.full_name(settings.kafka.topic_prefix)
            changes = [json.loads(r.value) for r in consume_all(settings, topic)]
            return [c for c in changes if c["uid"] == queued.uid and c["to_state"] == "finished"]

        (change,) = wait_for("the queued pod deleted after the last sample", finished, worker)
        print(
            "FIGURES queued pod", change["from_state"], "->", change["to_state"], change["reason"]
        )
        assert change["from_state"] == "queued"
        assert change["ts"] == t0 + 25 * S
