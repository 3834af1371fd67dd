"""Integrals of one split GPU interval: seconds, energy and dollars per pod and per GPU.

Every number here is an integral over `[ts, ts + interval_ms)`, so the integrals of an
interval cut into pieces sum to those of the whole (`scaled`), except `vram_peak_bytes`,
which is a maximum. Conventions where docs/DESIGN.md §4 leaves room:

- Seconds with an unknown reading are neither busy nor idle, for the GPU and for a pod; they
  still count as allocated (and cost), never as waste. A GPU's allocated idle seconds are
  device-idle seconds with a holder; a pod's idle seconds follow its own share.
- Energy: the device's energy times the pod's compute share (the part of the device's work
  it did; idle draw goes to no one), or times its allocated fraction where its share is
  unknown. Unknown power (MIG instances: the parent carries it) is 0 joules, not a guess.
- Cost: a GPU-second costs the price per hour / 3600 and goes to the holders in equal parts
  (1/k each); with no holder it goes to no one (fleet idle cost). A MIG instance costs its
  compute slices' part of the GPU price (`PriceBook`).
"""

import re
from collections.abc import Mapping

import msgspec

from schemas.fields import DEFAULT_CLUSTER, AttributionMethod
from schemas.ids import NodeName, PodUid
from schemas.nvml_sample import GpuReading, NvmlSample
from schemas.prices import PriceTable
from streams.core.split import GpuSplit, SampleView, sample_view, split_gpu

__all__ = [
    "PRECISION",
    "GpuIntegrals",
    "NodePrices",
    "PodGpuIntegrals",
    "PodIntegrals",
    "PriceBook",
    "SampleIntegrals",
    "integrate",
    "integrate_sample",
    "least_precise",
    "scaled",
    "share_mean",
]

_S_PER_HOUR = 3600.0
_MS_PER_S = 1000.0
# Compute slices (GPCs) of a MIG-capable GPU: 7 on A100, H100, H200, B200; the A30 has 4.
_MIG_SLICES = 7
_MIG_SLICES_BY_MODEL = {"A30": 4}
_MIG_G = re.compile(r"^(\d+)g\.")  # "3g.40gb" -> 3 compute slices

PRECISION: dict[AttributionMethod, int] = {
    "exclusive": 0,
    "process": 1,
    "memory_share": 2,
    "unknown": 3,
}
"""Attribution methods from most to least precise: where one GPU's method changes within
a sum of integrals, or a record covers several GPUs, the least precise is reported."""


def least_precise(methods: list[AttributionMethod]) -> AttributionMethod:
    """The least precise of some methods; unknown when there are none."""
    return max(methods, key=PRECISION.__getitem__, default="unknown")


def share_mean(used_gpu_seconds: float, share_seconds: float) -> float | None:
    """The mean compute share over the seconds it was known (None: never known)."""
    if share_seconds > 0:
        return min(1.0, used_gpu_seconds / share_seconds)
    return None


class PodGpuIntegrals(msgspec.Struct, kw_only=True, gc=False):
    """A pod's integrals on one GPU: the fields every per-pod total keeps, declared once.

    Each interval's `PodIntegrals`, the node side's pending usage (`usage.GpuUsageAcc`) and
    the pod side's open windows (`pod_state.GpuTotals`) extend it. Stored states name their
    keys, so a state written with the fields in another order decodes the same.
    """

    allocated_seconds: float = 0.0
    used_gpu_seconds: float = 0.0
    idle_seconds: float = 0.0
    vram_byte_seconds: float = 0.0
    vram_peak_bytes: int = 0
    energy_joules: float = 0.0
    cost_usd: float = 0.0
    waste_usd: float = 0.0


# msgspec lets a frozen Struct extend a mutable one; mypy applies the dataclass rule.
class PodIntegrals(PodGpuIntegrals, frozen=True, kw_only=True, gc=False):  # type: ignore[misc]
    """One pod on one GPU over one interval (or a piece of one).

    `share_seconds` is the time its share was known (the weight of `share_mean`); `idle` its
    state in the interval (None: unknown), for `idle_since`.
    """

    uid: PodUid
    share_seconds: float
    method: AttributionMethod
    idle: bool | None


class GpuIntegrals(msgspec.Struct, frozen=True, gc=False):
    """One GPU over one interval (or a piece of one).

    `util_seconds` integrates the reading as a ratio over the `util_known_seconds` it was
    known; `attributed_seconds` and `unattributed_seconds` split `util_seconds` into what the
    pods' shares explain and the rest (only where the reading is known).
    """

    seconds: float
    busy_seconds: float
    idle_seconds: float
    allocated_seconds: float
    allocated_idle_seconds: float
    unallocated_seconds: float
    util_seconds: float
    util_known_seconds: float
    attributed_seconds: float
    unattributed_seconds: float
    pods: tuple[PodIntegrals, ...]


def integrate(
    split: GpuSplit, seconds: float, power_w: float | None, usd_per_hour: float
) -> GpuIntegrals:
    """The integrals of one split over `seconds`, at the GPU's power and price."""
    gpu_cost = usd_per_hour / _S_PER_HOUR * seconds
    gpu_energy = 0.0 if power_w is None else power_w * seconds
    pods = []
    for pod in split.pods:
        af = pod.allocated_fraction
        share = pod.share
        cost = gpu_cost * af
        vram = pod.vram_bytes or 0
        idle = pod.idle
        pods.append(
            PodIntegrals(
                uid=pod.uid,
                allocated_seconds=seconds * af,
                used_gpu_seconds=0.0 if share is None else seconds * share,
                share_seconds=0.0 if share is None else seconds,
                idle_seconds=seconds * af if idle else 0.0,
                vram_byte_seconds=vram * seconds,
                vram_peak_bytes=vram,
                energy_joules=gpu_energy * (af if share is None else share),
                cost_usd=cost,
                waste_usd=cost if idle else 0.0,
                method=pod.method,
                idle=idle,
            )
        )
    util = split.util
    idle = split.idle
    allocated = seconds if split.holders else 0.0
    unattributed = split.unattributed
    if util is None or unattributed is None:
        util_s = known_s = attributed_s = unattributed_s = 0.0
    else:
        util_s, known_s = util * seconds, seconds
        unattributed_s = unattributed * seconds
        attributed_s = max(0.0, util_s - unattributed_s)
    return GpuIntegrals(
        seconds,
        seconds if idle is False else 0.0,
        seconds if idle else 0.0,
        allocated,
        allocated if idle else 0.0,
        seconds - allocated,
        util_s,
        known_s,
        attributed_s,
        unattributed_s,
        tuple(pods),
    )


def scaled(gpu: GpuIntegrals, fraction: float) -> GpuIntegrals:
    """The integrals of a piece `fraction` long of the interval; peaks stay as they are."""
    f = fraction
    pods = tuple(
        PodIntegrals(
            uid=p.uid,
            allocated_seconds=p.allocated_seconds * f,
            used_gpu_seconds=p.used_gpu_seconds * f,
            share_seconds=p.share_seconds * f,
            idle_seconds=p.idle_seconds * f,
            vram_byte_seconds=p.vram_byte_seconds * f,
            vram_peak_bytes=p.vram_peak_bytes,
            energy_joules=p.energy_joules * f,
            cost_usd=p.cost_usd * f,
            waste_usd=p.waste_usd * f,
            method=p.method,
            idle=p.idle,
        )
        for p in gpu.pods
    )
    return GpuIntegrals(
        gpu.seconds * f,
        gpu.busy_seconds * f,
        gpu.idle_seconds * f,
        gpu.allocated_seconds * f,
        gpu.allocated_idle_seconds * f,
        gpu.unallocated_seconds * f,
        gpu.util_seconds * f,
        gpu.util_known_seconds * f,
        gpu.attributed_seconds * f,
        gpu.unattributed_seconds * f,
        pods,
    )


class NodePrices:
    """The prices of one cluster and set of node labels; each (model, MIG profile) looked
    up once."""

    __slots__ = ("_cache", "_cluster", "_labels", "_table")

    def __init__(
        self, table: PriceTable, labels: Mapping[str, str], cluster: str = DEFAULT_CLUSTER
    ) -> None:
        self._table = table
        self._labels = dict(labels)
        self._cluster = cluster
        self._cache: dict[tuple[str, str | None], float] = {}

    def usd_per_hour(self, model: str, mig_profile: str | None) -> float:
        """Price per hour of a whole GPU of `model`, or of a MIG instance of `mig_profile`."""
        key = (model, mig_profile)
        price = self._cache.get(key)
        if price is None:
            price = self._table.usd_per_gpu_hour(model, self._labels, self._cluster)
            price *= _mig_fraction(model, mig_profile)
            self._cache[key] = price
        return price


class PriceBook:
    """Prices by node: nodes with the same cluster and labels share one `NodePrices`.

    A node is `(cluster, node)`: node names repeat across clusters. Node labels (for price
    overrides) change rarely and come from `k8s.nodes`: give them with `set_node_labels`;
    a node never given is priced with no labels.
    """

    def __init__(self, table: PriceTable) -> None:
        self._table = table
        self._by_labels: dict[tuple[str, tuple[tuple[str, str], ...]], NodePrices] = {}
        self._by_cluster: dict[str, dict[str, NodePrices]] = {}

    def set_node_labels(
        self, node: str, labels: Mapping[str, str], cluster: str = DEFAULT_CLUSTER
    ) -> None:
        """The labels of `node` of `cluster` from now on."""
        nodes = self._by_cluster.setdefault(cluster, {})
        nodes[node] = self._prices(cluster, tuple(sorted(labels.items())))

    def node(self, node: str, cluster: str = DEFAULT_CLUSTER) -> NodePrices:
        """The prices in force on `node` of `cluster`."""
        nodes = self._by_cluster.get(cluster)
        if nodes is None:
            nodes = self._by_cluster[cluster] = {}
        prices = nodes.get(node)
        if prices is None:
            prices = nodes[node] = self._prices(cluster, ())
        return prices

    def _prices(self, cluster: str, labels: tuple[tuple[str, str], ...]) -> NodePrices:
        key = (cluster, labels)
        prices = self._by_labels.get(key)
        if prices is None:
            prices = self._by_labels[key] = NodePrices(self._table, dict(labels), cluster)
        return prices


def _mig_fraction(model: str, mig_profile: str | None) -> float:
    """Part of the GPU a MIG instance is: its compute slices of the GPU's; 1 if not MIG.

    An unparsable profile is charged the whole GPU (over-, never under-charged).
    """
    if mig_profile is None:
        return 1.0
    match = _MIG_G.match(mig_profile)
    if match is None:
        return 1.0
    slices = next((n for name, n in _MIG_SLICES_BY_MODEL.items() if name in model), _MIG_SLICES)
    return min(1.0, int(match.group(1)) / slices)


class SampleIntegrals(msgspec.Struct, frozen=True, gc=False):
    """Every accountable GPU of one node sample with its integrals, and the pods' names."""

    node: NodeName
    ts: int
    end_ts: int
    gpus: tuple[tuple[GpuReading, GpuIntegrals], ...]
    names: dict[PodUid, tuple[str, str]]


_NO_HOLDERS: tuple[PodUid, ...] = ()


def integrate_sample(
    sample: NvmlSample,
    idle_util_pct: float,
    prices: PriceBook,
    view: SampleView | None = None,
) -> SampleIntegrals:
    """Split and integrate every accountable GPU of a node sample (MIG parents skipped).

    `view` is the sample's `sample_view`, where the caller has it already.
    """
    if view is None:
        view = sample_view(sample)
    holders = view.allocations.holders
    seconds = sample.interval_ms / _MS_PER_S
    node = sample.node
    price_of = prices.node(node, sample.cluster).usd_per_hour
    out = []
    for gpu in view.accountable:
        held = holders.get(gpu.uuid, _NO_HOLDERS)
        price = price_of(gpu.model, gpu.mig_profile)
        integrals = integrate(split_gpu(gpu, held, idle_util_pct), seconds, gpu.power_w, price)
        out.append((gpu, integrals))
    return SampleIntegrals(
        node, sample.ts, sample.ts + sample.interval_ms, tuple(out), view.allocations.names
    )
