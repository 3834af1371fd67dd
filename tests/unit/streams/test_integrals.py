"""integrate: seconds, energy and dollars of a split interval, per pod and per GPU.

The rules: docs/DESIGN.md §4.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from readings import GIB, H100, IDLE_PCT, A, B, C, D, gpu, proc

from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import Allocation, GpuReading, NvmlSample
from schemas.prices import BUILTIN_PRICES, PriceOverride, PriceTable
from streams.core.integrals import (
    GpuIntegrals,
    PodIntegrals,
    PriceBook,
    integrate,
    integrate_sample,
    scaled,
)
from streams.core.node.gpu_windows import GpuWindowAcc
from streams.core.split import split_gpu

H200 = "NVIDIA H200"  # $5.00 per hour


def sample(gpus: list[GpuReading], held: dict[str, list[PodUid]], seconds: float) -> NvmlSample:
    allocations = tuple(
        Allocation(
            pod_uid=uid,
            namespace="ml",
            pod=str(uid),
            container="c",
            resource="nvidia.com/gpu",
            device_ids=(GpuUuid(uuid),),
        )
        for uuid, uids in held.items()
        for uid in uids
    )
    return NvmlSample(
        schema="gpuwatch.nvml.sample/v1",
        node=NodeName("node-1"),
        ts=1_764_412_320_000,
        interval_ms=int(seconds * 1000),
        seq=1,
        gpus=tuple(gpus),
        allocations=allocations,
    )


def run(gpus: list[GpuReading], held: dict[str, list[PodUid]], seconds: float = 60.0) -> Any:
    """{uuid: (GpuIntegrals, {uid: PodIntegrals})} for a one-interval sample."""
    out = integrate_sample(sample(gpus, held, seconds), IDLE_PCT, PriceBook(BUILTIN_PRICES))
    return {g.uuid: (i, {p.uid: p for p in i.pods}) for g, i in out.gpus}


def test_exclusive_h100_at_87_pct_for_60_s_at_4_usd_an_hour() -> None:
    g = gpu(proc(A, 85.0, 60 * GIB), sharing="exclusive", util=87.0, power_w=500.0)
    dev, pods = run([g], {"GPU-x": [A]})["GPU-x"]
    pod = pods[A]
    # 60 s x 0.87 = 52.2 used GPU-seconds; $4/h / 3600 x 60 s = $0.0666...; not idle, no
    # waste; 500 W x 60 s = 30 kJ, x 0.87 = 26.1 kJ; VRAM 60 GiB held for 60 s.
    assert pod.allocated_seconds == 60.0
    assert pod.used_gpu_seconds == pytest.approx(52.2)
    assert pod.idle_seconds == 0.0
    assert pod.cost_usd == pytest.approx(4.0 / 60)
    assert pod.waste_usd == 0.0
    assert pod.energy_joules == pytest.approx(26_100.0)
    assert pod.vram_byte_seconds == 60 * GIB * 60.0
    assert pod.vram_peak_bytes == 60 * GIB
    assert (pod.method, pod.idle) == ("exclusive", False)
    # The device: busy the whole minute, allocated, mean 87 %, fully attributed.
    assert (dev.busy_seconds, dev.idle_seconds) == (60.0, 0.0)
    assert (dev.allocated_seconds, dev.allocated_idle_seconds, dev.unallocated_seconds) == (
        60.0,
        0.0,
        0.0,
    )
    assert dev.util_seconds / dev.util_known_seconds == pytest.approx(0.87)
    assert (dev.attributed_seconds, dev.unattributed_seconds) == pytest.approx((52.2, 0.0))


def test_three_pods_time_slicing_50_30_0_the_idle_one_wastes_its_third() -> None:
    g = gpu(
        proc(A, 50.0, 20 * GIB),
        proc(B, 30.0, 10 * GIB),
        proc(C, 0.0, 2 * GIB),
        util=80.0,
        power_w=300.0,
    )
    dev, pods = run([g], {"GPU-x": [A, B, C]})["GPU-x"]
    # Each holds 1/3 of 60 s = 20 s and pays 1/3 of $0.0666... = $0.0222...
    # Used: 0.5 x 60 = 30 s, 0.3 x 60 = 18 s, 0. C is idle (0 < 5 %): 20 idle seconds and
    # its whole $0.0222 is waste. Energy 300 W x 60 s = 18 kJ x share: 9 kJ, 5.4 kJ, 0.
    assert {u: p.allocated_seconds for u, p in pods.items()} == pytest.approx(
        {A: 20.0, B: 20.0, C: 20.0}
    )
    assert {u: p.used_gpu_seconds for u, p in pods.items()} == pytest.approx(
        {A: 30.0, B: 18.0, C: 0.0}
    )
    assert {u: p.idle_seconds for u, p in pods.items()} == pytest.approx({A: 0, B: 0, C: 20.0})
    assert {u: p.cost_usd for u, p in pods.items()} == pytest.approx(
        {A: 4 / 180, B: 4 / 180, C: 4 / 180}
    )
    assert {u: p.waste_usd for u, p in pods.items()} == pytest.approx({A: 0, B: 0, C: 4 / 180})
    assert {u: p.energy_joules for u, p in pods.items()} == pytest.approx(
        {A: 9000.0, B: 5400.0, C: 0.0}
    )
    # The device is busy (80 %), so none of its allocated seconds are idle ones.
    assert (dev.busy_seconds, dev.allocated_seconds, dev.allocated_idle_seconds) == (60, 60, 0)


def test_memory_share_by_vram_when_no_process_sm() -> None:
    g = gpu(proc(A, None, 15 * GIB), proc(B, None, 4 * GIB), proc(C, None, 1 * GIB), util=80.0)
    _, pods = run([g], {"GPU-x": [A, B, C]})["GPU-x"]
    # 80 % split 15:4:1 -> 0.6, 0.16, 0.04 of 60 s = 36, 9.6, 2.4 s; C (4 % < 5 %) is idle
    # for its 20 allocated seconds and wastes its $0.0222.
    assert {u: p.used_gpu_seconds for u, p in pods.items()} == pytest.approx(
        {A: 36.0, B: 9.6, C: 2.4}
    )
    assert {u: p.idle_seconds for u, p in pods.items()} == pytest.approx({A: 0, B: 0, C: 20.0})
    assert pods[C].waste_usd == pytest.approx(4 / 180)
    assert {p.method for p in pods.values()} == {"memory_share"}


def test_mig_instances_unknown_utilization_and_slice_prices() -> None:
    parent = gpu(uuid="GPU-p", model=H200, sharing="mig", power_w=400.0)
    three = gpu(
        proc(A, None, 40 * GIB),
        uuid="MIG-3g",
        model=H200,
        sharing="mig",
        parent_uuid="GPU-p",
        mig_profile="3g.71gb",
    )
    one = gpu(uuid="MIG-1g", model=H200, sharing="mig", parent_uuid="GPU-p", mig_profile="1g.18gb")
    got = run([parent, three, one], {"MIG-3g": [A]})
    assert set(got) == {"MIG-3g", "MIG-1g"}  # the parent would count its instances twice
    dev, pods = got["MIG-3g"]
    pod = pods[A]
    # H200 at $5/h; 3 of 7 compute slices -> $15/7 per hour, for 60 s = $0.035714. Util is
    # unknown: allocated and paid for, but neither used nor idle, so no waste; no power.
    assert pod.cost_usd == pytest.approx(5 * 3 / 7 / 60)
    assert (pod.allocated_seconds, pod.used_gpu_seconds, pod.idle_seconds) == (60.0, 0.0, 0.0)
    assert (pod.share_seconds, pod.waste_usd, pod.energy_joules) == (0.0, 0.0, 0.0)
    assert (pod.method, pod.idle) == ("unknown", None)
    assert (dev.busy_seconds, dev.idle_seconds, dev.util_known_seconds) == (0.0, 0.0, 0.0)
    free, _ = got["MIG-1g"]
    assert (free.allocated_seconds, free.unallocated_seconds) == (0.0, 60.0)


def test_leak_has_a_share_but_no_allocated_seconds_and_no_cost() -> None:
    g = gpu(proc(A, 60.0), proc(B, 20.0), sharing="exclusive", util=80.0, power_w=100.0)
    _, pods = run([g], {"GPU-x": [A]})["GPU-x"]
    leak = pods[B]
    assert leak.used_gpu_seconds == pytest.approx(12.0)  # 0.2 x 60 s
    assert (leak.allocated_seconds, leak.idle_seconds, leak.cost_usd, leak.waste_usd) == (
        0.0,
        0.0,
        0.0,
        0.0,
    )
    assert leak.energy_joules == pytest.approx(1200.0)  # 100 W x 60 s x 0.2
    assert pods[A].cost_usd == pytest.approx(4.0 / 60)  # the holder pays for the whole GPU


def test_unallocated_idle_gpu_costs_no_one() -> None:
    dev, pods = run([gpu(util=0.0, sharing="exclusive")], {})["GPU-x"]
    assert pods == {}
    assert (dev.idle_seconds, dev.unallocated_seconds, dev.allocated_idle_seconds) == (60, 60, 0)


def test_energy_by_allocation_when_share_unknown_and_zero_when_power_unknown() -> None:
    g = gpu(proc(A), proc(B), util=None, power_w=200.0)
    _, pods = run([g], {"GPU-x": [A, B]}, seconds=10.0)["GPU-x"]
    assert {u: p.energy_joules for u, p in pods.items()} == {A: 1000.0, B: 1000.0}
    _, no_power = run([gpu(proc(A, 50.0), util=50.0)], {"GPU-x": [A]})["GPU-x"]
    assert no_power[A].energy_joules == 0.0


def test_price_book_overrides_and_caches_per_labels() -> None:
    table = PriceTable(
        models={"H100": 4.0},
        overrides=(PriceOverride(label="capacity", value="spot", models={"H100": 1.5}),),
    )
    calls: list[tuple[str | None, dict[str, str]]] = []

    class Counting:
        def usd_per_gpu_hour(
            self, model: str | None, labels: dict[str, str], cluster: str = "default"
        ) -> float:
            calls.append((model, dict(labels)))
            return table.usd_per_gpu_hour(model, labels, cluster)

    book = PriceBook(Counting())  # type: ignore[arg-type]
    book.set_node_labels("spot-1", {"capacity": "spot"})
    book.set_node_labels("spot-2", {"capacity": "spot"})
    assert book.node("spot-1").usd_per_hour(H100, None) == 1.5
    assert book.node("spot-2").usd_per_hour(H100, None) == 1.5  # same labels: cached
    assert book.node("other").usd_per_hour(H100, None) == 4.0
    assert book.node("other").usd_per_hour(H100, "2g.20gb") == pytest.approx(4.0 * 2 / 7)
    assert book.node("other").usd_per_hour("NVIDIA A30", "1g.6gb") == pytest.approx(2.0 / 4)
    assert len(calls) == 4


# --- properties -------------------------------------------------------------------------

PROCS = st.builds(
    proc,
    st.sampled_from([A, B, C, D, None]),
    st.none() | st.floats(0, 100),
    st.none() | st.integers(0, 80 * GIB),
)
GPUS = st.builds(
    lambda procs, sharing, util, power: gpu(*procs, sharing=sharing, util=util, power_w=power),
    st.lists(PROCS, max_size=6),
    st.sampled_from(["exclusive", "time-slicing", "mps", "mig"]),
    st.none() | st.floats(0, 100),
    st.none() | st.floats(0, 1000),
)
HOLDERS = st.lists(st.sampled_from([A, B, C, D]), max_size=5)
SECONDS = st.floats(0.001, 3600)
PRICES = st.floats(0, 100)


@given(GPUS, HOLDERS, SECONDS, PRICES)
def test_gpu_seconds_and_cost_are_fully_assigned(
    g: GpuReading, holders: list[PodUid], seconds: float, price: float
) -> None:
    dev = integrate(split_gpu(g, holders, IDLE_PCT), seconds, g.power_w, price)
    assert dev.allocated_seconds + dev.unallocated_seconds == pytest.approx(seconds)
    assert sum(p.allocated_seconds for p in dev.pods) == pytest.approx(dev.allocated_seconds)
    cost = sum(p.cost_usd for p in dev.pods)
    assert cost == pytest.approx(price / 3600 * dev.allocated_seconds)
    assert dev.busy_seconds + dev.idle_seconds <= seconds
    assert dev.allocated_idle_seconds <= min(dev.allocated_seconds, dev.idle_seconds)
    energy = sum(p.energy_joules for p in dev.pods)
    assert energy <= (g.power_w or 0.0) * seconds * (1 + 1e-9) + 1e-300  # subnormal watts
    for p in dev.pods:
        assert 0.0 <= p.waste_usd <= p.cost_usd
        assert p.idle_seconds <= p.allocated_seconds
        assert p.used_gpu_seconds <= p.share_seconds * (1 + 1e-9)
    assert dev.attributed_seconds + dev.unattributed_seconds == pytest.approx(
        dev.util_seconds, abs=1e-9 * seconds
    )


def fields(x: GpuIntegrals | PodIntegrals) -> dict[str, Any]:
    return msgspec.structs.asdict(x)


@given(GPUS, HOLDERS, SECONDS, st.floats(0, 1))
def test_pieces_of_an_interval_sum_to_the_whole(
    g: GpuReading, holders: list[PodUid], seconds: float, cut: float
) -> None:
    whole = integrate(split_gpu(g, holders, IDLE_PCT), seconds, g.power_w, 4.0)
    first, rest = scaled(whole, cut), scaled(whole, 1 - cut)
    for name, value in fields(whole).items():
        if name != "pods":
            assert fields(first)[name] + fields(rest)[name] == pytest.approx(value)
    for w, a, b in zip(whole.pods, first.pods, rest.pods, strict=True):
        for name, value in fields(w).items():
            if name == "vram_peak_bytes":  # a peak, not an integral: each piece keeps it
                assert fields(a)[name] == fields(b)[name] == value
            elif isinstance(value, float):
                assert fields(a)[name] + fields(b)[name] == pytest.approx(value)
    # and integrating the piece's length directly gives the same as scaling
    direct = integrate(split_gpu(g, holders, IDLE_PCT), seconds * cut, g.power_w, 4.0)
    assert fields(direct)["allocated_seconds"] == pytest.approx(first.allocated_seconds)


@given(GPUS | GPUS.map(lambda g: msgspec.structs.replace(g, util_pct=-0.0)), HOLDERS, SECONDS)
def test_a_sample_integrates_each_gpu_as_its_split_does_to_the_bit(
    g: GpuReading, holders: list[PodUid], seconds: float
) -> None:
    # integrate_sample works from the sample's view (allocations indexed once): its
    # integrals must be those of each GPU's split exactly (records are compared byte for
    # byte).
    s = sample([g], {g.uuid: holders}, seconds)
    [(_, got)] = integrate_sample(s, IDLE_PCT, PriceBook(BUILTIN_PRICES)).gpus
    split = split_gpu(g, list(dict.fromkeys(holders)), IDLE_PCT)
    price = PriceBook(BUILTIN_PRICES).node(s.node).usd_per_hour(g.model, g.mig_profile)
    want = integrate(split, s.interval_ms / 1000, g.power_w, price)
    assert msgspec.json.encode(got) == msgspec.json.encode(want)


@given(GPUS, HOLDERS, SECONDS, st.floats(0, 1), st.floats(0, 1))
def test_a_window_bucket_adds_a_piece_as_the_scaled_integrals_to_the_bit(
    g: GpuReading, holders: list[PodUid], seconds: float, first: float, cut: float
) -> None:
    # A bucket adds a piece of an interval by fraction without making the scaled integrals
    # (`GpuWindowAcc.add_part`): its sums must be those of adding `scaled` exactly (gpu.window
    # records are compared byte for byte), after a whole interval and after a piece too.
    integrals = integrate(split_gpu(g, holders, IDLE_PCT), seconds, g.power_w, 4.0)
    names = {uid: ("ml", str(uid)) for uid in holders[:1]}
    direct, made = (GpuWindowAcc(g.uuid, NodeName("n"), g.model, None, 0, 60_000) for _ in "ab")
    for acc in (direct, made):
        acc.add(integrals, names)
    direct.add_part(integrals, first, names)
    made.add(scaled(integrals, first), names)
    direct.add_part(integrals, cut, {})
    made.add(scaled(integrals, cut), {})
    assert msgspec.json.encode(direct) == msgspec.json.encode(made)
