"""The GPU alerts producers/simulate/scenarios/README.md promises for `incident`, from its
samples through the worker's own alert rules (streams.core.gpu_alerts), with the default
thresholds."""

from __future__ import annotations

from producers.simulate.kube.apiserver import FakeApiServer
from producers.simulate.loop import SimClock, Simulation
from producers.simulate.scenario import load_scenario
from schemas import NVML_SAMPLES, Alert
from schemas.settings import RuleSettings
from streams.core import gpu_alerts
from streams.core.gpu_alerts import NodeAlertState

EPOCH = 1_764_400_000


def incident_gpu_alerts(seconds: int) -> tuple[list[Alert], dict[str, str]]:
    """Every GPU and node alert of the first `seconds`; GPU uuid -> the pod holding it."""
    published: list[bytes] = []
    clock = SimClock(EPOCH)
    simulation = Simulation(
        load_scenario("incident"),
        api=FakeApiServer(clock=clock.time),  # never served: the mirror only writes to it
        publish_for=lambda _node: lambda _key, value: published.append(value),
        interval_s=1.0,
        clock=clock,
    )
    simulation.prepare()
    rules = RuleSettings()
    states: dict[str, NodeAlertState] = {}
    holders: dict[str, str] = {}
    alerts: list[Alert] = []
    for _ in range(seconds):
        simulation.tick()
        watermark = 0
        for value in published:
            sample = NVML_SAMPLES.decode(value)
            holders.update({d: a.pod for a in sample.allocations for d in a.device_ids})
            state, fired, _ = gpu_alerts.on_sample(states.get(sample.node), sample, rules)
            states[sample.node] = state
            alerts += fired
            watermark = max(watermark, sample.ts + sample.interval_ms)
        published.clear()
        for node, state in list(states.items()):
            states[node], fired = gpu_alerts.on_watermark(state, watermark, rules)
            alerts += fired
    return alerts, holders


def test_the_incident_raises_the_gpu_alerts_its_readme_lists() -> None:
    alerts, holders = incident_gpu_alerts(600)

    def at(alert: Alert) -> int:
        return alert.ts // 1000 - EPOCH

    idle = [
        (at(a), a.status, holders[a.subject.uuid or ""])
        for a in alerts
        if a.name == "GpuIdleAllocated"
    ]
    assert idle == [
        (60, "firing", "idle-job-0"),
        (60, "firing", "idle-job-0"),
        (60, "firing", "forgotten-notebook-0"),
        (254, "firing", "broken-trainer-0"),
        (275, "resolved", "broken-trainer-0"),
        (364, "firing", "broken-trainer-0"),
        (465, "resolved", "broken-trainer-0"),
        (554, "firing", "broken-trainer-0"),
    ]
    (leak,) = [a for a in alerts if a.name == "GpuUnallocatedAccess"]
    assert (at(leak), leak.status, leak.labels["node"]) == (125, "firing", "h100-0")
    assert leak.subject.uuid not in holders  # GPU 3 of h100-0: nobody holds it
    telemetry = [
        (at(a), a.status, a.labels["node"]) for a in alerts if a.name == "NodeTelemetryMissing"
    ]
    assert telemetry == [(430, "firing", "h100-2"), (490, "resolved", "h100-2")]
    assert {a.name for a in alerts} == {
        "GpuIdleAllocated",
        "GpuUnallocatedAccess",
        "NodeTelemetryMissing",
    }
