"""`gpuwatch report` over revised windows on the real broker: the newest revision counts.

One pod on GPU-a (H100, 4 USD per GPU-hour) in two windows. The first window is written,
then revised (the pod's usage came after it closed: 60 s allocated, not 30), then its first
copy is delivered again; the GPU's window likewise. The second window is written once.
So the hour holds 2 GPU-minutes of the pod, nothing unallocated: 8/60 USD.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import msgspec
import pytest
from support import run_command
from test_report_command import GPUWATCH, H100, HOUR, MIN, gpu_window, pod_window
from topic_io import NewScope

from gpuwatch import kafka
from schemas import ATTRIBUTION, GPU_WINDOWS, TopicSpec
from schemas.settings import Settings

pytestmark = pytest.mark.integration


def test_revised_windows_count_at_their_newest_revision(new_scope: NewScope) -> None:
    scoped = new_scope()
    t0 = (int(time.time() * 1000) - 3 * HOUR) // HOUR * HOUR
    figures = {"idle": 0.0, "usd_per_hour": 4.0, "units": {}}

    def pod(start: int, allocated: float, revision: int = 0) -> Any:
        rec = pod_window("uid-a", "vision", "GPU-a", H100, start, allocated=allocated, **figures)
        return msgspec.structs.replace(rec, revision=revision)

    def gpu(start: int, allocated: float, revision: int = 0) -> Any:
        return msgspec.structs.replace(
            gpu_window("GPU-a", H100, start, allocated), revision=revision
        )

    values: list[tuple[TopicSpec[Any], Any]] = [
        (ATTRIBUTION, pod(t0, 30.0)),
        (GPU_WINDOWS, gpu(t0, 30.0)),
        (ATTRIBUTION, pod(t0 + MIN, 60.0)),
        (GPU_WINDOWS, gpu(t0 + MIN, 60.0)),
        (ATTRIBUTION, pod(t0, 60.0, revision=1)),
        (GPU_WINDOWS, gpu(t0, 60.0, revision=1)),
        (ATTRIBUTION, pod(t0, 30.0)),  # the first copy again, after the revision
        (GPU_WINDOWS, gpu(t0, 30.0)),
    ]
    _write(scoped, values)
    argv = [str(GPUWATCH), "--topic-prefix", scoped.kafka.topic_prefix, "report"]
    argv += ["--from", str(t0), "--to", str(t0 + HOUR), "--format", "json"]
    env = {**os.environ, "GPUWATCH_KAFKA_BOOTSTRAP": scoped.kafka.bootstrap}
    result = run_command(argv, timeout_s=120, env=env)
    assert result.returncode == 0, result.stderr
    rows = {row["kind"]: row for row in json.loads(result.stdout)}
    assert rows["group"]["cost_usd"] == pytest.approx(8 / 60)
    assert rows["group"]["allocated_gpu_hours"] == pytest.approx(2 / 60)
    assert rows["unallocated"]["cost_usd"] == pytest.approx(0.0, abs=1e-12)
    assert rows["total"]["allocated_cost_gap"] == pytest.approx(0.0, abs=1e-12)
    assert "2 newer revisions took the place of the one counted before; 2 older" in result.stderr
    assert "2 pod windows and 2 GPU windows" in result.stderr


def _write(scoped: Settings, values: list[tuple[TopicSpec[Any], Any]]) -> None:
    prefix = scoped.kafka.topic_prefix
    producer = kafka.producer(scoped.kafka, acks="all")
    try:
        for spec, value in values:
            producer.send(spec.full_name(prefix), key=spec.key_of(value).encode(),
                          value=spec.encode(value))  # fmt: skip
        producer.flush(timeout=30)
    finally:
        producer.close()
