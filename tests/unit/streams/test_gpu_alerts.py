"""GPU and node alerts worked by hand: idle allocations, leaks, missing telemetry, seq gaps."""

from __future__ import annotations

import msgspec
from test_gpu_alerts_fixtures import (
    GPU_A,
    GPU_B,
    MIG_1,
    MODEL,
    NODE,
    POD_P,
    POD_Q,
    POD_R,
    RULES,
    T0,
    S,
    alloc,
    brief,
    gpu,
    proc,
    run,
    sample,
)

from schemas.alert import TOPIC as ALERTS
from schemas.nvml_sample import GpuProcess, NvmlSample
from streams.core.alert_identity import fingerprint
from streams.core.node.gpu_alerts import NodeAlertState, on_node_removed, on_sample, on_watermark


def idle_p(ts: int, util: float | None = 2.0) -> NvmlSample:
    """GPU A held by pod P at `util` %, GPU B free and busy."""
    return sample(ts, [gpu(GPU_A, util), gpu(GPU_B, 90.0)], [alloc(POD_P, GPU_A)])


def seconds(first: int, last: int, util: float | None = 2.0) -> list[NvmlSample]:
    """One sample a second, starting at T0 + first s through T0 + last s."""
    return [idle_p(T0 + t * S, util) for t in range(first, last + 1)]


def test_idle_allocated_fires_at_idle_since_plus_60_s_and_resolves_when_busy() -> None:
    state, out, lost = run(None, seconds(0, 58))
    assert (out, lost) == ([], 0)
    state, out, _ = run(state, [idle_p(T0 + 59 * S)])  # covers [59 s, 60 s): idle 60 s
    (alert,) = out
    assert brief([alert]) == [("GpuIdleAllocated", "firing", 60 * S, 0, 60.0)]
    assert alert.severity == "warning"
    assert alert.fingerprint == fingerprint("GpuIdleAllocated", "gpu", GPU_A)
    assert (alert.subject.kind, alert.subject.uid, alert.subject.uuid, alert.subject.node) == (
        "gpu",
        None,
        GPU_A,
        NODE,
    )
    assert alert.labels == {
        "node": NODE,
        "gpu": GPU_A,
        "model": MODEL,
        "namespace": "ml",
        "pod": "train-0",
    }
    assert alert.summary == f"{GPU_A} ({MODEL}) on {NODE} allocated to ml/train-0 and idle for 60 s"
    assert ALERTS.decode(ALERTS.encode(alert)) == alert
    state, out, _ = run(state, seconds(60, 64))
    assert out == []  # fires once
    state, out, _ = run(state, [idle_p(T0 + 65 * S, util=50.0)])
    (resolved,) = out
    assert brief([resolved]) == [("GpuIdleAllocated", "resolved", 65 * S, 0, 65.0)]
    assert resolved.fingerprint == alert.fingerprint
    assert resolved.labels == alert.labels
    assert resolved.summary == f"{GPU_A} on {NODE} no longer idle-allocated (busy) after 65 s"
    assert state.idle == {}


def test_reprocessing_the_same_samples_emits_nothing_again() -> None:
    stream = [*seconds(0, 70), idle_p(T0 + 71 * S, util=50.0)]
    state, out, _ = run(None, stream)
    assert [a.status for a in out] == ["firing", "resolved"]
    again, out, lost = run(state, stream)
    assert (out, lost, again) == ([], 0, state)
    # Crash after the firing, state restored from before it: the same firing, same identity.
    middle, _, _ = run(None, seconds(0, 30))
    _, replayed, _ = run(middle, stream)
    assert [(a.fingerprint, a.status, a.ts) for a in replayed] == [
        (a.fingerprint, a.status, a.ts) for a in run(None, stream)[1]
    ]


def test_a_busy_second_restarts_the_idle_run() -> None:
    stream = [*seconds(0, 29), idle_p(T0 + 30 * S, util=5.0), *seconds(31, 90)]
    _, out, _ = run(None, stream)  # 5 % is not under the 5 % threshold
    assert brief(out) == [("GpuIdleAllocated", "firing", 91 * S, 31 * S, 60.0)]


def test_an_unallocated_idle_gpu_never_fires_and_losing_the_allocation_resolves() -> None:
    free = [sample(T0 + t * S, [gpu(GPU_A, 0.0)]) for t in range(600)]
    assert run(None, free)[1] == []
    state, _, _ = run(None, seconds(0, 60))
    _, out, _ = run(state, [sample(T0 + 61 * S, [gpu(GPU_A, 0.0)])])
    assert brief(out) == [("GpuIdleAllocated", "resolved", 61 * S, 0, 61.0)]
    assert "(not allocated)" in out[0].summary


def test_unknown_utilization_is_not_idle() -> None:
    _, out, _ = run(None, seconds(0, 600, util=None))
    assert out == []
    # A MIG instance without per-process data: util null, never idle, never fires.
    mig = gpu(MIG_1, None, proc(7, POD_P), sharing="mig", parent_uuid=GPU_A, mig_profile="1g.10gb")
    parent = gpu(GPU_A, None, sharing="mig")
    stream = [sample(T0 + t * S, [parent, mig], [alloc(POD_P, MIG_1)]) for t in range(0, 600, 10)]
    assert run(None, [msgspec.structs.replace(s, interval_ms=10 * S) for s in stream])[1] == []
    # A firing alert ends when the reading turns unknown: the idle run is broken.
    state, _, _ = run(None, seconds(0, 60))
    _, out, _ = run(state, seconds(61, 61, util=None))
    assert brief(out) == [("GpuIdleAllocated", "resolved", 61 * S, 0, 61.0)]
    assert "(unknown)" in out[0].summary


def test_shared_gpu_fires_only_when_every_holder_is_idle_by_its_own_share() -> None:
    def shared(ts: int, p_sm: float, q_sm: float) -> NvmlSample:
        reading = gpu(
            GPU_A,
            p_sm + q_sm,
            proc(1, POD_P, sm=p_sm),
            proc(2, POD_Q, sm=q_sm),
            sharing="time-slicing",
        )
        return sample(ts, [reading], [alloc(POD_P, GPU_A), alloc(POD_Q, GPU_A)])

    busy_q = [shared(T0 + t * S, 1.0, 40.0) for t in range(120)]
    assert run(None, busy_q)[1] == []  # P idle, Q computing: the GPU is not idle-allocated
    both = [shared(T0 + t * S, 1.0, 2.0) for t in range(60)]
    _, out, _ = run(None, both)
    (alert,) = out
    assert brief([alert]) == [("GpuIdleAllocated", "firing", 60 * S, 0, 60.0)]
    assert alert.labels["pods"] == "ml/eval-1,ml/train-0"
    assert "namespace" not in alert.labels


def test_a_short_gap_is_bridged_and_its_seqs_counted() -> None:
    stream = [*seconds(0, 20), *seconds(31, 59)]  # 10 samples lost
    _, out, lost = run(None, stream)
    assert lost == 10
    assert brief(out) == [("GpuIdleAllocated", "firing", 60 * S, 0, 60.0)]


def test_a_gpu_gone_from_the_sample_resolves_its_alert() -> None:
    state, _, _ = run(None, seconds(0, 60))
    _, out, _ = run(state, [sample(T0 + 61 * S, [gpu(GPU_B, 90.0)], [alloc(POD_P, GPU_A)])])
    assert brief(out) == [("GpuIdleAllocated", "resolved", 61 * S, 0, 61.0)]
    assert "(no longer reported)" in out[0].summary


def test_idle_threshold_is_a_parameter() -> None:
    _, out, _ = run(None, seconds(0, 4), idle_alert_after_s=5)
    assert brief(out) == [("GpuIdleAllocated", "firing", 5 * S, 0, 5.0)]
    assert out[0].summary.endswith("idle for 5 s")


def leak_sample(ts: int, *procs_on_a: GpuProcess) -> NvmlSample:
    """GPU A held by P and B by R, busy; pod Q holds nothing; processes on A as given."""
    a = gpu(GPU_A, 80.0, proc(10, POD_P), *procs_on_a)
    return sample(ts, [a, gpu(GPU_B, 80.0)], [alloc(POD_P, GPU_A), alloc(POD_R, GPU_B)])


def test_unallocated_access_fires_at_the_sample_and_resolves_when_the_process_is_gone() -> None:
    first = leak_sample(T0, proc(4242, POD_R), proc(4243, POD_R))
    state, out, _ = run(None, [first])
    (alert,) = out
    assert brief([alert]) == [("GpuUnallocatedAccess", "firing", 0, 0, 2.0)]
    assert alert.severity == "critical"
    assert alert.fingerprint == fingerprint("GpuUnallocatedAccess", "gpu", f"{GPU_A}/{POD_R}")
    assert (alert.subject.kind, alert.subject.uuid, alert.subject.node) == ("gpu", GPU_A, NODE)
    assert alert.labels == {
        "node": NODE,
        "gpu": GPU_A,
        "model": MODEL,
        "pod_uid": POD_R,
        "pids": "4242,4243",
        "namespace": "research",
        "pod": "nb-2",
    }
    assert alert.summary == (
        f"pod research/nb-2 runs pid 4242,4243 on {GPU_A} ({MODEL}) on {NODE}"
        " without an allocation of it"
    )
    state, out, _ = run(state, [leak_sample(T0 + S, proc(4242, POD_R)), first])
    assert out == []  # still leaking; the replayed first sample changes nothing
    state, out, _ = run(state, [leak_sample(T0 + 2 * S)])
    (resolved,) = out
    assert brief([resolved]) == [("GpuUnallocatedAccess", "resolved", 2 * S, 0, 0.0)]
    assert resolved.fingerprint == alert.fingerprint
    assert resolved.summary == f"pod research/nb-2 no longer runs on {GPU_A} ({MODEL}) on {NODE}"
    assert state.leaks == {}


def test_host_processes_and_own_processes_do_not_fire_the_leak_rule() -> None:
    host = sample(T0, [gpu(GPU_B, 50.0, proc(1, None), proc(2, None))])  # unallocated GPU
    own = leak_sample(T0 + S, proc(11, POD_P))
    assert run(None, [host, own])[1] == []


def test_a_leaking_pod_with_no_allocation_on_the_node_is_named_by_uid() -> None:
    _, out, _ = run(None, [leak_sample(T0, proc(9, POD_Q))])
    (alert,) = out
    assert "pod" not in alert.labels
    assert alert.labels["pod_uid"] == POD_Q
    assert alert.summary.startswith(f"pod {POD_Q} runs pid 9 on {GPU_A}")


def test_a_pod_holding_the_parent_gpu_may_run_on_its_mig_instance() -> None:
    mig = gpu(MIG_1, 30.0, proc(5, POD_P), sharing="mig", parent_uuid=GPU_A, mig_profile="3g.40gb")
    held = sample(T0, [gpu(GPU_A, None, sharing="mig"), mig], [alloc(POD_P, GPU_A)])
    assert run(None, [held])[1] == []
    foreign = sample(T0, [gpu(GPU_A, None, sharing="mig"), mig], [alloc(POD_Q, GPU_A)])
    (alert,) = run(None, [foreign])[1]
    assert alert.labels["gpu"] == MIG_1
    assert alert.labels["mig_profile"] == "3g.40gb"


def test_telemetry_missing_fires_on_a_tick_and_resolves_when_a_sample_arrives() -> None:
    state, _, _ = run(None, seconds(0, 9, util=50.0))  # seen until T0 + 10 s
    state, out = on_watermark(state, T0 + 40 * S, RULES)
    assert out == []  # exactly 30 s old: not older than the threshold
    state, out = on_watermark(state, T0 + 40 * S + 1, RULES)
    (alert,) = out
    assert brief([alert]) == [("NodeTelemetryMissing", "firing", 40 * S, 10 * S, 30.0)]
    assert alert.severity == "critical"
    assert alert.fingerprint == fingerprint("NodeTelemetryMissing", "node", NODE)
    assert (alert.subject.kind, alert.subject.uuid, alert.subject.node) == ("node", None, NODE)
    assert alert.labels == {"node": NODE}
    assert alert.summary == f"no NVML samples from {NODE} for 30 s"
    state, out = on_watermark(state, T0 + 50 * S, RULES)
    assert out == []  # fires once
    state, out, lost = on_sample(state, idle_p(T0 + 55 * S, util=50.0), RULES)
    assert lost == 45  # seqs 10..54
    assert brief(out) == [("NodeTelemetryMissing", "resolved", 55 * S, 10 * S, 45.0)]
    assert out[0].summary == f"NVML samples from {NODE} again after 45 s"
    assert not state.missing


def test_telemetry_missing_found_by_the_sample_after_a_long_gap() -> None:
    state, _, _ = run(None, seconds(0, 9, util=50.0))
    _, out, _ = on_sample(state, idle_p(T0 + 100 * S, util=50.0), RULES)
    assert brief(out) == [
        ("NodeTelemetryMissing", "firing", 40 * S, 10 * S, 30.0),
        ("NodeTelemetryMissing", "resolved", 100 * S, 10 * S, 90.0),
    ]
    _, out, _ = on_sample(state, idle_p(T0 + 40 * S, util=50.0), RULES)
    assert out == []  # a gap of exactly the threshold is no missing telemetry


def test_missing_telemetry_ends_idle_runs_at_the_last_sample() -> None:
    state, _, _ = run(None, seconds(0, 69))  # idle firing at 60 s, seen until 70 s
    state, out = on_watermark(state, T0 + 101 * S, RULES, telemetry_missing_after_s=30)
    assert brief(out) == [
        ("GpuIdleAllocated", "resolved", 70 * S, 0, 70.0),
        ("NodeTelemetryMissing", "firing", 100 * S, 70 * S, 30.0),
    ]
    assert "(telemetry missing)" in out[0].summary
    _, out, _ = run(state, seconds(110, 170))  # a new run from the first sample back
    assert brief(out) == [
        ("NodeTelemetryMissing", "resolved", 110 * S, 70 * S, 40.0),
        ("GpuIdleAllocated", "firing", 170 * S, 110 * S, 60.0),
    ]


def test_an_old_tick_after_a_restart_changes_nothing() -> None:
    state, _, _ = run(None, seconds(0, 9, util=50.0))
    state, _ = on_watermark(state, T0 + 41 * S, RULES)
    state, _, _ = on_sample(state, idle_p(T0 + 42 * S, util=50.0), RULES)
    assert on_watermark(state, T0 + 41 * S, RULES) == (state, [])
    assert on_watermark(NodeAlertState(node=NODE), T0, RULES)[1] == []  # never seen: no alert


def test_seq_gaps_and_resets_are_counted() -> None:
    def at(second: int, seq: int) -> NvmlSample:
        return sample(T0 + second * S, [gpu(GPU_B, 90.0)], seq=seq)

    state, _, lost = on_sample(None, at(0, 81234), RULES)
    assert lost == 0  # the first sample seen: nothing known before it
    state, _, lost = on_sample(state, at(1, 81235), RULES)
    assert lost == 0
    state, _, lost = on_sample(state, at(7, 81241), RULES)
    assert lost == 5
    state, _, lost = on_sample(state, at(9, 0), RULES)
    assert lost == 0  # the agent restarted and counts from 0 again
    state, _, lost = on_sample(state, at(13, 3), RULES)
    assert lost == 2
    state, _, lost = on_sample(state, at(20, 2), RULES)
    assert lost == 2  # a reset to 2: seqs 0 and 1 of the new run are lost
    again, out, lost = on_sample(state, at(20, 2), RULES)
    assert (again, out, lost) == (state, [], 0)  # a duplicate is not a reset


def idle_and_leaking() -> NodeAlertState:
    """GPU A idle-allocated to P (firing) while Q's process leaks onto it (firing)."""
    state, _, _ = run(None, seconds(0, 59))
    a = gpu(GPU_A, 1.0, proc(3, POD_Q, sm=1.0))  # P holds A and runs nothing: share 0, idle
    leaky = sample(T0 + 60 * S, [a, gpu(GPU_B, 90.0)], [alloc(POD_P, GPU_A)])
    state, out, _ = on_sample(state, leaky, RULES)
    assert [(a.name, a.status) for a in out] == [("GpuUnallocatedAccess", "firing")]
    return state


def test_node_removed_resolves_everything_firing() -> None:
    state = idle_and_leaking()
    assert state.idle[GPU_A].firing
    state, out = on_node_removed(state, T0 + 100 * S)
    assert brief(out) == [
        ("GpuIdleAllocated", "resolved", 100 * S, 0, 100.0),
        ("GpuUnallocatedAccess", "resolved", 100 * S, 60 * S, 0.0),
    ]
    assert "(node removed)" in out[0].summary
    state = idle_and_leaking()
    state, _ = on_watermark(state, T0 + 200 * S, RULES)  # the idle run ends; the leak stays
    assert (state.missing, state.idle, list(state.leaks)) == (True, {}, [f"{GPU_A}/{POD_Q}"])
    state, out = on_node_removed(state, T0 + 300 * S)
    assert brief(out) == [
        ("GpuUnallocatedAccess", "resolved", 300 * S, 60 * S, 0.0),
        ("NodeTelemetryMissing", "resolved", 300 * S, 61 * S, 239.0),
    ]
    assert state == NodeAlertState(node=NODE, watermark=T0 + 200 * S)


def test_state_round_trips_through_json() -> None:
    state = idle_and_leaking()
    raw = msgspec.json.encode(state)
    assert msgspec.json.decode(raw, type=NodeAlertState) == state
    assert raw.count(b'"firing":true') == 2
    assert len(raw) < 1000  # a Table changelog write per node sample: keep it small
