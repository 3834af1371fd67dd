"""Units of work in the simulation, over HTTP: the node agents scrape the pods' counters
within their ticks, every 15 s of event time, onto the samples and `work.units`."""

from __future__ import annotations

from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from gpuwatch.harness.simulate.loop import SimClock, Simulation
from gpuwatch.harness.simulate.nodes import WorkSetup
from gpuwatch.harness.simulate.scenario import parse_scenario
from gpuwatch.harness.simulate.work import WorkCounters, WorkServer
from schemas.settings import AgentSettings
from schemas.topics import NVML_SAMPLES
from schemas.work_units import WorkUnits

EPOCH = 1_764_400_020  # on a minute: the 15 s scrape grid starts at the epoch
SCENARIO = """\
name: work
nodes:
  - pool: a
    gpus_per_node: 2
workloads:
  - name: train
    kind: training
    gpus: 1
    start_s: 0
    pull_s: 5
    duration_s: 100
    work: {steps: 10}
  - name: chat
    kind: inference
    gpus: 1
    start_s: -600
    work: {tokens: 1500, requests: 3}
"""


def test_the_agents_scrape_every_15_s_of_event_time_onto_samples_and_work_units() -> None:
    clock = SimClock(EPOCH)
    published: list[bytes] = []
    records: list[WorkUnits] = []
    server = WorkServer(WorkCounters(clock.time)).start()
    try:
        simulation = Simulation(
            parse_scenario(SCENARIO),
            api=FakeApiServer(clock=clock.time),  # never served: the mirror only writes
            publish_for=lambda _node: lambda _key, value: published.append(value),
            interval_s=1.0,
            clock=clock,
            work=WorkSetup(server.counters, server.port, records.append, AgentSettings()),
        )
        simulation.prepare()
        for _ in range(130):
            simulation.tick()
        simulation.fleet.close()
    finally:
        server.close()
    train = [r for r in records if r.pod == "train-0"]
    # Running from 5 s to 105 s: scraped at 15 s (the baseline), 30 s .. 105 s.
    assert [(r.ts // 1000 - EPOCH, r.units) for r in train] == [
        (t, {"steps": 150.0}) for t in (30, 45, 60, 75, 90, 105)
    ]
    assert [(r.start, r.resets) for r in train] == [(r.ts - 15_000, ()) for r in train]
    chat = [r for r in records if r.pod == "chat-0"]
    assert len(chat) == 7  # 30 s .. 120 s, after the baseline at 15 s
    assert [r.units for r in chat] == [{"tokens": 22_500.0, "requests": 45.0}] * 7
    samples = [NVML_SAMPLES.decode(v) for v in published]
    on_samples = [(s.ts // 1000 - EPOCH, w.units) for s in samples for w in s.work]
    # A scrape at t goes on the sample of the tick at t (its interval ends there).
    assert sorted(t for t, units in on_samples if "steps" in units) == [29, 44, 59, 74, 89, 104]
    total = sum(units.get("tokens", 0.0) for _, units in on_samples)
    assert total == 7 * 22_500.0
