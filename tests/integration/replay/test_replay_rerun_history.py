"""`replay --rerun` of six hours of a twelve-hour history gives the live worker's windows.

The live run is a backlog of the history on 12 partitions (equal to a paced run, as
`tests/integration/worker/test_worker_backlog.py` shows). The rerun copies hours 3 to 9,
tells its worker where the input ends, and must give, for every attribution window wholly
inside the range (the first minute left out: a 57 s sample that began before the range is
not copied), the live window's allocated, used and idle seconds, VRAM, energy, cost and
waste; and it must close the range's last windows instead of waiting for more input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from backlog_runs import PARTITIONS, complete, messages, twelve_hours
from conftest import RunCli, Sandbox
from topic_io import consume_all, topic_scopes
from worker_fixtures import produce, worker_starter

from schemas import ATTRIBUTION
from schemas.settings import Settings

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
FIELDS = (
    "allocated_gpu_seconds",
    "used_gpu_seconds",
    "idle_gpu_seconds",
    "vram_byte_seconds",
    "vram_peak_bytes",
    "energy_joules",
    "cost_usd",
    "waste_usd",
)


def windows(settings: Settings, start: int, end: int) -> dict[tuple[str, int], dict[str, Any]]:
    """Attribution records wholly inside `[start, end)`, by identity."""
    out = {}
    for record in consume_all(settings, ATTRIBUTION.full_name(settings.kafka.topic_prefix)):
        a = json.loads(record.value)
        if a["window_start"] >= start and a["window_end"] <= end:
            out[(a["uid"], a["window_start"])] = a
    return out


def test_a_six_hour_rerun_gives_the_live_windows_and_closes_its_end(
    stack: Settings, run_cli: RunCli, sandbox: Sandbox, tmp_path: Path
) -> None:
    history = twelve_hours(seed=16)
    with (
        topic_scopes(stack, partitions=PARTITIONS) as scope,
        worker_starter(tmp_path) as start,
    ):
        live = scope()
        produce(live, messages(live, history))
        worker = start(live)
        complete(live, history, worker)
        worker.stop()
        begin, end = history.t0 + 3 * HOUR_MS, history.t0 + 9 * HOUR_MS
        target = live.kafka.topic_prefix.rstrip(".") + "-rerun."
        sandbox.prefixes.append(target)
        args = ["--rerun", "--to-prefix", target, "--from", str(begin), "--to", str(end)]
        code, out, err = run_cli(live, *args, "--json")
        assert code == 0, err
        rerun = live.model_copy(
            update={"kafka": live.kafka.model_copy(update={"topic_prefix": target})}
        )
        # The first minute of the range is left out: a sample that started before it.
        want = windows(live, begin + 60_000, end)
        got = windows(rerun, begin + 60_000, end)
        assert len(want) > 1_000
        assert sorted(got) == sorted(want)
        for key, record in want.items():
            for name in FIELDS:
                assert got[key][name] == pytest.approx(record[name], rel=1e-9, abs=1e-9), (
                    key,
                    name,
                )
        # The range's last window of every pod running at its end is closed too.
        last = {k for k in got if got[k]["window_end"] == end}
        assert last, "no window closed at the end of the range"
        assert json.loads(out)["rerun_totals"]["pod_windows"] >= len(got)
