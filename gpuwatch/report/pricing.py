"""What one second of each GPU costs, as the worker priced it: for the GPU time nobody held.

The worker prices a GPU-second from the price table (the `prices` setting,
`GPUWATCH_PRICES`) by GPU model, cluster and node labels, a MIG instance at its part of
the GPU (`streams.core.integrals.PriceBook`); a pod's `cost_usd` is that price times its
allocated seconds. The report prices the `unallocated_seconds` of `gpu.windows` with the
same price, found in this order:

1. the GPU's own price in the worker's records of the period: the sum of the pods'
   `cost_usd` on it over the sum of their allocated seconds (`gpus[]` of `attribution`).
   This is the price the worker used, node labels and MIG part included;
2. a GPU no pod held in the period: the price of a GPU of the same model on the same node
   found as in 1 (the node's labels are in it);
3. else the price table for its model, cluster and node labels, the labels from the last
   `k8s.nodes` record of the node read (none read: no labels, as the worker prices a node
   never described);
4. a MIG instance no pod held: the part of its GPU's table price (3) that the instances
   priced by 1 leave, in equal parts among the instances of that GPU not priced by 1
   (exact when one is left; the worker's own N/7 per profile cannot be known without
   the profile, which `gpu.windows` does not carry). Never below 0.

Prices are learned from the attribution records fed before the GPU windows (`learn`,
then `usd_per_second`); a GPU's price, once asked, is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from schemas.attribution import GpuAttribution
from schemas.prices import PriceTable

__all__ = ["FleetPrices"]

HOUR_S: Final = 3600.0


class _Learned:
    """The cost and allocated seconds of one GPU in the worker's records, and where it is."""

    __slots__ = ("allocated_s", "cost", "mig", "model", "node")

    def __init__(self, node: str | None, model: str, mig: bool) -> None:
        self.cost = 0.0
        self.allocated_s = 0.0
        self.node, self.model, self.mig = node, model, mig


class FleetPrices:
    """USD per second of each GPU of the fleet, as the worker priced it (see the module doc)."""

    def __init__(self, table: PriceTable) -> None:
        self._table = table
        self._learned: dict[tuple[str, str], _Learned] = {}
        self._labels: dict[tuple[str, str], Mapping[str, str]] = {}
        self._by_node: dict[tuple[str, str | None, str], float] | None = None
        self._cache: dict[tuple[str, str], float] = {}

    def learn(self, cluster: str, node: str | None, gpu: GpuAttribution) -> None:
        """One pod's share of one GPU in a window: its cost and allocated seconds."""
        key = (cluster, gpu.uuid)
        learned = self._learned.get(key)
        if learned is None:
            learned = self._learned[key] = _Learned(node, gpu.model, gpu.sharing == "mig")
        learned.cost += gpu.cost_usd
        learned.allocated_s += gpu.allocated_gpu_seconds

    def node_labels(self, cluster: str, node: str, labels: Mapping[str, str]) -> None:
        """The labels of a node (from `k8s.nodes`; the last given wins)."""
        self._labels[(cluster, node)] = labels

    def learned(self, cluster: str, uuid: str) -> float | None:
        """USD per second of a GPU by rule 1, None when no pod held it."""
        learned = self._learned.get((cluster, uuid))
        if learned is None or learned.allocated_s <= 0:
            return None
        return learned.cost / learned.allocated_s

    def usd_per_second(
        self, cluster: str, node: str, uuid: str, model: str, *, mig: bool = False
    ) -> float:
        """USD per second of a GPU by rules 1 to 3 (a MIG instance: its whole GPU's by 3,
        when no pod held it: `mig_remainder` splits that)."""
        key = (cluster, uuid)
        price = self._cache.get(key)
        if price is None:
            price = self.learned(cluster, uuid)
            if price is None and not mig:
                price = self._node_model(cluster, node, model)
            if price is None:
                price = self.table_price(cluster, node, model)
            self._cache[key] = price
        return price

    def table_price(self, cluster: str, node: str, model: str) -> float:
        """USD per second of a whole GPU of `model` on `node` by the price table (rule 3)."""
        labels = self._labels.get((cluster, node), {})
        return self._table.usd_per_gpu_hour(model, labels, cluster) / HOUR_S

    def mig_remainder(self, cluster: str, node: str, model: str, instances: set[str]) -> float:
        """USD per second of each instance of one GPU that no pod held (rule 4); `instances`
        are every instance of that GPU seen in the period."""
        known = [p for uuid in instances if (p := self.learned(cluster, uuid)) is not None]
        unknown = len(instances) - len(known)
        if unknown <= 0:
            return 0.0
        return max(0.0, self.table_price(cluster, node, model) - sum(known)) / unknown

    def _node_model(self, cluster: str, node: str, model: str) -> float | None:
        """Rule 2: the price of the held GPUs of `model` on the node (whole GPUs only)."""
        if self._by_node is None:
            sums: dict[tuple[str, str | None, str], list[float]] = {}
            for (gpu_cluster, _), learned in self._learned.items():
                if learned.mig or learned.allocated_s <= 0:
                    continue
                both = sums.setdefault((gpu_cluster, learned.node, learned.model), [0.0, 0.0])
                both[0] += learned.cost
                both[1] += learned.allocated_s
            self._by_node = {key: cost / seconds for key, (cost, seconds) in sums.items()}
        return self._by_node.get((cluster, node, model))
