"""A worker's firing-alert series come back when a partition's state is loaded again.

The stream sends a firing alert once. A worker that restarts, or takes a partition over,
makes the partition's processor from the stored state, which hands the alerts still
firing to the worker's metrics (`NodeConfig.firing`, wired to `WorkerSinks.on_firing`):
the series are the ones the first worker showed, and nothing is produced.
"""

from __future__ import annotations

import dataclasses

import msgspec

from gpuwatch.harness.examples import example
from gpuwatch.run.worker_sinks import WorkerSinks
from schemas import ALERTS, NVML_SAMPLES, NvmlSample
from schemas.prices import BUILTIN_PRICES
from schemas.settings import Settings
from streams.core.integrals import PriceBook
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Source

PREFIX = "t."
SAMPLES = NVML_SAMPLES.full_name(PREFIX)
BASE = example("gpuwatch.nvml.sample/v1")  # one H100 of node gpu-node-17 held by ml/train-0
T0, S = BASE["ts"], 1000
FIRING = ("gpuwatch_alert_firing", "gpuwatch_alert_firing_since_seconds")

Series = set[tuple[str, tuple[tuple[str, str], ...], float]]


def series(sinks: WorkerSinks) -> Series:
    """The firing-alert series a scrape shows: name, labels, value."""
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in sinks.registry.collect()
        for s in family.samples
        if s.name in FIRING
    }


def config(**changes: object) -> NodeConfig:
    settings = Settings()  # idle alert after 60 s
    base = NodeConfig(PREFIX, 60 * S, 10 * S, settings.rules, PriceBook(BUILTIN_PRICES))
    return dataclasses.replace(base, **changes)


def feed(part: NodePartition, out: Outputs, first_s: int, last_s: int, util: float) -> None:
    """The example's node, one sample a second from T0 + `first_s`, its GPU at `util` %."""
    for t in range(first_s, last_s):
        reading = BASE["gpus"][0] | {"util_pct": util, "processes": []}
        item = msgspec.convert(BASE | {"ts": T0 + t * S, "seq": t, "gpus": [reading]}, NvmlSample)
        part.handle(Source(SAMPLES, 0, t, item.node.encode()), NVML_SAMPLES.encode(item), out)


def stored(part: NodePartition, table: dict[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """The partition's writes applied to its table: what a restart loads."""
    for key, value in part.take_writes():
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return list(table.items())


def test_series_come_back_on_a_new_worker_and_after_a_revoke_and_nothing_is_produced() -> None:
    first = WorkerSinks(Settings(), Counters())
    part = NodePartition(0, config(), Counters())
    out = Outputs(PREFIX, Counters(), observe=first.on_record)
    feed(part, out, 0, 61, util=1.0)  # idle 60 s: GpuIdleAllocated fires
    (fired,) = [ALERTS.decode(r.value) for r in out.records if r.topic == ALERTS.full_name(PREFIX)]
    shown = series(first)
    assert {(name, value) for name, _, value in shown} == {(FIRING[0], 1.0), (FIRING[1], T0 / 1000)}
    assert dict(next(iter(shown))[1])["pod"] == "train-0"
    table: dict[bytes, bytes] = {}
    writes = stored(part, table)

    # Another worker (a restart, or the partition's new owner) loads the state.
    second = WorkerSinks(Settings(), Counters())
    assert series(second) == set()
    again = NodePartition(0, config(firing=second.on_firing), Counters(), writes)
    assert series(second) == shown
    # Shown, not counted: the alert message was counted where it was received.
    counted = {"alertname": "GpuIdleAllocated", "severity": "warning", "status": "firing"}
    assert first.registry.get_sample_value("gpuwatch_alerts_total", counted) == 1
    assert second.registry.get_sample_value("gpuwatch_alerts_total", counted) is None
    again_out = Outputs(PREFIX, Counters(), observe=second.on_record)
    feed(again, again_out, 61, 62, util=1.0)  # the next sample: still idle, nothing sent
    assert [r for r in again_out.records if r.topic == ALERTS.full_name(PREFIX)] == []
    assert series(second) == shown

    # The same worker gives the partition up and gets it back.
    first.on_revoked([], [BASE["node"]])
    assert series(first) == set()
    NodePartition(0, config(firing=first.on_firing), Counters(), writes)
    assert series(first) == shown
    assert fired.status == "firing"


def test_a_stale_state_does_not_revive_an_alert_the_metrics_saw_resolved() -> None:
    """The rebuilt message has the sent one's ts, so it is a replay of it: a resolution
    seen since stays, though the state loaded (older than it) says firing."""
    sinks = WorkerSinks(Settings(), Counters())
    part = NodePartition(0, config(), Counters())
    out = Outputs(PREFIX, Counters(), observe=sinks.on_record)
    feed(part, out, 0, 61, util=1.0)
    writes = stored(part, {})  # stored while firing
    feed(part, out, 61, 62, util=90.0)  # busy: resolved
    assert series(sinks) == set()
    NodePartition(0, config(firing=sinks.on_firing), Counters(), writes)
    assert series(sinks) == set()
