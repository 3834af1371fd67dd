"""The GPU faults of a scenario in the samples a simulated node publishes: which sample shows
a throttle, a double-bit ECC error, a failed row remapping or a GPU off the bus, and when.

A fault at `at_s` = t shows in the sample of the interval holding t (with 1 s ticks, the
sample whose ts is t, read at t + 1 s); one that ends at t no longer shows in that sample.
"""

from __future__ import annotations

from gpuwatch.harness.simulate.gpus import HOT_C
from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from gpuwatch.harness.simulate.loop import GpuEvent, SimClock, Simulation, faults_due
from gpuwatch.harness.simulate.scenario import Fault, load_scenario, parse_scenario
from schemas import NVML_SAMPLES
from schemas.nvml_sample import GpuReading, NvmlSample, RemappedRows

EPOCH = 1_764_400_000
NO_ROWS = RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=False)


def one_node(faults: str) -> str:
    """A scenario of one node, a-0, of two H100 GPUs with these faults (YAML list items)."""
    return f"name: faults\nnodes:\n  - pool: a\n    gpus_per_node: 2\nfaults:\n{faults}"


def samples_of(
    text: str, seconds: float, node: str = "a-0", interval_s: float = 1.0
) -> dict[float, NvmlSample]:
    """Every sample of `node` over the first `seconds`, by its start in simulated seconds."""
    published: list[bytes] = []
    clock = SimClock(EPOCH)
    simulation = Simulation(
        parse_scenario(text) if "\n" in text else load_scenario(text),
        api=FakeApiServer(clock=clock.time),  # never served: the mirror only writes to it
        publish_for=lambda _node: lambda _key, value: published.append(value),
        interval_s=interval_s,
        clock=clock,
    )
    simulation.prepare()
    for _ in range(round(seconds / interval_s)):
        simulation.tick()
    decoded = [NVML_SAMPLES.decode(value) for value in published]
    return {s.ts / 1000 - EPOCH: s for s in decoded if s.node == node}


def gpu(sample: NvmlSample, index: int) -> GpuReading | None:
    """The whole GPU `index` of a sample; None when the sample leaves it out."""
    return next((g for g in sample.gpus if g.index == index and g.parent_uuid is None), None)


def test_a_healthy_node_reads_as_the_recorded_gpus() -> None:
    samples = samples_of(one_node("  []\n"), 3)

    for sample in samples.values():
        for reading in sample.gpus:
            assert reading.throttle_reasons == ()
            assert reading.remapped_rows == NO_ROWS
            assert (reading.retired_pages_pending, reading.pcie_replays) == (None, 0)
            assert (reading.ecc_dbe, reading.xid_errors) == (0, ())


def test_a_throttle_shows_from_at_s_for_duration_s_and_reads_hot() -> None:
    samples = samples_of(
        one_node("  - {kind: throttle, node: a-0, gpu: 1, at_s: 10, duration_s: 5}\n"), 20
    )

    throttled = {
        t: (g.throttle_reasons, g.temp_c)
        for t, s in samples.items()
        if (g := gpu(s, 1)) is not None and g.throttle_reasons
    }
    assert throttled == {t: (("hw_thermal_slowdown",), HOT_C) for t in range(10, 15)}
    for t in (9, 15):
        reading = gpu(samples[t], 1)
        assert reading is not None
        assert (reading.throttle_reasons, reading.temp_c) == ((), 40)  # idle again
    others = [gpu(s, 0) for s in samples.values()]
    assert all(g is not None and g.throttle_reasons == () for g in others)


def test_a_throttle_without_duration_lasts_and_names_its_reason() -> None:
    samples = samples_of(
        one_node("  - {kind: throttle, node: a-0, gpu: 0, at_s: 3, reason: sw_power_cap}\n"), 30
    )

    reasons = [g.throttle_reasons for t in sorted(samples) if (g := gpu(samples[t], 0))]
    assert reasons == [()] * 3 + [("sw_power_cap",)] * 27
    last = gpu(samples[29], 0)
    assert last is not None
    assert last.temp_c == 40  # power capping is not heat


def test_a_double_bit_error_is_one_xid_48_and_counts_from_then_on() -> None:
    samples = samples_of(one_node("  - {kind: ecc, node: a-0, gpu: 1, at_s: 20}\n"), 25)

    def ecc(t: int) -> tuple[object, ...]:
        reading = gpu(samples[t], 1)
        assert reading is not None
        return reading.xid_errors, reading.ecc_dbe, reading.remapped_rows

    pending = RemappedRows(correctable=0, uncorrectable=1, pending=True, failed=False)
    assert ecc(19) == ((), 0, NO_ROWS)
    assert ecc(20) == ((48,), 1, pending)
    assert ecc(21) == ecc(24) == ((), 1, pending)
    other = gpu(samples[20], 0)
    assert other is not None
    assert (other.xid_errors, other.ecc_dbe) == ((), 0)


def test_a_failed_remapping_shows_from_at_s_on() -> None:
    samples = samples_of(one_node("  - {kind: remap-failure, node: a-0, gpu: 0, at_s: 7}\n"), 12)

    failed = [
        t
        for t, s in samples.items()
        if (g := gpu(s, 0)) and g.remapped_rows and g.remapped_rows.failed
    ]
    assert failed == [7, 8, 9, 10, 11]


def test_xid_79_is_reported_then_the_gpu_is_lost_until_at_s_plus_duration_s() -> None:
    samples = samples_of(
        one_node("  - {kind: xid, node: a-0, gpu: 0, code: 79, at_s: 40, duration_s: 10}\n"), 55
    )

    present = {t for t, s in samples.items() if gpu(s, 0) is not None}
    assert present == set(range(55)) - set(range(41, 50))
    reported = gpu(samples[40], 0)
    assert reported is not None
    assert reported.xid_errors == (79,)
    back = gpu(samples[50], 0)
    assert back is not None
    assert back.xid_errors == ()
    assert all(gpu(s, 1) is not None for s in samples.values())  # the other GPU is read


def test_xid_79_without_duration_loses_the_gpu_for_good() -> None:
    samples = samples_of(one_node("  - {kind: xid, node: a-0, gpu: 1, at_s: 5}\n"), 60)

    assert [t for t, s in sorted(samples.items()) if gpu(s, 1) is not None] == list(range(6))


def test_another_xid_is_reported_once_and_the_gpu_stays() -> None:
    samples = samples_of(one_node("  - {kind: xid, node: a-0, gpu: 1, code: 31, at_s: 5}\n"), 10)

    xids = {t: g.xid_errors for t, s in samples.items() if (g := gpu(s, 1)) and g.xid_errors}
    assert xids == {5: (31,)}
    assert all(gpu(s, 1) is not None for s in samples.values())


def test_with_longer_ticks_a_fault_shows_in_the_sample_of_the_interval_holding_it() -> None:
    text = one_node(
        "  - {kind: throttle, node: a-0, gpu: 0, at_s: 11, duration_s: 4}\n"
        "  - {kind: xid, node: a-0, gpu: 1, code: 31, at_s: 13.5}\n"
    )
    samples = samples_of(text, 20, interval_s=2.0)

    throttled = [t for t, s in sorted(samples.items()) if (g := gpu(s, 0)) and g.throttle_reasons]
    assert throttled == [10, 12]  # [10, 12) holds 11; [14, 16) holds the end, 15
    xids = {t: g.xid_errors for t, s in samples.items() if (g := gpu(s, 1)) and g.xid_errors}
    assert xids == {12: (31,)}


def test_the_incident_loses_a_gpu_of_train_a_and_throttles_chat_serving() -> None:
    h100_2 = samples_of("incident", 160, node="h100-2")
    h100_0 = samples_of("incident", 210, node="h100-0")

    def holder(sample: NvmlSample, index: int) -> str:
        reading = gpu(sample, index)
        assert reading is not None
        return next(a.pod for a in sample.allocations if reading.uuid in a.device_ids)

    reported = gpu(h100_2[150], 0)
    assert reported is not None
    assert reported.xid_errors == (79,)
    assert holder(h100_2[150], 0) == "train-a-0"
    after = h100_2[151]
    assert gpu(after, 0) is None  # lost: no reading, so no usage of train-a on it
    (train_a,) = [a for a in after.allocations if a.pod == "train-a-0"]
    assert len(train_a.device_ids) == 2  # the kubelet still lists both GPUs
    assert [g.index for g in after.gpus] == [1, 2, 3]

    throttled = gpu(h100_0[200], 0)
    assert throttled is not None
    assert (throttled.throttle_reasons, throttled.temp_c) == (("hw_thermal_slowdown",), HOT_C)
    assert holder(h100_0[200], 0) == "chat-serving-0"
    before = gpu(h100_0[199], 0)
    assert before is not None
    assert before.throttle_reasons == ()


def test_an_agent_down_without_duration_is_two_minutes() -> None:
    down = (Fault(kind="agent-down", node="a-0", at_s=10),)

    assert [bool(faults_due(down, t, t + 1)[0]) for t in (9, 10, 129, 130)] == [
        False,
        True,
        True,
        False,
    ]


def test_gpu_faults_begin_and_end_in_time_order() -> None:
    throttle = Fault(kind="throttle", node="a-0", at_s=10.5, duration_s=0.25)
    xid = Fault(kind="xid", node="a-0", at_s=10.2, code=31)
    lost = Fault(kind="xid", node="a-0", at_s=3, duration_s=7.9)

    down, events = faults_due((throttle, xid, lost), 10, 11)

    assert down == set()
    assert events == [
        GpuEvent(xid),  # 10.2
        GpuEvent(throttle),  # 10.5
        GpuEvent(throttle, ends=True),  # 10.75
        GpuEvent(lost, ends=True),  # 3 + 7.9 = 10.9
    ]
