"""The scenario format of `gpuwatch simulate`: node pools, workloads and faults, from YAML.

A scenario is typed (msgspec structs, unknown keys refused) and then checked for what
types cannot say (a pool named twice, a MIG profile no pool offers); every error names
the file and the field (`$.workloads[2].pool`). Times are simulated seconds after the
simulation's epoch; a *span* is a fixed number or `[low, high]`, drawn per pod from the
seed, so a scenario is deterministic for a seed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import yaml

from gpuwatch.harness.simulate.gpus import GPU_MODELS, XID_FALLEN_OFF_THE_BUS
from schemas.fields import UnitName
from schemas.nvml_sample import THROTTLE_REASONS

__all__ = [
    "AGENT_DOWN_S",
    "SCENARIOS_DIR",
    "Fault",
    "NodePool",
    "Scenario",
    "ScenarioError",
    "Span",
    "Workload",
    "check",
    "load_scenario",
    "mig_profile_parts",
    "node_names",
    "parse_scenario",
    "scenario_names",
    "with_overrides",
]

SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"
"""The scenarios shipped with gpuwatch, package data of `gpuwatch.harness.simulate` (`--scenario
small` is gpuwatch/harness/simulate/scenarios/small.yaml)."""

WorkloadKindName = Literal["training", "inference", "notebook", "idle", "crashloop", "dev"]
Sharing = Literal["exclusive", "time-slicing", "mig"]
Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)]
Span = float | tuple[float, float]
"""A number, or `[low, high]` drawn uniformly per pod."""
NonNegative = Annotated[int, msgspec.Meta(ge=0)]

MIG_PROFILE = re.compile(r"^(?P<slices>[1-7])g\.(?P<gb>\d+)gb$")
MIG_SLICES = 7  # compute slices of an H100/H200; a profile `3g.40gb` takes 3 of them
MIG_MODELS = frozenset({"h100", "h200"})  # L40S has no MIG


class ScenarioError(Exception):
    """The scenario cannot be used; the message names the file and the field."""


class NodePool(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """`count` identical nodes named `<pool>-<i>`."""

    pool: Name
    count: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 1
    model: str = "h100"
    """A `gpuwatch.harness.simulate.gpus.GPU_MODELS` key: h100, h200, l40s."""
    gpus_per_node: Annotated[int, msgspec.Meta(ge=1, le=16)] = 8
    sharing: Sharing = "exclusive"
    replicas: Annotated[int, msgspec.Meta(ge=2, le=64)] | None = None
    """time-slicing: pods that can share one GPU (the device plugin's replicas)."""
    mig_profiles: tuple[str, ...] = ()
    """mig: the instances each GPU is split into, e.g. [3g.40gb, 2g.20gb, 1g.10gb]."""
    instance_type: str | None = None
    dra: bool = False
    """GPUs handed out by the NVIDIA DRA driver (ResourceClaims, device class
    gpu.nvidia.com; ResourceSlices name each device's uuid) instead of the device plugin."""


class Workload(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Pods of one kind, named `<name>-<i>`; see gpuwatch/harness/simulate/scenarios/README.md for
    every field."""

    name: Name
    kind: WorkloadKindName
    namespace: Name = "default"
    team: str | None = None
    project: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    pods: Annotated[int, msgspec.Meta(ge=0, le=100_000)] | None = None
    """How many pods (default 1); or `pods_per_node`."""
    pods_per_node: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """Pods per node of the pool (of the cluster without a pool), rounded."""
    gpus: NonNegative = 1
    """GPUs each pod requests (of `mig_profile` when set); 0: no GPU request."""
    mig_profile: str | None = None
    pool: Name | None = None
    """Only nodes of this pool (a nodeSelector)."""
    queue: Name | None = None
    """Kueue's LocalQueue (one of the scenario's `queues`): the Job is created suspended,
    as a Workload waiting for the queue's quota, and its pods only once Kueue admits it."""
    claim: Literal["per-pod", "shared"] | None = None
    """GPUs through a ResourceClaim (a DRA pool's): `per-pod` from a ResourceClaimTemplate,
    one claim per pod; `shared`: every pod of the workload uses the one claim
    `<name>-gpus` and so the same GPUs, on the same node. None: the device plugin."""
    priority_class: str | None = None
    owner: Literal["job", "deployment", "statefulset", "none"] | None = None
    """Default: job for training and idle, deployment for inference, crashloop and dev,
    statefulset for notebook."""
    start_s: Span = 0.0
    """When the pod is created; negative: before the epoch (already running at start)."""
    pull_s: Span = 5.0
    """ContainerCreating: image pull and container start."""
    duration_s: Span | None = None
    """Running time until the pod ends (`end`); None: runs until the simulation stops."""
    end: Literal["completed", "oomkilled", "error"] = "completed"
    crash_after_s: Span = (15.0, 45.0)
    """crashloop: seconds the container runs before each crash."""
    crash_reason: Literal["error", "oomkilled"] = "error"
    mem_fraction: Span = (0.3, 0.85)
    """VRAM of each process, as a share of its GPU (of one replica's share when time-sliced)."""
    peak_util_pct: Span | None = None
    """Training plateau, inference daily peak, dev burst level; None: the profile's range."""
    unallocated_gpus: NonNegative = 0
    """GPUs of its node the pod's process reaches without an allocation (a leak through
    NVIDIA_VISIBLE_DEVICES=all), unallocated ones first."""
    recreate_after_s: Span | None = None
    """After a pod ends, its replacement `<name>-<i>-<n>` is created this much later."""
    work: dict[UnitName, Annotated[float, msgspec.Meta(gt=0)]] = msgspec.field(default_factory=dict)
    """Units of work each pod reports done a second while its container runs (`steps: 10`,
    `tokens: 1500`): a Prometheus counter per unit, served by the simulator and named in
    the pod's `gpuwatch.io/work` annotation, which the node agents scrape."""


DEFAULT_OWNER = {"training": "job", "idle": "job"}
"""Workload kinds whose pods a Job owns unless `owner` says otherwise (the cluster's
DEFAULT_OWNERS)."""
AGENT_DOWN_S = 120.0  # an agent-down fault without duration_s: two minutes without samples
GPU_FAULTS = frozenset({"xid", "throttle", "ecc", "remap-failure"})


class Fault(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Something that goes wrong on a node: its agent stops (`agent-down`), or one of its
    GPUs reports an Xid, throttles, has a double-bit ECC error or fails a row remapping."""

    kind: Literal["agent-down", "xid", "throttle", "ecc", "remap-failure"]
    node: str
    at_s: Annotated[float, msgspec.Meta(ge=0)]
    duration_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """agent-down: how long no sample is sent (AGENT_DOWN_S when not given); throttle: how
    long the reason is active; xid 79: how long the GPU is lost. Not given: for good."""
    gpu: NonNegative = 0
    """xid, throttle, ecc, remap-failure: index of the GPU."""
    code: Annotated[int, msgspec.Meta(ge=1)] = XID_FALLEN_OFF_THE_BUS
    """xid: the code (79: fallen off the bus, 48: double-bit ECC, 31: MMU fault)."""
    reason: str = "hw_thermal_slowdown"
    """throttle: the clock event reason (schemas.nvml_sample.THROTTLE_REASONS)."""


class Queue(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A Kueue LocalQueue and its ClusterQueue (both named `name`), with a nominal quota
    of `gpus` GPU devices (of whatever GPU resource its workloads ask for)."""

    name: Name
    gpus: NonNegative


class Scenario(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A synthetic cluster and what runs on it."""

    name: Name
    description: str = ""
    seed: int = 0
    scheduler: Literal["spread", "binpack"] = "spread"
    """spread: the node with the most free GPUs (the default scheduler's LeastAllocated);
    binpack: the fullest node that fits (MostAllocated)."""
    finished_ttl_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    """Finished pods are deleted this long after they end; None: kept."""
    nodes: Annotated[tuple[NodePool, ...], msgspec.Meta(min_length=1)]
    workloads: tuple[Workload, ...] = ()
    faults: tuple[Fault, ...] = ()
    queues: tuple[Queue, ...] = ()
    """Kueue's queues (admission in submission order, as a StrictFIFO ClusterQueue)."""


def scenario_names() -> list[str]:
    """The scenarios shipped in SCENARIOS_DIR."""
    return sorted(path.stem for path in SCENARIOS_DIR.glob("*.yaml"))


def _path_of(ref: str | Path) -> Path:
    text = str(ref)
    if isinstance(ref, Path) or "/" in text or text.endswith((".yaml", ".yml")):
        return Path(ref)
    path = SCENARIOS_DIR / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(scenario_names()) or "none"
        raise ScenarioError(f"no scenario named {text!r} (shipped: {known}; or give a path)")
    return path


def load_scenario(ref: str | Path) -> Scenario:
    """A shipped scenario by name (`small`), or a YAML file by path; ScenarioError if unusable."""
    path = _path_of(ref)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_scenario(text, str(path))


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """A scenario from YAML text; errors name `source` and the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping with `name` and `nodes`")
    try:
        scenario = msgspec.convert(data, Scenario)
    except msgspec.ValidationError as exc:
        raise ScenarioError(f"{source}: {exc}") from exc
    problems = list(_problems(scenario))
    if problems:
        raise ScenarioError(f"{source}: " + "; ".join(problems))
    return scenario


def check(scenario: Scenario, source: str = "<scenario>") -> Scenario:
    """The scenario if it is consistent (after overrides too), else ScenarioError."""
    problems = list(_problems(scenario))
    if problems:
        raise ScenarioError(f"{source}: " + "; ".join(problems))
    return scenario


def with_overrides(
    scenario: Scenario,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    seed: int | None = None,
) -> Scenario:
    """`nodes` nodes in every pool, `gpus_per_node` GPUs on every node, another seed."""
    pools = scenario.nodes
    if nodes is not None:
        if nodes < 1:
            raise ScenarioError(f"--nodes must be 1 or more, not {nodes}")
        pools = tuple(msgspec.structs.replace(p, count=nodes) for p in pools)
    if gpus_per_node is not None:
        if not 1 <= gpus_per_node <= 16:
            raise ScenarioError(f"--gpus-per-node must be 1 to 16, not {gpus_per_node}")
        pools = tuple(msgspec.structs.replace(p, gpus_per_node=gpus_per_node) for p in pools)
    out = msgspec.structs.replace(
        scenario, nodes=pools, seed=scenario.seed if seed is None else seed
    )
    return check(out, f"scenario {scenario.name} with overrides")


def node_names(pool: NodePool) -> list[str]:
    """The names of a pool's nodes: `<pool>-0`, `<pool>-1`, ..."""
    return [f"{pool.pool}-{i}" for i in range(pool.count)]


def mig_profile_parts(profile: str) -> tuple[int, int]:
    """(compute slices, GB) of a MIG profile `3g.40gb`; ValueError when it is not one."""
    found = MIG_PROFILE.match(profile)
    if found is None:
        raise ValueError(f"{profile!r} is not a MIG profile like 1g.10gb or 3g.40gb")
    return int(found["slices"]), int(found["gb"])


def mig_instance_bytes(profile: str) -> int:
    """The memory of a MIG instance: the profile's GB in units of 1000 MiB, as drivers
    report them (an H100's 7g.80gb has 80 000 MiB of its 81 559)."""
    return mig_profile_parts(profile)[1] * 1000 * (1 << 20)


def _span_problems(where: str, span: Span | None, low: float, high: float) -> Iterator[str]:
    if span is None:
        return
    values = span if isinstance(span, tuple) else (span,)
    if any(not math.isfinite(v) for v in values):
        yield f"{where}: must be a finite number"
    elif isinstance(span, tuple) and span[0] > span[1]:
        yield f"{where}: [low, high] with low <= high, got {list(span)}"
    elif any(not low <= v <= high for v in values):
        yield f"{where}: must be within {low:g} and {high:g}, got {span}"


def _pool_problems(index: int, pool: NodePool) -> Iterator[str]:
    at = f"$.nodes[{index}]"
    if pool.model not in GPU_MODELS:
        yield f"{at}.model: unknown GPU model {pool.model!r} (known: {', '.join(GPU_MODELS)})"
        return
    if pool.dra and pool.sharing == "time-slicing":
        yield f"{at}.dra: a DRA pool shares GPUs through shared claims, not replicas"
    if pool.sharing == "time-slicing" and pool.replicas is None:
        yield f"{at}.replicas: time-slicing needs replicas (2 or more)"
    if pool.sharing != "time-slicing" and pool.replicas is not None:
        yield f"{at}.replicas: only for sharing: time-slicing"
    if pool.sharing != "mig":
        if pool.mig_profiles:
            yield f"{at}.mig_profiles: only for sharing: mig"
        return
    if pool.model not in MIG_MODELS:
        yield f"{at}.sharing: {pool.model} has no MIG (MIG models: {', '.join(sorted(MIG_MODELS))})"
        return
    if not pool.mig_profiles:
        yield f"{at}.mig_profiles: sharing mig needs the profiles of each GPU"
        return
    slices, memory = 0, 0
    for j, profile in enumerate(pool.mig_profiles):
        try:
            slices += mig_profile_parts(profile)[0]
        except ValueError as exc:
            yield f"{at}.mig_profiles[{j}]: {exc}"
            return
        memory += mig_instance_bytes(profile)
    if slices > MIG_SLICES or memory > GPU_MODELS[pool.model].mem_total_bytes:
        yield (
            f"{at}.mig_profiles: {slices} compute slices and {memory >> 30} GiB do not fit "
            f"one {pool.model} ({MIG_SLICES} slices, "
            f"{GPU_MODELS[pool.model].mem_total_bytes >> 30} GiB)"
        )


def _workload_problems(index: int, w: Workload, pools: dict[str, NodePool]) -> Iterator[str]:
    at = f"$.workloads[{index}]"
    if w.pool is not None and w.pool not in pools:
        yield f"{at}.pool: no node pool {w.pool!r} (pools: {', '.join(pools)})"
    if w.pods is not None and w.pods_per_node is not None:
        yield f"{at}: give pods or pods_per_node, not both"
    if w.mig_profile is not None:
        offered = [
            p.pool
            for p in pools.values()
            if w.mig_profile in p.mig_profiles and w.pool in (None, p.pool)
        ]
        if not offered:
            where = f"pool {w.pool}" if w.pool else "pool"
            yield f"{at}.mig_profile: no {where} offers {w.mig_profile}"
    if w.kind == "crashloop" and w.duration_s is not None:
        yield f"{at}.duration_s: a crashloop workload never ends by itself"
    if w.unallocated_gpus and w.recreate_after_s is not None:
        yield f"{at}.recreate_after_s: a leaking pod is watched by name, it cannot be recreated"
    if w.gpus == 0 and w.mig_profile is not None:
        yield f"{at}.gpus: a mig_profile needs gpus of 1 or more"
    if w.claim is not None:
        dra = [p.pool for p in pools.values() if p.dra and w.pool in (None, p.pool)]
        if not dra:
            yield f"{at}.claim: no DRA pool (dra: true) for the claim"
        if w.gpus == 0:
            yield f"{at}.gpus: a claim needs gpus of 1 or more"
        if w.claim == "shared" and w.unallocated_gpus:
            yield f"{at}.unallocated_gpus: not with a shared claim"
    elif w.pool is not None and w.pool in pools and pools[w.pool].dra and w.gpus:
        yield f"{at}.claim: pool {w.pool} hands out GPUs through claims only (claim: per-pod)"
    for field, span, low, high in (
        ("start_s", w.start_s, -30 * 86_400.0, 30 * 86_400.0),
        ("pull_s", w.pull_s, 0.0, 3600.0),
        ("duration_s", w.duration_s, 1.0, 365 * 86_400.0),
        ("crash_after_s", w.crash_after_s, 1.0, 86_400.0),
        ("mem_fraction", w.mem_fraction, 0.0, 1.0),
        ("peak_util_pct", w.peak_util_pct, 0.0, 100.0),
        ("recreate_after_s", w.recreate_after_s, 0.0, 365 * 86_400.0),
    ):
        yield from _span_problems(f"{at}.{field}", span, low, high)


def _queued_problems(index: int, w: Workload, queues: set[str]) -> Iterator[str]:
    at = f"$.workloads[{index}]"
    if w.queue not in queues:
        known = ", ".join(sorted(queues)) or "none"
        yield f"{at}.queue: no queue {w.queue!r} in queues (queues: {known})"
    if (w.owner or DEFAULT_OWNER.get(w.kind)) != "job":
        yield f"{at}.queue: Kueue queues jobs here: give owner: job"
    if w.recreate_after_s is not None:
        yield f"{at}.recreate_after_s: a queued job's pods are not recreated"


def _problems(scenario: Scenario) -> Iterator[str]:
    pools: dict[str, NodePool] = {}
    for i, pool in enumerate(scenario.nodes):
        if pool.pool in pools:
            yield f"$.nodes[{i}].pool: {pool.pool!r} is named twice"
        pools[pool.pool] = pool
        yield from _pool_problems(i, pool)
    names: set[str] = set()
    queues = {q.name for q in scenario.queues}
    for i, workload in enumerate(scenario.workloads):
        if workload.name in names:
            yield f"$.workloads[{i}].name: {workload.name!r} is named twice"
        names.add(workload.name)
        yield from _workload_problems(i, workload, pools)
        if workload.queue is not None:
            yield from _queued_problems(i, workload, queues)
    nodes = {name: p for p in scenario.nodes for name in node_names(p)}
    for i, fault in enumerate(scenario.faults):
        yield from _fault_problems(i, fault, nodes.get(fault.node))


def _fault_problems(index: int, fault: Fault, owner: NodePool | None) -> Iterator[str]:
    at = f"$.faults[{index}]"
    if owner is None:
        yield f"{at}.node: no node {fault.node!r} (nodes are <pool>-<index>)"
    elif fault.kind in GPU_FAULTS and fault.gpu >= owner.gpus_per_node:
        yield f"{at}.gpu: {fault.node} has GPUs 0 to {owner.gpus_per_node - 1}"
    elif fault.kind == "remap-failure" and owner.sharing == "mig":
        yield f"{at}.kind: a GPU in MIG mode reports no remapped rows (N/A under MIG)"
    if fault.kind == "throttle" and fault.reason not in THROTTLE_REASONS:
        yield (
            f"{at}.reason: unknown throttle reason {fault.reason!r} "
            f"(known: {', '.join(THROTTLE_REASONS)})"
        )
    if fault.duration_s is not None:
        if fault.kind in ("ecc", "remap-failure"):
            yield f"{at}.duration_s: {fault.kind} lasts until the GPU is replaced or reset"
        elif fault.kind == "xid" and fault.code != XID_FALLEN_OFF_THE_BUS:
            yield f"{at}.duration_s: only Xid 79 has one (the time the GPU is lost)"
        elif not math.isfinite(fault.duration_s):
            yield f"{at}.duration_s: must be a finite number"
