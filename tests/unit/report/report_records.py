"""Records for the report tests: hand-made pod and GPU windows, and a generated fleet whose
attribution and GPU windows agree, with the fleet's priced GPU time worked out beside them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gpuwatch.harness.examples import example
from gpuwatch.timerange import TimeRange
from schemas import Attribution, GpuWindow, K8sNode
from schemas.prices import BUILTIN_PRICES, PriceOverride

S = 1000
MIN = 60 * S
HOUR = 60 * MIN
DAY = 24 * HOUR
T0 = 1_764_547_200_000  # 2025-12-01 00:00:00 UTC, a Monday
H100 = "NVIDIA H100 80GB HBM3"  # 4 USD per GPU-hour in the built-in table
A100 = "NVIDIA A100-SXM4-80GB"  # 3 USD
T4 = "Tesla T4"  # 0.50 USD
ODD = "Acme X1"  # no pattern: the default, 2 USD
MODELS = (H100, A100, T4, ODD)
SPOT = {"pool": "spot"}
PRICES = BUILTIN_PRICES.model_copy(
    update={"overrides": (PriceOverride(label="pool", value="spot", models={"H100": 1.5}),)}
)


def attribution(
    uid: str = "pod-1",
    start: int = T0,
    *,
    gpus: list[dict[str, Any]] | None = None,
    namespace: str = "ml",
    pod: str = "train-0",
    node: str | None = "node-a",
    labels: dict[str, str] | None = None,
    owner: dict[str, str] | None = None,
    waste: float | None = None,
    units: dict[str, float] | None = None,
    cluster: str = "default",
    revision: int = 0,
) -> Attribution:
    """A pod's window; its totals are the sums over `gpus` (one exclusive H100 by default),
    its waste the idle seconds' cost unless given."""
    if gpus is None:
        gpus = [gpu()]
    data = example("gpuwatch.attribution/v1")
    data.update(uid=uid, namespace=namespace, pod=pod, node=node, cluster=cluster)
    data.update(window_start=start, window_end=start + MIN, ts=start + MIN, gpus=gpus)
    data.update(labels={"team": "vision"} if labels is None else labels, owner=owner)
    data.update(revision=revision)
    for name in ("allocated_gpu_seconds", "used_gpu_seconds", "idle_gpu_seconds", "cost_usd"):
        data[name] = sum(g[name] for g in gpus)
    idle_cost = sum(
        g["cost_usd"] * g["idle_gpu_seconds"] / g["allocated_gpu_seconds"]
        for g in gpus
        if g["allocated_gpu_seconds"] > 0
    )
    data["waste_usd"] = idle_cost if waste is None else waste
    data.pop("work_units"), data.pop("cost_per_unit")
    if units is not None:
        data["work_units"] = units
        data["cost_per_unit"] = {
            n: data["cost_usd"] / c if c > 0 else None for n, c in units.items()
        }
    return msgspec.convert(data, Attribution)


def gpu(
    uuid: str = "GPU-a",
    *,
    model: str = H100,
    usd_per_hour: float = 4.0,
    allocated: float = 60.0,
    used: float = 40.0,
    idle: float = 10.0,
    sharing: str = "exclusive",
) -> dict[str, Any]:
    """One GPU of a pod's window, its cost at `usd_per_hour` for the allocated seconds."""
    return {
        "uuid": uuid,
        "model": model,
        "sharing": sharing,
        "allocated_gpu_seconds": allocated,
        "used_gpu_seconds": used,
        "idle_gpu_seconds": idle,
        "vram_peak_bytes": 0,
        "cost_usd": usd_per_hour / 3600 * allocated,
        "method": "exclusive",
    }


def gpu_window(
    uuid: str = "GPU-a",
    start: int = T0,
    *,
    allocated: float = 60.0,
    node: str = "node-a",
    model: str = H100,
    parent: str | None = None,
    cluster: str = "default",
    revision: int = 0,
) -> GpuWindow:
    """A GPU's window: `allocated` seconds held, the rest of the minute held by no one."""
    data = example("gpuwatch.gpu.window/v1")
    data.update(uuid=uuid, node=node, model=model, parent_uuid=parent, cluster=cluster)
    data.update(window_start=start, window_end=start + MIN, ts=start + MIN, pods=[])
    data.update(allocated_seconds=allocated, unallocated_seconds=60.0 - allocated)
    data.update(allocated_idle_seconds=0.0, idle_seconds=0.0, busy_seconds=60.0)
    data.update(revision=revision)
    return msgspec.convert(data, GpuWindow)


def k8s_node(node: str, labels: dict[str, str], cluster: str = "default") -> K8sNode:
    data = example("gpuwatch.k8s.node/v1")
    data.update(node=node, labels=labels, cluster=cluster)
    return msgspec.convert(data, K8sNode)


@dataclass
class Fleet:
    """Generated records of a period, and what they add up to."""

    period: TimeRange
    attribution: list[Attribution] = field(default_factory=list)
    windows: list[GpuWindow] = field(default_factory=list)
    nodes: list[K8sNode] = field(default_factory=list)
    fleet_usd: float = 0.0
    """Every GPU window's seconds (allocated and unallocated) at the GPU's price."""
    units: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Gpu:
    uuid: str
    node: str
    model: str
    cluster: str
    usd_per_s: float


def fleet(rng: random.Random, *, gpus: int, windows: int, days: int) -> Fleet:
    """`gpus` GPUs over `days` days from T0 + 5 h (so steps cut the period), each in up to
    `windows` random windows, held by 0-3 pods of its node (time-sliced in equal parts);
    some GPUs are never held, on nodes priced by a label or by nothing."""
    period = TimeRange(T0 + 5 * HOUR, T0 + 5 * HOUR + days * DAY)
    out = Fleet(period)
    devices: list[_Gpu] = []
    described: set[tuple[str, str]] = set()
    for i in range(gpus):
        node = f"node-{i // 4}"
        cluster = "default" if i % 8 < 6 else "eu"
        labels = SPOT if (i // 4) % 3 == 0 else {}
        model = MODELS[rng.randrange(len(MODELS))]
        price = PRICES.usd_per_gpu_hour(model, labels, cluster) / 3600
        devices.append(_Gpu(f"GPU-{i}", node, model, cluster, price))
        if (node, cluster) not in described:  # node names repeat across clusters
            described.add((node, cluster))
            out.nodes.append(k8s_node(node, labels, cluster))
    minutes = days * 24 * 60
    for device in devices:
        starts = {period.start_ms + rng.randrange(minutes) * MIN for _ in range(windows)}
        held = rng.random() < 0.8
        for start in sorted(starts):
            holders = rng.randint(0, 3) if held else 0
            allocated = rng.choice([60.0, 30.0, 45.5]) if holders else 0.0
            out.windows.append(
                gpu_window(device.uuid, start, allocated=allocated, node=device.node,
                           model=device.model, cluster=device.cluster)
            )  # fmt: skip
            out.fleet_usd += 60.0 * device.usd_per_s
            for k in range(holders):
                out.attribution.append(_pod_window(rng, device, start, k, allocated / holders))
    rng.shuffle(out.attribution)
    for rec in out.attribution:
        for name, count in rec.work_units.items():
            out.units[name] = out.units.get(name, 0.0) + count
    return out


def _pod_window(rng: random.Random, device: _Gpu, start: int, k: int, share: float) -> Attribution:
    used = rng.uniform(0, share)
    idle = rng.uniform(0, share - used)
    hour_usd = device.usd_per_s * 3600
    unit = rng.choice([None, {"steps": rng.choice([0.0, 600.0])}, {"tokens": 9e4, "steps": 5.0}])
    labels = rng.choice([{"team": "vision"}, {"team": "nlp"}, {}])
    owner = rng.choice([{"kind": "Job", "name": "train"}, None])
    return attribution(
        f"{device.uuid}-pod-{k}",
        start,
        gpus=[gpu(device.uuid, model=device.model, usd_per_hour=hour_usd, allocated=share,
                  used=used, idle=idle, sharing="time-slicing" if k else "exclusive")],
        namespace=rng.choice(["ml", "research"]),
        pod=f"pod-{k}",
        node=device.node,
        labels=labels,
        owner=owner,
        units=unit,
        cluster=device.cluster,
    )  # fmt: skip


def revise(rec: Attribution, revision: int, rng: random.Random) -> Attribution:
    """Another revision of a pod's window, as the worker emits it when usage came after the
    window closed: other seconds at the same price per GPU-second, and sometimes another
    team, other units or none."""
    scale = rng.choice([0.5, 1.25, 2.0])
    gpus = tuple(
        msgspec.structs.replace(
            g,
            allocated_gpu_seconds=g.allocated_gpu_seconds * scale,
            used_gpu_seconds=g.used_gpu_seconds * scale,
            idle_gpu_seconds=g.idle_gpu_seconds * scale,
            cost_usd=g.cost_usd * scale,
        )
        for g in rec.gpus
    )
    units = rng.choice([rec.work_units, {}, {"steps": 7.0}])
    return msgspec.structs.replace(
        rec,
        revision=revision,
        gpus=gpus,
        allocated_gpu_seconds=sum(g.allocated_gpu_seconds for g in gpus),
        used_gpu_seconds=sum(g.used_gpu_seconds for g in gpus),
        idle_gpu_seconds=sum(g.idle_gpu_seconds for g in gpus),
        cost_usd=sum(g.cost_usd for g in gpus),
        waste_usd=rec.waste_usd * scale,
        labels=rng.choice([rec.labels, {"team": "late"}]),
        work_units=units,
        cost_per_unit={n: None for n in units},
    )


def revise_window(win: GpuWindow, revision: int, rng: random.Random) -> GpuWindow:
    """Another revision of a GPU's window: another part of the minute allocated."""
    allocated = rng.choice([0.0, 20.0, 60.0])
    return msgspec.structs.replace(
        win, revision=revision, allocated_seconds=allocated, unallocated_seconds=60.0 - allocated
    )
