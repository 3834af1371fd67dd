"""Six cluster scenarios through Kafka and `gpuwatch worker`, live and replayed a day later.

The stream and its hand-worked answers are those of `tests/unit/streams/test_scenarios_core.py`
(time-sharing, an idle stall, a crash loop, a pod queued too long, a leak, a completed pod,
all in one stream on nodes and pods of their own). Two workers run at once:

- live: the stream goes in 20 s of event time at a time, each once the worker has caught
  up with the one before, so its ticks interleave with the data as in a running cluster;
- replay: the same stream one day older, all of it in Kafka before its worker starts.

Each scenario's answers are checked on the live run's records; the replay's records, moved
one day later, must equal them, and so must what the pure core makes of the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from topic_io import topic_scopes
from unit.streams.test_scenarios_core import (
    CHECKS,
    DAY_MS,
    END_S,
    SETTINGS_ENV,
    STEP_S,
    Input,
    Records,
    assert_same_records,
    build_stream,
    check_totals,
    identities,
    moved,
    run_live,
)
from worker_fixtures import Message, Worker, aligned_t0, decoded, produce, spawn_worker, wait_for

from schemas import (
    ALERTS,
    ATTRIBUTION,
    DEADLETTER,
    GPU_WINDOWS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    POD_USAGE,
)
from schemas.settings import Settings

pytestmark = pytest.mark.integration

S = 1000
CHUNK_S = 20  # under telemetry_missing_after_s (30 s): no node falls that far behind another
EXPECTED = {"pod.lifecycle": 13, "alerts": 9, "attribution": 27, "gpu.windows": 24}
"""Distinct records of a complete run, as `check_totals` counts them."""


@dataclass
class Run:
    """One worker's run of the stream: its settings, t0, worker and records read back."""

    settings: Settings
    t0: int
    worker: Worker
    records: Records | None = None

    def read(self) -> Records:
        """Every record of the derived topics now."""
        return Records(
            lifecycle=decoded(self.settings, POD_LIFECYCLE),
            attribution=decoded(self.settings, ATTRIBUTION),
            windows=decoded(self.settings, GPU_WINDOWS),
            alerts=decoded(self.settings, ALERTS),
            usage=decoded(self.settings, POD_USAGE),
            deadletters=len(decoded(self.settings, DEADLETTER)),
        )

    def complete(self) -> bool:
        """Whether every record the answers count is out."""
        found = identities(self.read())
        return all(len(found[topic]) >= n for topic, n in EXPECTED.items())


def to_kafka(settings: Settings, stream: list[Input]) -> list[Message]:
    """The stream as messages for the settings' topics (partitioned by key)."""
    prefix = settings.kafka.topic_prefix
    return [(m.spec.full_name(prefix), m.key, m.value, None) for m in stream]


def feed_live(run: Run, stream: list[Input]) -> None:
    """Produce the stream a chunk of event time at a time, each after the last is processed.

    A chunk is processed when the worker has sent the pod usage ending at the chunk's end
    for every pod holding a GPU then (5 s samples, usage cut at every 10 s). The pod
    events before t0 go with the first chunk.
    """
    chunks: dict[int, list[Input]] = {}
    for m in stream:
        chunks.setdefault(max(0, (m.ts - run.t0) // (CHUNK_S * S)), []).append(m)
    assert sorted(chunks) == list(range(END_S // CHUNK_S))
    for index, chunk in sorted(chunks.items()):
        produce(run.settings, to_kafka(run.settings, chunk))
        end_ms = run.t0 + (index + 1) * CHUNK_S * S
        holding = {
            a.pod_uid
            for m in chunk
            if m.spec is NVML_SAMPLES and m.ts == end_ms - STEP_S * S
            for a in NVML_SAMPLES.decode(m.value).allocations
        }
        assert holding

        def caught_up(end_ms: int = end_ms, holding: set[str] = holding) -> bool:
            done = {u.uid for u in decoded(run.settings, POD_USAGE) if u.end_ts == end_ms}
            return holding <= done

        wait_for(f"the usage up to {end_ms - run.t0} ms", caught_up, run.worker)


@pytest.fixture(scope="module")
def runs(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Run, Run]]:
    """The live run and the replay, both complete and their workers stopped."""
    t0 = aligned_t0() - END_S * S  # the whole stream lies in the past
    logs = tmp_path_factory.mktemp("scenario-workers")
    with topic_scopes(stack) as new_scope:
        live_settings, replay_settings = new_scope(), new_scope()
        older = t0 - DAY_MS
        produce(replay_settings, to_kafka(replay_settings, build_stream(older)))
        replay = Run(
            replay_settings,
            older,
            spawn_worker(replay_settings, logs / "replay.log", "replay", SETTINGS_ENV),
        )
        live = Run(
            live_settings, t0, spawn_worker(live_settings, logs / "live.log", "live", SETTINGS_ENV)
        )
        try:
            feed_live(live, build_stream(t0))
            for run in (live, replay):
                wait_for(f"the {run.worker.log_path.stem} run", run.complete, run.worker)
        finally:
            for run in (live, replay):
                run.worker.stop()
        for run in (live, replay):
            assert run.worker.process.returncode == 0, run.worker.log
            counters = run.worker.counters()
            assert (counters["deadletter"], counters["late"]) == (0, 0), counters
            run.records = run.read()
        yield live, replay


def records_of(run: Run) -> Records:
    """The records the fixture read back after the run."""
    assert run.records is not None
    return run.records


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_each_scenario_gives_the_hand_worked_records(
    runs: tuple[Run, Run], check: Callable[[Records, int], None]
) -> None:
    live, _ = runs
    check(records_of(live), live.t0)


def test_the_live_run_gives_nothing_else(runs: tuple[Run, Run]) -> None:
    live, _ = runs
    check_totals(records_of(live), live.t0)


def test_a_replay_a_day_older_gives_the_live_records_a_day_earlier(
    runs: tuple[Run, Run],
) -> None:
    live, replay = runs
    check_totals(records_of(replay), replay.t0)
    assert_same_records(moved(records_of(replay), DAY_MS), records_of(live))


def test_the_worker_gives_what_the_pure_core_gives(runs: tuple[Run, Run]) -> None:
    live, _ = runs
    assert_same_records(records_of(live), run_live(build_stream(live.t0)))
