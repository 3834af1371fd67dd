"""The worker's own CPU per GPU-sample, in process: the node and pod processors, no Kafka.

The fleet of `gpuwatch bench worker` (simulated 8-GPU nodes sampled by the real
`NodeAgent`, one Running pod per GPU) is fed to one `NodePartition` and one `PodPartition`
as the agent loop feeds them: a second of samples a batch, then a tick to each side,
the node side's `pod.usage` records and both sides' fleet inputs (node uses, pods' waiting
requests, marks: `streams.processors.fleet`) to the pod side, the state written every
`STATE_EVERY_S` (every fifth batch). Process CPU time is measured around each side's calls
only, so the figures are the processors' cost without the Faust consumer, the producer
or the event loop, and are repeatable on a busy machine where wall time is not. The garbage
collector is tuned as in the worker (`gpuwatch.run.memory.tune_collector`).

The digests hash every record made (topic, key, value, in order) and every state write:
equal digests from two versions of the code mean byte-identical outputs for this input.
`output_digest` leaves out the internal `pod.usage` between the sides: equal, a change to
how usage travels left every record users read byte for byte the same.

    python -m gpuwatch.harness.bench.core --nodes 100 --seconds 80 --runs 3

`--interval` samples each node every so many seconds instead of every second, as a recorded
history sampled every 57 s is (`--interval 57 --seconds 1140`: 20 samples a node). A batch
still holds one round of samples, and the state is still written every fifth batch: the
agent loop writes it every `STATE_EVERY_S` of wall time (or hour of stream time), and a
worker reading a history goes through more batches, not fewer, in those 5 s.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial

from gpuwatch.harness.bench.load import Fleet, build_fleet
from gpuwatch.run.memory import tune_collector
from schemas.prices import BUILTIN_PRICES
from schemas.settings import RuleSettings, WindowSettings
from schemas.topics import K8S_PODS, NVML_SAMPLES, POD_USAGE
from streams.core.integrals import PriceBook
from streams.core.ticks import Tick, claims_of
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Record, Source
from streams.processors.pod import PodConfig, PodPartition

__all__ = ["CoreResult", "CoreRun", "main", "run_core", "run_once"]

PREFIX = "bench.core."
FLEET = f"{PREFIX}bench.fleet"  # the worker's internal fleet topic
T0_MS = 1_700_000_040_000  # a window start (60 s windows): windows close within 80 s
STATE_EVERY_BATCHES = 5  # the agent loop's STATE_EVERY_S, in batches of a second's samples
S = 1000


@dataclass(frozen=True)
class CoreRun:
    """One pass over the fleet's samples."""

    node_cpu_s: float
    pod_cpu_s: float
    records: int
    usage_records: int
    digest: str
    """sha256 of every record (topic, key, value), in the order made."""
    output_digest: str
    """The same without the internal `pod.usage`: the records users read."""
    state_digest: str
    """sha256 of every state write (key, value), in the order made."""


@dataclass(frozen=True)
class CoreResult:
    """The median of several passes, in µs of process CPU per GPU-sample."""

    nodes: int
    gpus: int
    seconds: int
    interval_s: int
    gpu_samples: int
    runs: int
    node_cpu_us_per_gpu_sample: float
    pod_cpu_us_per_gpu_sample: float
    node_runs_us: list[float]
    pod_runs_us: list[float]
    records: int
    usage_records: int
    digest: str
    output_digest: str
    state_digest: str


class _Digest:
    def __init__(self, internal: str) -> None:
        self.records = hashlib.sha256()
        self.outputs = hashlib.sha256()  # without the internal pod.usage between the sides
        self.state = hashlib.sha256()
        self.internal = internal
        self.count = 0
        self.usage = 0

    def add_records(self, records: Sequence[Record]) -> None:
        h, o = self.records, self.outputs
        for r in records:
            head = f"{r.topic}\0{len(r.key)}\0{len(r.value)}\0".encode()
            h.update(head)
            h.update(r.key)
            h.update(r.value)
            if r.topic != self.internal:
                o.update(head)
                o.update(r.key)
                o.update(r.value)
        self.count += len(records)

    def add_writes(self, writes: Sequence[tuple[bytes, bytes | None]]) -> None:
        h = self.state
        for key, value in writes:
            h.update(f"{len(key)}\0{-1 if value is None else len(value)}\0".encode())
            h.update(key)
            h.update(value or b"")


def _tick(node: NodePartition) -> Tick:
    claims, idle = claims_of({0: node}, [0])
    return Tick(sender="bench", claims=claims, idle=idle)


def _batch(
    processor: NodePartition | PodPartition,
    inputs: list[tuple[Source, bytes]],
    tick: Callable[[], Tick],
    out: Outputs,
    state_due: bool,
) -> tuple[float, list[Record], list[tuple[bytes, bytes | None]]]:
    """One batch of one side as the agent loop runs it: its CPU seconds, records, writes.

    The tick says the node side's stream time after its inputs, as the tick timer does.
    """
    t = time.process_time()
    for source, value in inputs:
        processor.handle(source, value, out)
    processor.on_tick(tick(), out)
    records = out.take()
    writes = processor.take_writes() if state_due else []
    return time.process_time() - t, records, writes


def run_once(fleet: Fleet) -> CoreRun:
    """Feed the fleet's pod events and samples through both sides once."""
    rules, windows = RuleSettings(), WindowSettings()
    counters = Counters()
    node_config = NodeConfig(
        prefix=PREFIX,
        window_ms=windows.window_s * S,
        lateness_ms=windows.allowed_lateness_s * S,
        rules=rules,
        prices=PriceBook(BUILTIN_PRICES),
        fleet_topic=FLEET,
    )
    node = NodePartition(0, node_config, counters)
    pod = PodPartition(0, PodConfig(PREFIX, 1, rules, windows, fleet_topic=FLEET), counters)
    node_out, pod_out = Outputs(PREFIX, counters), Outputs(PREFIX, counters)
    samples, pods, usage = (s.full_name(PREFIX) for s in (NVML_SAMPLES, K8S_PODS, POD_USAGE))
    per_round = len(fleet.nodes)
    rounds = [
        [
            (Source(samples, 0, n * per_round + i, key), value)
            for i, (key, value) in enumerate(fleet.backlog[n * per_round : (n + 1) * per_round])
        ]
        for n in range(len(fleet.backlog) // per_round)
    ]
    digest = _Digest(usage)
    usage_offset = fleet_offset = 0
    fleet_inputs: list[tuple[Source, bytes]] = []
    node_cpu = pod_cpu = 0.0
    gc.collect()
    t = time.process_time()
    for i, (key, value) in enumerate(fleet.pod_events):
        pod.handle(Source(pods, 0, i, key), value, pod_out)
    pod_cpu += time.process_time() - t
    for n, batch in enumerate(rounds):
        state_due = (n + 1) % STATE_EVERY_BATCHES == 0
        tick = partial(_tick, node)
        cpu, records, node_writes = _batch(node, batch, tick, node_out, state_due)
        node_cpu += cpu
        to_pods, fleet_inputs = fleet_inputs, []
        for r in records:
            if r.topic == usage:
                to_pods.append((Source(usage, 0, usage_offset, r.key), r.value))
                usage_offset += 1
            elif r.topic == FLEET:
                to_pods.append((Source(FLEET, 0, fleet_offset, r.key), r.value))
                fleet_offset += 1
        digest.usage += len(to_pods)
        cpu, pod_records, pod_writes = _batch(pod, to_pods, tick, pod_out, state_due)
        pod_cpu += cpu
        for r in pod_records:  # the pod side's own requests and marks, read in the next batch
            if r.topic == FLEET:
                fleet_inputs.append((Source(FLEET, 0, fleet_offset, r.key), r.value))
                fleet_offset += 1
        digest.add_records(records)
        digest.add_records(pod_records)
        digest.add_writes(node_writes)
        digest.add_writes(pod_writes)
    return CoreRun(
        node_cpu,
        pod_cpu,
        digest.count,
        digest.usage,
        digest.records.hexdigest(),
        digest.outputs.hexdigest(),
        digest.state.hexdigest(),
    )


def run_core(
    nodes: int = 100, gpus: int = 8, seconds: int = 80, runs: int = 3, interval_s: int = 1
) -> CoreResult:
    """The fleet built once, fed `runs` times; medians, and the digests (equal every run)."""
    fleet = build_fleet(nodes, gpus, seconds, T0_MS, watch=0, interval_s=interval_s)
    restore = tune_collector()  # as the worker runs
    try:
        passes = [run_once(fleet) for _ in range(runs)]
    finally:
        restore()
    if len({(p.digest, p.output_digest, p.state_digest) for p in passes}) != 1:
        raise RuntimeError("two passes over the same input made different outputs")
    gpu_samples = fleet.gpu_samples
    node_us = [p.node_cpu_s * 1e6 / gpu_samples for p in passes]
    pod_us = [p.pod_cpu_s * 1e6 / gpu_samples for p in passes]
    first = passes[0]
    return CoreResult(
        nodes=nodes,
        gpus=gpus,
        seconds=seconds,
        interval_s=interval_s,
        gpu_samples=gpu_samples,
        runs=runs,
        node_cpu_us_per_gpu_sample=round(statistics.median(node_us), 2),
        pod_cpu_us_per_gpu_sample=round(statistics.median(pod_us), 2),
        node_runs_us=[round(u, 2) for u in node_us],
        pod_runs_us=[round(u, 2) for u in pod_us],
        records=first.records,
        usage_records=first.usage_records,
        digest=first.digest,
        output_digest=first.output_digest,
        state_digest=first.state_digest,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the in-process CPU figures of the node and pod processors as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m gpuwatch.harness.bench.core",
        description="CPU per GPU-sample of the node and pod processors, in process.",
    )
    parser.add_argument("--nodes", type=int, default=100, help="simulated nodes (default 100)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--seconds", type=int, default=80, help="seconds of samples (default 80)")
    parser.add_argument("--runs", type=int, default=3, help="passes, median taken (default 3)")
    parser.add_argument(
        "--interval",
        type=int,
        default=1,
        help="seconds between a node's samples (default 1; 57 for a recorded history)",
    )
    args = parser.parse_args(argv)
    result = run_core(args.nodes, args.gpus, args.seconds, args.runs, args.interval)
    print(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
