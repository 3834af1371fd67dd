"""The GPU alerts gpuwatch/harness/simulate/scenarios/README.md promises for `incident`, from its
samples through the worker's own alert rules (streams.core.node.gpu_alerts), with the default
thresholds."""

from __future__ import annotations

from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from gpuwatch.harness.simulate.loop import SimClock, Simulation
from gpuwatch.harness.simulate.scenario import load_scenario
from schemas import NVML_SAMPLES, Alert
from schemas.settings import RuleSettings
from streams.core.node import gpu_alerts
from streams.core.node.gpu_alerts import NodeAlertState

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
    # A fault at_s = t shows in the sample of [t, t + 1 s) (ts = t), read at t + 1 s.
    # Xid 79 on GPU 0 of h100-2 at 150 s: in the sample of 150 s, firing then; the hold of
    # 300 s counts from that sample's end, 151 s: resolved at 451 s (h100-2 is silent from
    # 400 to 490 s, but the other nodes' stream time passes it).
    # hw_thermal_slowdown on h100-0's GPU 0 from 200 s for 180 s: samples 200..379 s list
    # it; active 60 s at 260 s (the end of sample 259 s); sample 380 s has none: resolved.
    health = sorted(
        [
            (at(a), a.name, a.status, a.severity, a.labels["node"], a.labels.get("xid"), a.labels)
            for a in alerts
            if a.name in ("GpuXidError", "GpuThrottled")
        ],
        key=lambda row: row[:6],
    )
    assert [row[:6] for row in health] == [
        (150, "GpuXidError", "firing", "critical", "h100-2", "79"),
        (260, "GpuThrottled", "firing", "warning", "h100-0", None),
        (380, "GpuThrottled", "resolved", "warning", "h100-0", None),
        (451, "GpuXidError", "resolved", "critical", "h100-2", "79"),
    ]
    xid, throttled = health[0][6], health[1][6]
    assert (xid["pod"], holders[xid["gpu"]]) == ("train-a-0", "train-a-0")
    assert (throttled["pod"], throttled["reasons"]) == ("chat-serving-0", "hw_thermal_slowdown")
    assert holders[throttled["gpu"]] == "chat-serving-0"
    assert {a.name for a in alerts} == {
        "GpuIdleAllocated",
        "GpuUnallocatedAccess",
        "NodeTelemetryMissing",
        "GpuXidError",
        "GpuThrottled",
    }
