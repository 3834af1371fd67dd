"""`gpuwatch report` run as a user runs it, over records written to the real broker.

Two hours of a small fleet, hour by hour (USD per GPU-hour: H100 4, A100 3):

- vision trains on GPU-a (H100) all along, 600 steps a window, idle 15 s of each minute
  in the first hour and 6 s in the second;
- nlp serves on GPU-b (A100) in the second hour only, 30 s of each minute, 45,000 tokens
  a window; GPU-b is nobody's the rest of the time;
- besides: one record delivered twice (again two windows later, as a worker restarted
  sends what it sent since its last commit), one window after the period, two records
  that do not decode.

Hour 1: vision 4.00 USD (waste 1.00), unallocated 1 GPU-h of A100 = 3.00, total 7.00.
Hour 2: vision 4.00 (waste 0.40), nlp 1.50, unallocated 0.5 GPU-h = 1.50, total 7.00.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import msgspec
import pytest
from support import run_command
from topic_io import topic_scopes

from gpuwatch import kafka
from gpuwatch.harness.examples import example
from schemas import ATTRIBUTION, GPU_WINDOWS, Attribution, GpuWindow, TopicSpec
from schemas.settings import Settings

pytestmark = pytest.mark.integration

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
MIN, HOUR = 60_000, 3_600_000
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def pod_window(
    uid: str, team: str, gpu: str, model: str, start: int, **figures: Any
) -> Attribution:
    allocated, idle, usd = figures["allocated"], figures["idle"], figures["usd_per_hour"]
    cost = usd / 3600 * allocated
    share = {"uuid": gpu, "model": model, "sharing": "exclusive", "vram_peak_bytes": 0}
    share.update(allocated_gpu_seconds=allocated, used_gpu_seconds=allocated - idle)
    share.update(idle_gpu_seconds=idle, cost_usd=cost, method="exclusive")
    data = example("gpuwatch.attribution/v1")
    data.update(uid=uid, pod=f"{team}-0", namespace=team, labels={"team": team}, gpus=[share])
    data.update(window_start=start, window_end=start + MIN, ts=start + MIN)
    data.update(allocated_gpu_seconds=allocated, used_gpu_seconds=allocated - idle)
    data.update(idle_gpu_seconds=idle, cost_usd=cost, waste_usd=usd / 3600 * idle)
    units = figures["units"]
    data.update(work_units=units, cost_per_unit={n: cost / c for n, c in units.items()})
    return msgspec.convert(data, Attribution)


def gpu_window(uuid: str, model: str, start: int, allocated: float) -> GpuWindow:
    data = example("gpuwatch.gpu.window/v1")
    data.update(uuid=uuid, model=model, node="gpu-node-17", pods=[])
    data.update(window_start=start, window_end=start + MIN, ts=start + MIN)
    data.update(allocated_seconds=allocated, unallocated_seconds=60.0 - allocated)
    return msgspec.convert(data, GpuWindow)


@dataclass
class Written:
    """Where the records went, and the period they cover."""

    settings: Settings
    t0: int

    def report(self, *args: str) -> CompletedProcess[str]:
        period = ["--from", str(self.t0), "--to", str(self.t0 + 2 * HOUR)]
        argv = [str(GPUWATCH), "--topic-prefix", self.settings.kafka.topic_prefix, "report"]
        env = {**os.environ, "GPUWATCH_KAFKA_BOOTSTRAP": self.settings.kafka.bootstrap}
        return run_command([*argv, *period, *args], timeout_s=120, env=env)


@pytest.fixture(scope="module")
def written(stack: Settings) -> Iterator[Written]:
    """The two hours of the module doc, written to topics of their own."""
    t0 = (int(time.time() * 1000) - 4 * HOUR) // HOUR * HOUR  # whole hours, all closed
    values: list[tuple[TopicSpec[Any], Any]] = []
    for k in range(120):
        start = t0 + k * MIN
        idle = 15.0 if k < 60 else 6.0
        vision = pod_window("uid-vision", "vision", "GPU-a", H100, start, allocated=60.0,
                            idle=idle, usd_per_hour=4.0, units={"steps": 600.0})  # fmt: skip
        values += [(ATTRIBUTION, vision), (GPU_WINDOWS, gpu_window("GPU-a", H100, start, 60.0))]
        held = 30.0 if k >= 60 else 0.0
        values.append((GPU_WINDOWS, gpu_window("GPU-b", A100, start, held)))
        if held:
            nlp = pod_window("uid-nlp", "nlp", "GPU-b", A100, start, allocated=30.0, idle=0.0,
                             usd_per_hour=3.0, units={"tokens": 45_000.0})  # fmt: skip
            values.append((ATTRIBUTION, nlp))
    values.insert(9, values[0])  # delivered twice, after the records of two more windows
    after = t0 + 2 * HOUR
    values.append((ATTRIBUTION, pod_window("uid-vision", "vision", "GPU-a", H100, after,
                                            allocated=60.0, idle=0.0, usd_per_hour=4.0,
                                            units={})))  # fmt: skip
    with topic_scopes(stack) as new_scope:
        scoped = new_scope()
        prefix = scoped.kafka.topic_prefix
        producer = kafka.producer(scoped.kafka, acks="all")
        try:
            for spec, value in values:
                producer.send(spec.full_name(prefix), key=spec.key_of(value).encode(),
                              value=spec.encode(value))  # fmt: skip
            bad = b'{"schema": "gpuwatch.attribution/v1", "ts": %d}' % (t0 + MIN)
            producer.send(ATTRIBUTION.full_name(prefix), key=b"uid-bad", value=bad)
            # A value without a readable `ts` written now is past the period to the reader
            # (written after it, no event time to say otherwise): this one has one in it.
            wrong = b'{"schema": "gpuwatch.gpu.window/v1", "ts": %d, "uuid": 7}' % (t0 + MIN)
            producer.send(GPU_WINDOWS.full_name(prefix), key=b"GPU-x", value=wrong)
            producer.flush(timeout=30)
        finally:
            producer.close()
        yield Written(scoped, t0)


def table_cells(text: str) -> dict[tuple[str, str], str]:
    """(step's hh:mm or `period`, group) -> the row's figures after the group's name."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("fleet waste share"))
    cells, step = {}, ""
    for line in filter(None, lines[3:end]):
        words = line.split()
        if line[:1].isdigit():
            step, words = line[11:16], words[2:]
        elif words[0] == "period":
            step, words = "period", words[1:]
        cells[(step, words[0])] = " ".join(words[1:])
    return cells


def test_table_by_team_per_hour(written: Written) -> None:
    result = written.report("--by", "team", "--step", "1h")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith("UTC  by team  step 1h")
    cells = table_cells(result.stdout)
    h1, h2 = sorted({step for step, _ in cells} - {"period"})
    # GPU-h allocated, used, idle share; GPU-h unallocated; cost, waste, waste share; per unit
    assert cells[(h1, "vision")] == "1.00 0.75 25.0 % 4.0000 1.0000 25.0 % steps $0.1111/1k"
    assert cells[(h1, "(unallocated)")] == "1.00 3.0000"
    assert cells[(h1, "total")] == ("1.00 0.75 25.0 % 1.00 7.0000 1.0000 14.3 % steps $0.1111/1k")
    assert cells[(h2, "vision")].startswith("1.00 0.90 10.0 % 4.0000 0.4000 10.0 %")
    assert cells[(h2, "nlp")] == "0.50 0.50 0.0 % 1.5000 0.0000 0.0 % tokens $0.5556/1M"
    assert cells[(h2, "(unallocated)")] == "0.50 1.5000"
    assert cells[(h2, "total")].startswith("1.50 1.40 6.7 % 0.50 7.0000 0.4000 5.7 %")
    assert cells[("period", "total")].startswith("2.50 2.15 14.0 % 1.50 14.0000 1.4000 10.0 %")
    assert len(cells) == 8
    assert "(idle allocated cost / cost): 14.3 % -> 5.7 %" in result.stdout
    assert "records delivered more than once, counted once: 1" in result.stderr
    assert "records that could not be decoded, skipped: 2" in result.stderr
    assert "180 pod windows and 240 GPU windows" in result.stderr


def test_csv_by_team_per_hour(written: Written) -> None:
    result = written.report("--by", "team", "--step", "1h", "--format", "csv")
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    by_key = {(r["step_start"][11:16], r["group"]): r for r in rows if r["kind"] != "period_total"}
    first, second = sorted({r["step_start"] for r in rows})
    assert first[11:16] != second[11:16]
    h1, h2 = first[11:16], second[11:16]
    expected = {
        (h1, "vision"): (4.0, 1.0, 1.0),  # cost, waste, GPU-h allocated
        (h1, "(unallocated)"): (3.0, 0.0, 0.0),
        (h1, "total"): (7.0, 1.0, 1.0),
        (h2, "vision"): (4.0, 0.4, 1.0),
        (h2, "nlp"): (1.5, 0.0, 0.5),
        (h2, "(unallocated)"): (1.5, 0.0, 0.0),
        (h2, "total"): (7.0, 0.4, 1.5),
    }
    assert set(by_key) == set(expected)
    for key, (cost, waste, hours) in expected.items():
        row = by_key[key]
        assert float(row["cost_usd"]) == pytest.approx(cost), key
        assert float(row["waste_usd"]) == pytest.approx(waste), key
        assert float(row["allocated_gpu_hours"]) == pytest.approx(hours), key
    assert float(by_key[(h1, "vision")]["cost_per_unit_usd.steps"]) == pytest.approx(4 / 36000)
    assert float(by_key[(h2, "nlp")]["cost_per_unit_usd.tokens"]) == pytest.approx(1.5 / 2.7e6)
    assert float(by_key[(h1, "(unallocated)")]["unallocated_gpu_hours"]) == pytest.approx(1.0)


def test_json_by_team_per_hour_and_a_plot(written: Written, tmp_path: Path) -> None:
    png = tmp_path / "cost.png"
    result = written.report("--step", "1h", "--format", "json", "--plot", str(png))
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    (period,) = [r for r in rows if r["kind"] == "period_total"]
    assert period["cost_usd"] == pytest.approx(14.0)
    assert period["waste_usd"] == pytest.approx(1.4)
    assert period["waste_share"] == pytest.approx(0.1)
    assert period["cost_per_unit_usd"] == {
        "steps": pytest.approx(4 / 36000),
        "tokens": pytest.approx(1.5 / 2.7e6),
    }
    assert sum(r["cost_usd"] for r in rows if r["kind"] in ("group", "unallocated")) == (
        pytest.approx(14.0)
    )
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert f"plot written to {png} (2 steps)" in result.stderr


def test_an_empty_period_prints_an_empty_table_and_exits_0(written: Written) -> None:
    earlier = ["--from", str(written.t0 - 2 * HOUR), "--to", str(written.t0 - HOUR)]
    argv = [str(GPUWATCH), "--topic-prefix", written.settings.kafka.topic_prefix, "report"]
    result = run_command([*argv, *earlier], timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert "COST USD" in result.stdout
    assert "(nothing recorded in the period)" in result.stdout
    assert "gpuwatch: report: nothing recorded between" in result.stderr
