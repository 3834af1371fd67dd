"""The alerts a stored state says are firing, rebuilt as they were sent, and re-announced.

A worker that loads a partition's state (a restart, a partition taken over) shows its
firing alerts again without sending them again: `gpu_alerts.still_firing` and
`pod_alerts.still_firing` rebuild them, the processors hand them to their `firing` hook.
"""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import given
from test_gpu_alerts_fixtures import (
    GPU_A,
    GPU_B,
    MIG_1,
    NODE,
    POD_P,
    POD_Q,
    POD_R,
    RULES,
    T0,
    S,
    alloc,
    gpu,
    proc,
    run,
    sample,
)
from test_gpu_alerts_properties import BOUNDED, IDLE_S, MISSING_S, Event, apply, streams
from test_pod_fixtures import UID, WINDOWS, container, pod, usage
from test_pod_properties import NO_FIT, UNREADY, Input, histories, steps

from schemas import ALERTS, K8S_PODS, NVML_SAMPLES
from schemas.alert import Alert
from schemas.ids import GpuUuid, NodeName
from schemas.prices import BUILTIN_PRICES
from schemas.settings import RuleSettings
from streams.core.integrals import PriceBook
from streams.core.node import gpu_alerts
from streams.core.node.gpu_alerts import NodeAlertState
from streams.core.pod import pod_alerts
from streams.core.pod.pod_step import step_pod_event, step_usage, step_watermark
from streams.core.ticks import Tick
from streams.processors.node import NodeConfig, NodePartition
from streams.processors.outputs import Counters, Outputs, Source
from streams.processors.pod import PodConfig, PodPartition

PREFIX = "t."
GPU_C = GpuUuid("GPU-cccccccc-0000-4000-8000-000000000000")


def still_open(sent: list[Alert]) -> list[Alert]:
    """The last message of each alert whose last message is a firing one, by fingerprint."""
    last = {alert.fingerprint: alert for alert in sent}
    return sorted((a for a in last.values() if a.status == "firing"), key=lambda a: a.fingerprint)


def by_fingerprint(alerts: list[Alert]) -> list[Alert]:
    return sorted(alerts, key=lambda a: a.fingerprint)


# --- GPU and node alerts


def node_firing(state: NodeAlertState) -> list[Alert]:
    """`still_firing` of the state as stored (through JSON), with the properties' thresholds."""
    stored = msgspec.json.decode(msgspec.json.encode(state), type=NodeAlertState)
    return gpu_alerts.still_firing(
        stored, idle_alert_after_s=IDLE_S, telemetry_missing_after_s=MISSING_S
    )


@BOUNDED
@given(streams())
def test_a_node_state_gives_back_exactly_the_firing_messages_sent(events: list[Event]) -> None:
    """After every event: the alerts last sent firing, field for field; nothing resolved."""
    state: NodeAlertState | None = None
    sent: list[Alert] = []
    for event in events:
        state, (alerts, _) = apply(state, event)
        sent += alerts
        if state is not None:
            assert by_fingerprint(node_firing(state)) == still_open(sent)


def test_each_gpu_and_node_alert_kind_comes_back_and_resolved_ones_do_not() -> None:
    """Idle on a shared GPU (two holders) and on a MIG instance, a leak, missing telemetry."""
    shared = gpu(GPU_A, 1.0, sharing="time-slicing")
    instance = gpu(MIG_1, 1.0, parent_uuid=GPU_B, mig_profile="1g.10gb")
    leak = gpu(GPU_C, 40.0, proc(41, POD_R), proc(7, POD_R), index=2)
    held = [alloc(POD_P, GPU_A), alloc(POD_Q, GPU_A, MIG_1)]
    stream = [sample(T0 + t * S, [shared, instance, leak], held) for t in range(3)]
    params = {"idle_alert_after_s": 2, "telemetry_missing_after_s": 5}
    state, sent, _ = run(None, stream, **params)
    assert sorted(a.name for a in sent) == ["GpuIdleAllocated"] * 2 + ["GpuUnallocatedAccess"]
    assert {a.labels.get("pods") for a in sent} == {"ml/eval-1,ml/train-0", None}
    state, missing = gpu_alerts.on_watermark(state, T0 + 9 * S, RULES, telemetry_missing_after_s=5)
    sent += missing  # the idle runs end, NodeTelemetryMissing fires
    assert [a.status for a in missing] == ["resolved", "resolved", "firing"]
    rebuilt = gpu_alerts.still_firing(state, **params)
    assert [a.name for a in rebuilt] == ["GpuUnallocatedAccess", "NodeTelemetryMissing"]
    assert by_fingerprint(rebuilt) == still_open(sent)
    assert rebuilt[0].value == 2.0  # two pids at firing
    assert rebuilt[1].ts == T0 + 8 * S  # seen until T0 + 3 s, plus the threshold


def test_a_threshold_changed_since_keeps_the_series_since_and_labels() -> None:
    stream = [sample(T0 + t * S, [gpu(GPU_A, 1.0)], [alloc(POD_P, GPU_A)]) for t in range(3)]
    state, (sent,), _ = run(None, stream, idle_alert_after_s=2)
    (rebuilt,) = gpu_alerts.still_firing(state, idle_alert_after_s=60)
    assert (rebuilt.since, rebuilt.labels, rebuilt.subject) == (
        sent.since,
        sent.labels,
        sent.subject,
    )
    assert (rebuilt.ts, rebuilt.value) == (T0 + 60 * S, 60.0)  # not the 2 s it fired after


# --- pod alerts


@BOUNDED
@given(histories())
def test_a_pod_state_gives_back_the_firing_messages_sent(inputs: list[Input]) -> None:
    """Exactly, but for PodQueuedTooLong's summary: it names the reason the pod has now."""
    sent: list[Alert] = []
    for state, out in steps(inputs, stored=True):
        sent += out.alerts
        rebuilt = by_fingerprint(pod_alerts.still_firing(state, RULES))
        expected = still_open(sent)
        assert [a.name for a in rebuilt] == [a.name for a in expected]
        for got, want in zip(rebuilt, expected, strict=True):
            summary = got.summary
            if want.name == "PodQueuedTooLong":
                reason = state.reason or "no reason given"
                assert summary == f"ml/train-0 queued for 600 s ({reason})"
                summary = want.summary
            assert msgspec.structs.replace(got, summary=summary) == want


def test_a_stall_that_changed_reason_comes_back_with_the_reason_it_fired_for() -> None:
    rules = RuleSettings(stall_after_s=60)
    created = T0 - 10 * S
    state, _ = step_pod_event(None, pod("Running", ts=T0, rv=1, created_at=created), rules, WINDOWS)
    state, _ = step_usage(state, usage(T0, T0 + 10 * S), rules, WINDOWS)
    looping = [container("waiting", "CrashLoopBackOff", restarts=2)]
    crash = pod(
        "Running", ts=T0 + 20 * S, rv=2, created_at=created, containers=looping, conditions=UNREADY
    )
    state, out = step_pod_event(state, crash, rules, WINDOWS)
    (fired,) = out.alerts
    assert (fired.summary, fired.since, fired.ts) == (
        "ml/train-0 stalled: CrashLoopBackOff",
        T0 + 20 * S,
        T0 + 20 * S,
    )
    idle = usage(T0 + 10 * S, T0 + 200 * S, idle_since=T0 + 10 * S)
    state, out = step_usage(state, idle, rules, WINDOWS)
    healthy = pod("Running", ts=T0 + 210 * S, rv=3, created_at=created)
    state, out = step_pod_event(state, healthy, rules, WINDOWS)  # still stalled, now Idle
    assert (state.state, state.reason, out.alerts) == ("stalled", "Idle", [])
    assert pod_alerts.still_firing(state, rules) == [fired]


def test_an_idle_stall_comes_back_with_since_the_idle_run_began() -> None:
    rules = RuleSettings(stall_after_s=60)
    state, _ = step_pod_event(None, pod("Running", ts=T0, rv=1, created_at=T0), rules, WINDOWS)
    idle = usage(T0, T0 + 100 * S, idle_since=T0 + 5 * S)
    state, out = step_usage(state, idle, rules, WINDOWS)
    (fired,) = [a for a in out.alerts if a.name == "PodStalled"]
    assert (fired.since, fired.ts) == (T0 + 5 * S, T0 + 65 * S)
    assert pod_alerts.still_firing(state, rules) == [fired]


def test_a_queued_alert_of_a_pod_bound_later_comes_back_with_the_node_it_has_now() -> None:
    """The one label a pod alert's series can gain after firing: the state keeps the
    pod's current names only."""
    waiting = pod("Pending", ts=T0, rv=1, created_at=T0, containers=[], conditions=NO_FIT)
    unbound = msgspec.structs.replace(waiting, node=None)
    state, _ = step_pod_event(None, unbound, RULES, WINDOWS)
    state, out = step_watermark(state, T0 + 601 * S, RULES, WINDOWS)
    (fired,) = out.alerts
    assert "node" not in fired.labels
    bound = pod("Pending", ts=T0 + 602 * S, rv=2, created_at=T0)
    state, out = step_pod_event(state, bound, RULES, WINDOWS)
    assert out.alerts == []  # still queued
    (rebuilt,) = pod_alerts.still_firing(state, RULES)
    assert (rebuilt.ts, rebuilt.since) == (fired.ts, fired.since)
    assert rebuilt.fingerprint == fired.fingerprint
    assert rebuilt.labels == fired.labels | {"node": "gpu-node-17"}


# --- the processors


def node_config(**changes: object) -> NodeConfig:
    config = NodeConfig(PREFIX, 60 * S, 10 * S, RULES, PriceBook(BUILTIN_PRICES))
    return dataclasses.replace(config, **changes)


def sent_alerts(out: Outputs) -> list[Alert]:
    name = ALERTS.full_name(PREFIX)
    return [ALERTS.decode(r.value) for r in out.records if r.topic == name]


def test_a_node_partition_made_from_stored_state_re_announces_its_firing_alerts() -> None:
    """Idle 60 s and a leak fire; the leak resolves; a partition made from the stored
    writes hands the idle alert, as sent, to its hook."""
    counters = Counters()
    first, out = NodePartition(0, node_config(), counters), Outputs(PREFIX, counters)
    leaking = gpu(GPU_B, 30.0, proc(9, POD_R))
    for t in range(70):
        gpus = [gpu(GPU_A, 1.0), leaking if t < 65 else gpu(GPU_B, 30.0)]
        item = sample(T0 + t * S, gpus, [alloc(POD_P, GPU_A)], seq=t)
        first.handle(
            Source(NVML_SAMPLES.full_name(PREFIX), 0, t, item.node.encode()),
            NVML_SAMPLES.encode(item),
            out,
        )
    sent = sent_alerts(out)
    assert [(a.name, a.status) for a in sent] == [
        ("GpuUnallocatedAccess", "firing"),
        ("GpuIdleAllocated", "firing"),
        ("GpuUnallocatedAccess", "resolved"),
    ]
    stored = [(k, v) for k, v in first.take_writes() if v is not None]
    heard: list[Alert] = []
    again = NodePartition(0, node_config(firing=heard.append), Counters(), stored)
    assert heard == [sent[1]]
    assert NODE in again.nodes


def test_a_node_partition_re_announces_missing_telemetry() -> None:
    """A node silent while another goes on: missing once stream time passes the threshold."""
    counters = Counters()
    first, out = NodePartition(0, node_config(), counters), Outputs(PREFIX, counters)
    other = NodeName("gpu-node-18")
    items = [sample(T0, [gpu(GPU_A, 50.0)], seq=0)]
    items += [
        msgspec.structs.replace(sample(T0 + t * S, [gpu(GPU_B, 50.0)]), node=other)
        for t in range(1, 41)
    ]
    for i, item in enumerate(items):
        first.handle(
            Source(NVML_SAMPLES.full_name(PREFIX), 0, i, item.node.encode()),
            NVML_SAMPLES.encode(item),
            out,
        )
    first.on_tick(Tick(sender="w", claims={0: T0 + 40 * S}), out)
    (fired,) = sent_alerts(out)
    assert (fired.name, fired.status, fired.since) == ("NodeTelemetryMissing", "firing", T0 + S)
    heard: list[Alert] = []
    stored = [(k, v) for k, v in first.take_writes() if v is not None]
    NodePartition(0, node_config(firing=heard.append), Counters(), stored)
    assert heard == [fired]


def test_a_pod_partition_made_from_stored_state_re_announces_its_firing_alerts() -> None:
    counters = Counters()
    config = PodConfig(PREFIX, 1, RULES, WINDOWS)
    first, out = PodPartition(0, config, counters), Outputs(PREFIX, counters)
    event = K8S_PODS.encode(pod("Pending", ts=T0, rv=1, created_at=T0))
    first.handle(Source(K8S_PODS.full_name(PREFIX), 0, 0, UID.encode()), event, out)
    first.on_tick(Tick(sender="w", claims={0: T0 + 700 * S}), out)
    (fired,) = sent_alerts(out)
    assert (fired.name, fired.status, fired.subject.uid) == ("PodQueuedTooLong", "firing", UID)
    stored = [(k, v) for k, v in first.take_writes() if v is not None]
    heard: list[Alert] = []
    again = PodPartition(0, dataclasses.replace(config, firing=heard.append), counters, stored)
    assert heard == [fired]
    assert list(again.pods) == [UID]
    running = K8S_PODS.encode(pod("Running", ts=T0 + 800 * S, rv=2, created_at=T0))
    first.handle(Source(K8S_PODS.full_name(PREFIX), 0, 1, UID.encode()), running, out)
    first.on_tick(Tick(sender="w", claims={0: T0 + 900 * S}), out)
    assert [a.status for a in sent_alerts(out)] == ["firing", "resolved"]
    stored = [(k, v) for k, v in first.take_writes() if v is not None]
    heard.clear()
    PodPartition(0, dataclasses.replace(config, firing=heard.append), counters, stored)
    assert heard == []  # resolved: nothing to show
