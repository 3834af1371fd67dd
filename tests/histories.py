"""Generated cluster histories: node samples and pod events, with what the samples add up to.

A `History` is a plan (nodes with their sample interval, phase and silent spells; pods with
their node, GPU, life and idle spells) from which `inputs()` makes the `nvml.samples` and
`k8s.pods` messages in event-time order, and `expected()` works out from the samples alone
what each pod's attribution must sum to. Shaped like recorded production history: pods
whose GPUs vanish from the samples for a while, ADDED before a pod's first sample and
DELETED after its last, relists that re-send every live pod. The property tests draw plans
with hypothesis; the integration tests build one of many hours with `long_history`.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from schemas import K8S_NODES, K8S_PODS, NVML_SAMPLES, TopicSpec
from schemas.ids import GpuUuid, PodUid

S = 1000
MODEL = "NVIDIA H100 80GB HBM3"
MEM_TOTAL = 85_520_809_984  # an H100 80GB as NVML reports it
GIB = 2**30
BUSY_PCT = 80.0
IDLE_PCT = 0.0
SCRAPE_MS = 5_000  # how often a pod that reports units of work has them scraped


@dataclass(frozen=True)
class NodePlan:
    """A node: `gpus` GPUs sampled every `interval_ms` from `phase_ms` after t0."""

    name: str
    gpus: int
    interval_ms: int
    phase_ms: int = 0
    silent: tuple[tuple[int, int], ...] = ()
    """Spans `[start, end)` (ms after t0) in which the node sends nothing."""


@dataclass(frozen=True)
class PodPlan:
    """A pod on one GPU of a node: created, running from `start_ms`, finished at `end_ms`."""

    uid: str
    node: str
    gpu: int
    created_ms: int
    start_ms: int
    end_ms: int
    finish: str = "Succeeded"
    """Succeeded, Failed (OOMKilled) or Deleted (a DELETED while running)."""
    idle: tuple[tuple[int, int], ...] = ()
    """Spans in which the pod computes nothing (0 % on its GPU)."""
    vanished: tuple[tuple[int, int], ...] = ()
    """Spans in which its GPU is missing from the node's samples."""
    deleted_after_ms: int | None = 1_000
    """A DELETED this long after a Succeeded/Failed finish; None: none."""
    steps_per_s: float | None = None
    """Units of work a second it reports while running (scraped every `SCRAPE_MS` from
    its start); None: it reports none."""
    unit: str = "steps"
    """The name of its units of work."""

    def scrapes(self) -> Iterator[tuple[int, float]]:
        """(ms after t0, steps since the previous scrape) of each scrape while running."""
        if self.steps_per_s is None:
            return
        t = self.start_ms + SCRAPE_MS
        while t < self.end_ms:
            yield t, self.steps_per_s * SCRAPE_MS / S
            t += SCRAPE_MS


@dataclass(frozen=True)
class WaitPlan:
    """A pod that asks for `gpus` GPUs and is never bound: it waits from `created_ms` until
    it is deleted at `gone_ms` (None: not before the end)."""

    uid: str
    created_ms: int
    gpus: int
    gone_ms: int | None = None


class Input(NamedTuple):
    """One input message: its topic, key, value and event time."""

    spec: TopicSpec[Any]
    key: bytes
    value: bytes
    ts: int


@dataclass(frozen=True)
class History:
    """Nodes, pods and relists over `[t0, t0 + duration_ms)`."""

    t0: int
    duration_ms: int
    nodes: tuple[NodePlan, ...]
    pods: tuple[PodPlan, ...]
    relists_ms: tuple[int, ...] = ()
    cluster_seed: int = 0
    waiting: tuple[WaitPlan, ...] = ()
    node_events: bool = False
    """Whether each node is announced (k8s.nodes ADDED at t0, allocatable its GPUs)."""
    cordons: tuple[tuple[str, int, int], ...] = ()
    """(node, from, until) ms after t0: the node is cordoned meanwhile (k8s.nodes MODIFIED)."""
    xids: tuple[tuple[str, int, int, int], ...] = ()
    """(node, GPU index, ms after t0, code): the sample whose interval holds the time reports
    the Xid on that GPU."""
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def uuid(self, node: str, index: int) -> GpuUuid:
        """A GPU's uuid, stable for a node name and index."""
        digest = zlib.crc32(f"{node}/{index}".encode())
        return GpuUuid(f"GPU-{digest:08x}-0000-4000-8000-{index:012d}")

    def _holder(self, node: NodePlan, gpu: int, t: int) -> PodPlan | None:
        for pod in self.pods:
            if pod.node == node.name and pod.gpu == gpu and pod.start_ms <= t < pod.end_ms:
                return pod
        return None

    def sample_times(self, node: NodePlan) -> Iterator[int]:
        """Start of each sample of a node (ms after t0)."""
        t = node.phase_ms
        while t + node.interval_ms <= self.duration_ms:
            if not any(a <= t < b for a, b in node.silent):
                yield t
            t += node.interval_ms

    def samples(self) -> list[dict[str, Any]]:
        """Every node sample as a JSON-ready dict, by node then time."""
        out = []
        for node in self.nodes:
            for seq, t in enumerate(self.sample_times(node)):
                gpus, allocations = [], []
                for index in range(node.gpus):
                    holder = self._holder(node, index, t)
                    if holder is not None and any(a <= t < b for a, b in holder.vanished):
                        continue
                    uuid = self.uuid(node.name, index)
                    procs = []
                    util = IDLE_PCT
                    if holder is not None:
                        idle = any(a <= t < b for a, b in holder.idle)
                        util = IDLE_PCT if idle else BUSY_PCT
                        procs.append(
                            {
                                "pid": 1000 + index,
                                "mem_bytes": 20 * GIB,
                                "sm_pct": None,
                                "pod_uid": holder.uid,
                                "container": "main",
                            }
                        )
                        allocations.append(
                            {
                                "pod_uid": holder.uid,
                                "namespace": "ml",
                                "pod": _name(holder),
                                "container": "main",
                                "resource": "nvidia.com/gpu",
                                "device_ids": [uuid],
                            }
                        )
                    gpus.append(
                        {
                            "uuid": uuid,
                            "index": index,
                            "model": MODEL,
                            "parent_uuid": None,
                            "mig_profile": None,
                            "sharing": "exclusive",
                            "util_pct": util,
                            "mem_util_pct": util / 2,
                            "mem_used_bytes": 512 * 2**20 + (20 * GIB if procs else 0),
                            "mem_total_bytes": MEM_TOTAL,
                            "power_w": 100.0 + 3 * util,
                            "temp_c": 40,
                            "xid_errors": [
                                code
                                for name, gpu, at, code in self.xids
                                if (name, gpu) == (node.name, index)
                                and t <= at < t + node.interval_ms
                            ],
                            "ecc_dbe": 0,
                            "processes": procs,
                        }
                    )
                sample: dict[str, Any] = {
                    "schema": "gpuwatch.nvml.sample/v1",
                    "node": node.name,
                    "ts": self.t0 + t,
                    "interval_ms": node.interval_ms,
                    "seq": seq,
                    "gpus": gpus,
                    "allocations": allocations,
                }
                work = self._work(node, t)
                if work:
                    sample["work"] = work
                out.append(sample)
        return out

    def _work(self, node: NodePlan, t: int) -> list[dict[str, Any]]:
        """The units of work of the node's pods scraped within the sample at `t`."""
        out = []
        for pod in self.pods:
            if pod.node != node.name:
                continue
            done = sum(n for at, n in pod.scrapes() if t <= at < t + node.interval_ms)
            if done:
                out.append({"pod_uid": pod.uid, "units": {pod.unit: done}})
        return out

    def pod_events(self) -> list[dict[str, Any]]:
        """Every pod event as a JSON-ready dict, in event-time order."""
        events: list[dict[str, Any]] = []
        rv = 100
        for pod in self.pods:
            rv += 10
            events.append(_pod(pod, self.t0, "ADDED", pod.created_ms, rv=rv, phase="Pending"))
            events.append(_pod(pod, self.t0, "MODIFIED", pod.start_ms, rv=rv + 1, phase="Running"))
            if pod.end_ms >= self.duration_ms:
                continue
            if pod.finish == "Deleted":
                events.append(_pod(pod, self.t0, "DELETED", pod.end_ms, rv=rv + 2, phase="Running"))
                continue
            events.append(_pod(pod, self.t0, "MODIFIED", pod.end_ms, rv=rv + 2, phase=pod.finish))
            if pod.deleted_after_ms is not None:
                at = pod.end_ms + pod.deleted_after_ms
                events.append(_pod(pod, self.t0, "DELETED", at, rv=rv + 3, phase=pod.finish))
        for wait in self.waiting:
            rv += 10
            events.append(_waiting(wait, self.t0, "ADDED", wait.created_ms, rv=rv))
            if wait.gone_ms is not None and wait.gone_ms < self.duration_ms:
                events.append(_waiting(wait, self.t0, "DELETED", wait.gone_ms, rv=rv + 1))
        events.sort(key=lambda e: e["ts"])
        # A relist re-sends every pod alive at that time as it last was.
        for at in self.relists_ms:
            latest: dict[str, dict[str, Any]] = {}
            for event in events:
                if event["ts"] <= self.t0 + at and event["type"] != "RESYNC":
                    latest[event["uid"]] = event
            for _uid, event in sorted(latest.items()):
                if event["type"] != "DELETED" and event["phase"] in ("Pending", "Running"):
                    events.append({**event, "type": "RESYNC", "ts": self.t0 + at})
        events.sort(key=lambda e: e["ts"])
        return events

    def inputs(self) -> list[Input]:
        """Every input message in event-time order (at one time pod events first)."""
        if "inputs" not in self._memo:
            pods = [
                Input(K8S_PODS, e["uid"].encode(), json.dumps(e).encode(), e["ts"])
                for e in self.pod_events()
            ]
            data = [
                Input(NVML_SAMPLES, x["node"].encode(), json.dumps(x).encode(), x["ts"])
                for x in self.samples()
            ]
            nodes = [
                Input(K8S_NODES, x["node"].encode(), json.dumps(x).encode(), x["ts"])
                for x in self.node_events_json()
            ]
            rank = {K8S_NODES.name: 0, K8S_PODS.name: 1, NVML_SAMPLES.name: 2}
            self._memo["inputs"] = sorted(
                [*nodes, *pods, *data], key=lambda m: (m.ts, rank[m.spec.name])
            )
        inputs: list[Input] = self._memo["inputs"]
        return inputs

    def node_events_json(self) -> list[dict[str, Any]]:
        """The k8s.nodes events: each node ADDED at t0, cordoned and uncordoned as planned."""
        if not self.node_events:
            return []
        out = [_node(n, self.t0, "ADDED", 0, cordoned=False) for n in self.nodes]
        by_name = {n.name: n for n in self.nodes}
        for name, start, end in self.cordons:
            out.append(_node(by_name[name], self.t0, "MODIFIED", start, cordoned=True))
            if end < self.duration_ms:
                out.append(_node(by_name[name], self.t0, "MODIFIED", end, cordoned=False))
        out.sort(key=lambda e: e["ts"])
        return out

    def expected(self, idle_util_pct: float = 5.0) -> dict[str, tuple[float, float]]:
        """Per pod uid, (allocated, idle) GPU-seconds as the samples show them.

        Allocated: the seconds of every sample listing the pod in its allocations. Idle:
        those whose GPU reads under the idle threshold (5 % by default). Worked out from
        the samples' JSON, not by the code under test.
        """
        out: dict[str, tuple[float, float]] = {}
        for sample in self.samples():
            seconds = sample["interval_ms"] / S
            util = {g["uuid"]: g["util_pct"] for g in sample["gpus"]}
            for alloc in sample["allocations"]:
                allocated, idle = out.get(alloc["pod_uid"], (0.0, 0.0))
                is_idle = util[alloc["device_ids"][0]] < idle_util_pct
                out[alloc["pod_uid"]] = (allocated + seconds, idle + (seconds if is_idle else 0))
        return out


def _name(pod: PodPlan) -> str:
    return f"job-{pod.uid[:8]}"


def _pod(pod: PodPlan, t0: int, type_: str, at: int, *, rv: int, phase: str) -> dict[str, Any]:
    """A `k8s.pods` value of a planned pod."""
    running = phase == "Running"
    done = phase in ("Succeeded", "Failed")
    state = "running" if running else "terminated" if done else "waiting"
    reason = {"Succeeded": "Completed", "Failed": "OOMKilled"}.get(phase)
    if phase == "Pending":
        reason = "ContainerCreating"
    return {
        "schema": "gpuwatch.k8s.pod/v1",
        "type": type_,
        "ts": t0 + at,
        "resource_version": str(rv),
        "uid": pod.uid,
        "namespace": "ml",
        "name": _name(pod),
        "node": pod.node,
        "phase": phase,
        "created_at": t0 + pod.created_ms,
        "scheduled_at": t0 + pod.created_ms,
        "started_at": None if phase == "Pending" else t0 + pod.start_ms,
        "finished_at": t0 + pod.end_ms if done else None,
        "gpu_request": {"nvidia.com/gpu": 1},
        "conditions": [{"type": "PodScheduled", "status": "True", "reason": None, "message": None}],
        "containers": [
            {
                "name": "main",
                "state": state,
                "reason": reason,
                "exit_code": None if not done else (0 if phase == "Succeeded" else 137),
                "restarts": 0,
            }
        ],
        "labels": {"team": "vision"},
        "owner": {"kind": "Job", "name": _name(pod)},
        "priority_class": None,
        "queue": None,
    }


def _waiting(wait: WaitPlan, t0: int, type_: str, at: int, *, rv: int) -> dict[str, Any]:
    """A `k8s.pods` value of a pod no node can take yet."""
    name = f"wait-{wait.uid[:8]}"
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": f"0/3 nodes are available: {wait.gpus} Insufficient nvidia.com/gpu.",
    }
    return {
        "schema": "gpuwatch.k8s.pod/v1",
        "type": type_,
        "ts": t0 + at,
        "resource_version": str(rv),
        "uid": wait.uid,
        "namespace": "ml",
        "name": name,
        "node": None,
        "phase": "Pending",
        "created_at": t0 + wait.created_ms,
        "scheduled_at": None,
        "started_at": None,
        "finished_at": None,
        "gpu_request": {"nvidia.com/gpu": wait.gpus},
        "conditions": [unschedulable],
        "containers": [],
        "labels": {"team": "vision"},
        "owner": {"kind": "Job", "name": name},
        "priority_class": None,
        "queue": None,
    }


def _node(node: NodePlan, t0: int, type_: str, at: int, *, cordoned: bool) -> dict[str, Any]:
    """A `k8s.nodes` value of a planned node: its GPUs allocatable, of the history's model."""
    return {
        "schema": "gpuwatch.k8s.node/v1",
        "type": type_,
        "node": node.name,
        "ts": t0 + at,
        "gpu_capacity": {"nvidia.com/gpu": node.gpus},
        "gpu_allocatable": {"nvidia.com/gpu": node.gpus},
        "gpu_product": MODEL.replace(" ", "-"),
        "labels": {},
        "ready": True,
        "unschedulable": cordoned,
    }


def pod_uid(seed: int, n: int) -> PodUid:
    """A pod uid, stable for a seed and a number."""
    return PodUid(f"{seed:08x}-{n:04x}-4000-8000-{zlib.crc32(bytes([n % 256, seed % 256])):012x}")


def long_history(
    t0: int,
    *,
    hours: float,
    nodes: int,
    gpus: int,
    interval_ms: int,
    seed: int,
    tail_ms: int = 600_000,
) -> History:
    """Many hours of a cluster whose pods all finish before the end.

    Each GPU runs a chain of pods (20 min to 3 h each, queued a minute or two first), some
    idle for a spell, some whose GPU vanishes from the samples for up to an hour; nodes
    sample with phases of their own; a relist every two hours; the last `tail_ms` no pod
    runs, so a stream that passes the end closes every pod's last window.
    """
    rng = random.Random(seed)
    end = int(hours * 3_600_000)
    plans = []
    pods = []
    n = 0
    for i in range(nodes):
        name = f"gwbl-{seed % 1000:03d}-node-{i:02d}"
        plans.append(
            NodePlan(name, gpus, interval_ms, phase_ms=rng.randrange(0, interval_ms, 1000))
        )
        for g in range(gpus):
            t = rng.randrange(0, 1_800_000, 1000)
            while True:
                created = t
                start = created + rng.randrange(10_000, 120_000, 1000)
                stop = start + rng.randrange(1_200_000, 10_800_000, 1000)
                if stop > end - tail_ms:
                    break
                length = stop - start
                idle: tuple[tuple[int, int], ...] = ()
                vanished: tuple[tuple[int, int], ...] = ()
                if rng.random() < 0.4:
                    a = start + rng.randrange(0, length // 2, 1000)
                    idle = ((a, a + rng.randrange(60_000, length // 2, 1000)),)
                if rng.random() < 0.2:
                    a = start + rng.randrange(0, length // 2, 1000)
                    vanished = ((a, a + rng.randrange(60_000, min(3_600_000, length // 2), 1000)),)
                finish = rng.choice(["Succeeded", "Succeeded", "Failed", "Deleted"])
                pods.append(
                    PodPlan(
                        uid=pod_uid(seed, n),
                        node=name,
                        gpu=g,
                        created_ms=created,
                        start_ms=start,
                        end_ms=stop,
                        finish=finish,
                        idle=idle,
                        vanished=vanished,
                    )
                )
                n += 1
                t = stop + rng.randrange(5_000, 600_000, 1000)
    relists = tuple(range(7_200_000, end, 7_200_000))
    return History(t0, end, tuple(plans), tuple(pods), relists, seed)


def partition_of(key: bytes, partitions: int) -> int:
    """A key's partition in the in-memory pipeline (any stable hash co-partitions)."""
    return zlib.crc32(key) % partitions


def sent(
    history_inputs: list[Input], outages: dict[bytes, tuple[int, int]]
) -> list[tuple[int, Input]]:
    """The inputs in the order a live cluster sends them when some nodes' agents are cut off
    from Kafka, each with the event time it is sent at: a node's samples of `[start, end)`
    (by its key) held back in its agent's outbox and sent together, in their order, when
    event time reaches `end`."""
    held: dict[bytes, list[Input]] = {}
    out: list[tuple[int, Input]] = []

    def release(until: int | None) -> None:
        for key in sorted(held):
            end = outages[key][1]
            if until is None or end <= until:
                out.extend((end, m) for m in held.pop(key))

    for message in history_inputs:
        release(message.ts)
        outage = outages.get(message.key) if message.spec.name == NVML_SAMPLES.name else None
        if outage is not None and outage[0] <= message.ts < outage[1]:
            held.setdefault(message.key, []).append(message)
            continue
        out.append((message.ts, message))
    release(None)
    return out


def delayed(history_inputs: list[Input], outages: dict[bytes, tuple[int, int]]) -> list[Input]:
    """The inputs in the order `sent` gives."""
    return [message for _, message in sent(history_inputs, outages)]
