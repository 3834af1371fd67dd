"""GPU health alerts worked by hand: Xid errors, uncorrectable ECC, failed row remapping and
slowdowns, each naming the pods that held the GPU when it happened."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
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
    run,
    sample,
)

from schemas.alert import TOPIC as ALERTS
from schemas.ids import GpuUuid
from schemas.nvml_sample import GpuReading, NvmlSample, RemappedRows
from streams.core.alert_identity import fingerprint
from streams.core.node.gpu_alerts import (
    NodeAlertState,
    on_node_removed,
    on_sample,
    on_watermark,
    still_firing,
)
from streams.core.node.gpu_health import xid_meaning

MIG_2 = GpuUuid("MIG-22222222-0000-4000-8000-000000000000")
ROWS_OK = RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=False)
ROWS_FAILED = RemappedRows(correctable=0, uncorrectable=3, pending=True, failed=True)


def healthy(uuid: GpuUuid = GPU_A, util: float = 90.0, **changes: Any) -> GpuReading:
    """An H100 reading with every health reading present and clean."""
    fields: dict[str, Any] = {
        "throttle_reasons": (),
        "remapped_rows": ROWS_OK,
        "pcie_replays": 0,
    }
    return gpu(uuid, util, **(fields | changes))


def held(ts: int, *gpus: GpuReading) -> NvmlSample:
    """GPU A held by pod P, GPU B (when listed) by pod Q."""
    return sample(ts, gpus, [alloc(POD_P, GPU_A), alloc(POD_Q, GPU_B)])


def health(alerts: list[Any]) -> list[Any]:
    names = {"GpuXidError", "GpuEccUncorrectable", "GpuRowRemapFailure", "GpuThrottled"}
    return [a for a in alerts if a.name in names]


def test_an_xid_fires_on_its_sample_naming_the_pod_and_resolves_after_the_hold() -> None:
    state, out, _ = run(None, [held(T0, healthy(), healthy(GPU_B))])
    assert health(out) == []
    state, out, _ = run(state, [held(T0 + S, healthy(xid_errors=(79,)), healthy(GPU_B))])
    (alert,) = out
    assert brief(out) == [("GpuXidError", "firing", S, S, 79.0)]
    assert alert.severity == "critical"
    assert alert.fingerprint == fingerprint("GpuXidError", "gpu", f"{GPU_A}/79")
    assert alert.labels == {
        "node": NODE, "gpu": GPU_A, "model": MODEL, "xid": "79",
        "namespace": "ml", "pod": "train-0", "pod_uid": POD_P,
    }  # fmt: skip
    assert alert.summary == (
        f"Xid 79 (GPU has fallen off the bus) on {GPU_A} ({MODEL}) on {NODE}; "
        "held by pod ml/train-0"
    )
    ALERTS.decode(ALERTS.encode(alert))  # the topic's schema takes it
    # The GPU falls off the bus: no more readings of it. Stream time alone resolves it.
    state, out, _ = run(state, [held(T0 + 2 * S, healthy(GPU_B))])
    assert out == []
    state, out = on_watermark(state, T0 + 301 * S, RULES)
    assert health(out) == []  # last report [1 s, 2 s): the 300 s hold ends at 302 s
    state, out = on_watermark(state, T0 + 303 * S, RULES)
    out = health(out)  # the node is silent too by now: NodeTelemetryMissing
    assert brief(out) == [("GpuXidError", "resolved", 302 * S, S, 79.0)]
    assert out[0].summary == f"no Xid 79 on {GPU_A} ({MODEL}) on {NODE} for 300 s"
    assert state.faults == {}


def test_an_xid_reported_again_extends_its_alert_and_a_replay_repeats_nothing() -> None:
    first = held(T0, healthy(xid_errors=(13, 13)))
    state, out, _ = run(None, [first])
    assert brief(out) == [("GpuXidError", "firing", 0, 0, 13.0)]
    assert out[0].severity == "warning"  # an application's fault, not the GPU's
    again, _, _ = run(state, [first])
    assert again == state  # a redelivered sample changes nothing
    state, out, _ = run(state, [held(T0 + 200 * S, healthy(xid_errors=(13,)))])
    assert health(out) == []
    state, out = on_watermark(state, T0 + 400 * S, RULES)
    assert health(out) == []
    state, out = on_watermark(state, T0 + 501 * S, RULES)
    assert brief(health(out)) == [("GpuXidError", "resolved", 501 * S, 0, 13.0)]


def test_two_codes_are_two_alerts_and_an_unknown_code_is_named_by_its_number() -> None:
    _, out, _ = run(None, [held(T0, healthy(xid_errors=(200, 48)))])
    assert [(a.labels["xid"], a.severity) for a in out] == [("48", "critical"), ("200", "critical")]
    assert "Xid 200 (Xid 200)" in out[1].summary
    assert xid_meaning(94) == ("contained ECC error", "warning")
    assert len({a.fingerprint for a in out}) == 2


def test_a_fault_on_a_time_sliced_gpu_names_every_sharing_pod() -> None:
    shared = healthy(sharing="time-slicing", xid_errors=(43,))
    allocations = [alloc(POD_P, GPU_A), alloc(POD_Q, GPU_A), alloc(POD_R, GPU_A)]
    _, out, _ = run(None, [sample(T0, [shared], allocations)])
    (alert,) = out
    assert alert.labels["pods"] == "ml/eval-1,ml/train-0,research/nb-2"
    assert alert.labels["pod_uids"] == ",".join([POD_Q, POD_P, POD_R])
    assert "pod" not in alert.labels
    assert alert.summary.endswith("held by pods ml/eval-1, ml/train-0, research/nb-2")


def _mig(xid_on_instance: tuple[int, ...] = (), **parent: Any) -> NvmlSample:
    """GPU A in MIG mode with two instances: MIG 1 held by P, MIG 2 by Q."""
    base = healthy(util=None, **parent)  # type: ignore[arg-type]
    instance: dict[str, Any] = {
        "parent_uuid": GPU_A, "mig_profile": "3g.40gb", "sharing": "mig", "power_w": None,
        "ecc_dbe": None, "throttle_reasons": None, "remapped_rows": None,
    }  # fmt: skip
    one = gpu(MIG_1, None, **(instance | {"xid_errors": xid_on_instance}))
    two = gpu(MIG_2, None, **instance)
    return sample(T0, [base, one, two], [alloc(POD_P, MIG_1), alloc(POD_Q, MIG_2)])


def test_a_mig_instance_fault_names_the_instance_pod_and_a_gpu_fault_every_instance_pod() -> None:
    _, out, _ = run(None, [_mig(xid_on_instance=(31,))])
    (alert,) = out
    assert (alert.subject.uuid, alert.labels["mig_profile"]) == (MIG_1, "3g.40gb")
    assert (alert.labels["pod"], alert.labels["pod_uid"]) == ("train-0", POD_P)
    _, out, _ = run(None, [_mig(xid_errors=(79,))])
    (alert,) = out
    assert alert.subject.uuid == GPU_A
    assert alert.labels["pods"] == "ml/eval-1,ml/train-0"


def test_ecc_fires_when_the_double_bit_count_rises_and_resolves_when_it_reads_0() -> None:
    state, out, _ = run(None, [held(T0, healthy(ecc_dbe=0))])
    state, out, _ = run(state, [held(T0 + S, healthy(ecc_dbe=1))])
    assert brief(out) == [("GpuEccUncorrectable", "firing", S, S, 1.0)]
    assert out[0].summary.startswith(f"1 uncorrectable ECC error(s) on {GPU_A}")
    assert out[0].labels["pod"] == "train-0"
    state, out, _ = run(state, [held(T0 + 2 * S, healthy(ecc_dbe=2))])
    assert out == []  # still firing: one alert until the GPU is reset
    assert state.dbe == {GPU_A: 2}
    state, out, _ = run(state, [held(T0 + 3 * S, healthy(ecc_dbe=None))])
    assert out == []  # unknown is not healthy
    state, out, _ = run(state, [held(T0 + 4 * S, healthy(ecc_dbe=0))])
    assert brief(out) == [("GpuEccUncorrectable", "resolved", 4 * S, S, 1.0)]
    assert (state.faults, state.dbe) == ({}, {})


def test_a_count_above_0_at_the_first_reading_fires() -> None:
    _, out, _ = run(None, [held(T0, healthy(ecc_dbe=3))])
    assert brief(out) == [("GpuEccUncorrectable", "firing", 0, 0, 3.0)]


def test_a_failed_row_remapping_fires_while_the_gpu_reports_it() -> None:
    state, out, _ = run(None, [held(T0, healthy(remapped_rows=ROWS_FAILED))])
    assert brief(out) == [("GpuRowRemapFailure", "firing", 0, 0, 1.0)]
    assert "cannot be repaired" in out[0].summary
    state, out, _ = run(state, [held(T0 + S, healthy(remapped_rows=None))])
    assert out == []
    state, out, _ = run(state, [held(T0 + 2 * S, healthy(remapped_rows=ROWS_OK))])
    assert brief(out) == [("GpuRowRemapFailure", "resolved", 2 * S, 0, 1.0)]


def _throttled(t: int, *reasons: str, util: float = 90.0) -> NvmlSample:
    return held(T0 + t * S, healthy(throttle_reasons=reasons, util=util))


def test_a_slowdown_fires_after_60_s_with_its_reasons_and_resolves_when_it_ends() -> None:
    state, out, _ = run(None, [_throttled(t, "hw_thermal_slowdown") for t in range(59)])
    assert out == []
    state, out, _ = run(state, [_throttled(59, "hw_thermal_slowdown", "hw_power_brake_slowdown")])
    (alert,) = out
    assert brief(out) == [("GpuThrottled", "firing", 60 * S, 0, 60.0)]
    assert alert.severity == "warning"
    assert alert.labels["reasons"] == "hw_power_brake_slowdown,hw_thermal_slowdown"
    assert alert.summary == (
        f"{GPU_A} ({MODEL}) on {NODE} throttled (hw_power_brake_slowdown, "
        "hw_thermal_slowdown) for 60 s; held by pod ml/train-0"
    )
    state, out, _ = run(state, [_throttled(t, "hw_thermal_slowdown") for t in range(60, 90)])
    assert out == []
    state, out, _ = run(state, [_throttled(90, "sw_power_cap")])
    assert brief(out) == [("GpuThrottled", "resolved", 90 * S, 0, 90.0)]
    assert "no longer throttled (slowdown ended) after 90 s" in out[0].summary


def test_power_capping_and_sync_boost_never_throttle_and_a_short_slowdown_stays_quiet() -> None:
    state, out, _ = run(None, [_throttled(t, "sw_power_cap", "sync_boost") for t in range(300)])
    assert out == []
    state, out, _ = run(None, [_throttled(t, "hw_slowdown") for t in range(30)])
    state, out2, _ = run(state, [_throttled(30, "sw_power_cap")])
    assert out + out2 == []
    assert state.faults == {}


def test_a_throttled_gpu_no_longer_listed_resolves() -> None:
    state, _, _ = run(None, [_throttled(t, "sw_thermal_slowdown") for t in range(61)])
    state, out, _ = run(state, [held(T0 + 61 * S, healthy(GPU_B))])
    assert brief(out) == [("GpuThrottled", "resolved", 61 * S, 0, 61.0)]
    assert "no longer reported" in out[0].summary


def test_the_threshold_and_hold_come_from_the_rules() -> None:
    rules = RULES.model_copy(update={"throttle_alert_after_s": 10, "xid_alert_hold_s": 5})
    state: NodeAlertState | None = None
    out: list[Any] = []
    for t in range(10):
        state, alerts, _ = on_sample(state, _throttled(t, "hw_slowdown"), rules)
        out += alerts
    assert brief(out) == [("GpuThrottled", "firing", 10 * S, 0, 10.0)]
    state, out, _ = on_sample(state, held(T0 + 10 * S, healthy(xid_errors=(74,))), rules)
    assert state is not None
    state, out = on_watermark(state, T0 + 16 * S, rules)
    assert brief(out) == [("GpuXidError", "resolved", 16 * S, 10 * S, 74.0)]


def test_a_restored_state_shows_the_firing_messages_as_sent() -> None:
    samples = [_throttled(t, "hw_thermal_slowdown") for t in range(60)]
    samples.append(held(T0 + 60 * S, healthy(xid_errors=(95,), ecc_dbe=1,
                                                  throttle_reasons=("hw_thermal_slowdown",),
                                                  remapped_rows=ROWS_FAILED)))  # fmt: skip
    state, out, _ = run(None, samples)
    sent = sorted(msgspec.json.encode(a) for a in health(out) if a.status == "firing")
    assert len(sent) == 4
    stored = msgspec.json.decode(msgspec.json.encode(state), type=NodeAlertState)
    again = sorted(msgspec.json.encode(a) for a in health(still_firing(stored)))
    assert again == sent


def test_a_removed_node_resolves_its_gpu_faults() -> None:
    state, _, _ = run(None, [held(T0, healthy(xid_errors=(79,), remapped_rows=ROWS_FAILED))])
    _, out = on_node_removed(state, T0 + 5 * S)
    assert [(a.name, a.status, a.ts - T0) for a in out] == [
        ("GpuRowRemapFailure", "resolved", 5 * S),
        ("GpuXidError", "resolved", 5 * S),
    ]


def test_a_named_cluster_names_itself_in_its_health_alerts() -> None:
    east = msgspec.structs.replace(held(T0, healthy(xid_errors=(79,))), cluster="east")
    _, out, _ = run(None, [east])
    (alert,) = out
    assert alert.labels["cluster"] == alert.cluster == "east"
    assert alert.summary.startswith("[cluster east] Xid 79")
    assert alert.fingerprint == fingerprint("GpuXidError", "gpu", f"{GPU_A}/79", "east")


@pytest.mark.parametrize("field", ["throttle_reasons", "remapped_rows", "pcie_replays"])
def test_healthy_readings_leave_the_state_as_it_was(field: str) -> None:
    state, out, _ = run(None, [held(T0 + t * S, healthy(), healthy(GPU_B)) for t in range(5)])
    assert out == []
    assert (state.faults, state.dbe) == ({}, {})
    assert field not in msgspec.json.encode(state).decode()
