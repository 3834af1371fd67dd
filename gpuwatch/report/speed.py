"""How fast `gpuwatch report` adds up a month: generated records of a GPU fleet, timed.

`python -m gpuwatch.report.speed` (BENCHMARKS.md, "Report"). A 1,000-GPU month is 43.2
million pod windows (one pod per GPU) and as many GPU windows, too many to hold in memory
here, so a sample of the month's windows is generated (every GPU in each sampled window,
spread over the 30 days, encoded as the worker writes them) and timed per record: decoding
alone, adding decoded records alone, and both in one pass (what the report does per
record). `--kafka` also times the whole read through the local broker: the records are
written to topics of a scratch prefix, `read_period` reads them back, the topics are
deleted.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec

from gpuwatch.harness.examples import example
from gpuwatch.report.aggregate import Aggregator
from gpuwatch.report.rows import GroupBy, StepName
from gpuwatch.timerange import TimeRange
from schemas import ATTRIBUTION, GPU_WINDOWS, Attribution, GpuWindow
from schemas.prices import BUILTIN_PRICES

__all__ = ["generate", "main"]

T0: Final = 1_764_547_200_000  # 2025-12-01 00:00:00 UTC
MIN_MS: Final = 60_000
MONTH_WINDOWS: Final = 30 * 24 * 60
H100: Final = "NVIDIA H100 80GB HBM3"
SHAPES: Final = (1, 1, 1, 1, 1, 1, 1, 2, 4, 8)  # GPUs per pod: mostly one, some training on more
RUNS: Final[tuple[tuple[GroupBy, StepName | None], ...]] = (
    ("team", "1d"),
    ("team", None),
    ("pod", "1h"),
    ("gpu", "1d"),
)


def _pods(rng: random.Random, gpus: int) -> list[dict[str, Any]]:
    """Pods that hold the fleet's GPUs between them, with teams, owners and some units."""
    pods: list[dict[str, Any]] = []
    used = 0
    while used < gpus:
        n = min(rng.choice(SHAPES), gpus - used)
        team = f"team-{rng.randrange(20)}"
        data = example("gpuwatch.attribution/v1")
        data.update(uid=str(uuid.UUID(int=rng.getrandbits(128))), pod=f"p-{len(pods)}")
        data.update(namespace=f"ns-{rng.randrange(40)}", node=f"node-{used // 8}")
        data.update(labels={"team": team}, owner={"kind": "Job", "name": f"job-{len(pods)}"})
        per_gpu = {**data["gpus"][0], "allocated_gpu_seconds": 60.0, "cost_usd": 4 / 60}
        data["gpus"] = [{**per_gpu, "uuid": f"GPU-{used + i:05d}"} for i in range(n)]
        for name in ("allocated_gpu_seconds", "used_gpu_seconds", "idle_gpu_seconds"):
            data[name] = sum(g[name] for g in data["gpus"])
        data.update(cost_usd=n * 4 / 60, waste_usd=n * 0.2 / 60)
        if rng.random() < 0.3:
            data.update(work_units={"steps": 600.0 * n}, cost_per_unit={"steps": 4 / 36000})
        else:
            data.pop("work_units"), data.pop("cost_per_unit")
        pods.append(data)
        used += n
    return pods


def generate(gpus: int, windows: int, seed: int = 7) -> tuple[list[bytes], list[bytes]]:
    """Encoded pod windows and GPU windows of `windows` windows spread over a month."""
    rng = random.Random(seed)
    pods = [msgspec.convert(p, Attribution) for p in _pods(rng, gpus)]
    window = msgspec.convert(example("gpuwatch.gpu.window/v1"), GpuWindow)
    stride = max(1, MONTH_WINDOWS // windows)
    attribution: list[bytes] = []
    gpu_windows: list[bytes] = []
    for k in range(windows):
        start = T0 + k * stride * MIN_MS
        when = {"window_start": start, "window_end": start + MIN_MS, "ts": start + MIN_MS}
        for pod in pods:
            attribution.append(ATTRIBUTION.encode(msgspec.structs.replace(pod, **when)))
        for i in range(gpus):
            allocated = 60.0 if i % 10 else 30.0  # a tenth of the fleet half unallocated
            win = msgspec.structs.replace(
                window,
                uuid=f"GPU-{i:05d}",
                node=f"node-{i // 8}",
                allocated_seconds=allocated,
                unallocated_seconds=60.0 - allocated,
                **when,
            )
            gpu_windows.append(GPU_WINDOWS.encode(win))
    return attribution, gpu_windows


def _rate(n: int, work: Callable[[], object]) -> float:
    """Records per second of CPU time for `work` over `n` records (best of three)."""
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        work()
        best = min(best, time.process_time() - began)
    return n / best if best > 0 else float("inf")


def _period() -> TimeRange:
    return TimeRange(T0, T0 + MONTH_WINDOWS * MIN_MS)


def measure(gpus: int, windows: int) -> dict[str, Any]:
    """Per-record rates of decoding, adding, and both, for each grouping of RUNS."""
    attribution, gpu_windows = generate(gpus, windows)
    pods = [ATTRIBUTION.decode(raw) for raw in attribution]
    wins = [GPU_WINDOWS.decode(raw) for raw in gpu_windows]
    out: dict[str, Any] = {"gpus": gpus, "windows": windows, "pods": len(pods) // windows}
    out["records"] = len(pods) + len(wins)
    out["decode_attribution_per_s"] = _rate(
        len(pods), lambda: [*map(ATTRIBUTION.decode, attribution)]
    )
    out["decode_gpu_window_per_s"] = _rate(
        len(wins), lambda: [*map(GPU_WINDOWS.decode, gpu_windows)]
    )
    last: list[Aggregator] = []  # the aggregation of the latest run, for its rows
    for by, step in RUNS:
        name = f"{by}/{step or 'period'}"

        def add(by: GroupBy = by, step: StepName | None = step) -> None:
            agg = Aggregator(_period(), by=by, step=step, prices=BUILTIN_PRICES)
            for rec in pods:
                agg.add_attribution(rec, 0)
            for win in wins:
                agg.add_gpu_window(win, 1)
            last[:] = [agg]

        def both(by: GroupBy = by, step: StepName | None = step) -> None:
            agg = Aggregator(_period(), by=by, step=step, prices=BUILTIN_PRICES)
            for raw in attribution:
                agg.add_attribution(ATTRIBUTION.decode(raw), 0)
            for raw in gpu_windows:
                agg.add_gpu_window(GPU_WINDOWS.decode(raw), 1)

        total = len(pods) + len(wins)
        out[f"add_{name}_per_s"] = _rate(total, add)
        out[f"decode_and_add_{name}_per_s"] = _rate(total, both)
        # The rows: as many groups and steps as the month has, built once at the end.
        began = time.process_time()
        rows = len(last[0].report().rows)
        out[f"rows_{name}"] = rows
        out[f"rows_{name}_s"] = time.process_time() - began
    return out


def measure_kafka(gpus: int, windows: int) -> dict[str, Any]:
    """The whole read through the local broker: write to a scratch prefix, read, delete."""
    from gpuwatch import kafka
    from gpuwatch.config import load_settings
    from gpuwatch.replay.read import Progress
    from gpuwatch.report.read import read_period

    attribution, gpu_windows = generate(gpus, windows)
    settings = load_settings()
    scratch = settings.kafka.model_copy(
        update={"topic_prefix": f"gwbench-report-{uuid.uuid4().hex[:8]}."}
    )
    settings = settings.model_copy(update={"kafka": scratch})
    kafka.create_topics(settings)
    try:
        producer = kafka.producer(settings.kafka, acks=1, linger_ms=20)
        for spec, values in ((ATTRIBUTION, attribution), (GPU_WINDOWS, gpu_windows)):
            topic = spec.full_name(scratch.topic_prefix)
            for raw in values:
                producer.send(topic, key=raw[40:60], value=raw)
        producer.flush()
        producer.close()
        agg = Aggregator(_period(), by="team", step="1d")
        began, cpu = time.perf_counter(), time.process_time()
        read_period(settings, agg, margin_ms=300_000, progress=Progress(verb="report"))
        agg.report()
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        kafka.delete_topics(settings)
    records = len(attribution) + len(gpu_windows)
    assert agg.counts.pod_windows + agg.counts.gpu_windows == records, agg.counts
    return {"kafka_records": records, "kafka_wall_s": wall, "kafka_per_s": records / wall,
            "kafka_cpu_per_s": records / cpu}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Print the rates as one JSON object."""
    parser = argparse.ArgumentParser(prog="python -m gpuwatch.report.speed")
    parser.add_argument("--gpus", type=int, default=1000, help="fleet size (1000)")
    parser.add_argument("--windows", type=int, default=100, help="windows of the month (100)")
    parser.add_argument("--kafka", action="store_true", help="also time the read from Kafka")
    args = parser.parse_args(argv)
    out = measure(args.gpus, args.windows)
    if args.kafka:
        out.update(measure_kafka(args.gpus, args.windows))
    # A month of the fleet generated, and of the most pods a fleet has (one per GPU).
    month = (out["pods"] + args.gpus) * MONTH_WINDOWS
    most = 2 * args.gpus * MONTH_WINDOWS
    out["month_records"], out["month_records_pod_per_gpu"] = month, most
    out["month_s_at_decode_and_add_team_1d"] = month / out["decode_and_add_team/1d_per_s"]
    if args.kafka:
        out["month_s_at_kafka_rate"] = month / out["kafka_per_s"]
        out["month_s_pod_per_gpu_at_kafka_rate"] = most / out["kafka_per_s"]
    json.dump({k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
