"""GPU price table: USD per GPU-hour by model, with per-cluster and per-node-label overrides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .fields import DEFAULT_CLUSTER

UsdPerHour = Annotated[float, Field(ge=0)]


class PriceOverride(BaseModel):
    """Prices for the nodes of one cluster, or that carry one label value (a spot pool), or both.

    An override names a `cluster`, a `label` with its `value`, or both (then a node must
    match both: the spot pool of one cluster).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    label: str | None = Field(default=None, min_length=1)
    """Node label name, e.g. `node.kubernetes.io/instance-type` or `karpenter.sh/capacity-type`;
    None: any node of `cluster`."""
    value: str | None = None
    """The label value this override applies to, e.g. `spot` (given with `label`)."""
    cluster: str | None = Field(default=None, min_length=1)
    """The cluster whose nodes this override applies to (`default`: messages that name
    none); None: nodes of every cluster."""
    models: dict[str, UsdPerHour] = Field(default_factory=dict)
    """Model pattern -> USD per GPU-hour on these nodes (same matching as the table)."""
    default_usd_per_gpu_hour: float | None = Field(default=None, ge=0)
    """Price of a GPU on these nodes whose model no pattern matches; None: the table's."""

    @model_validator(mode="after")
    def _names_nodes(self) -> PriceOverride:
        if (self.label is None) != (self.value is None):
            raise ValueError("an override's label and value are given together")
        if self.label is None and self.cluster is None:
            raise ValueError("an override names a cluster, a label and value, or both")
        return self

    def applies(self, node_labels: Mapping[str, str], cluster: str) -> bool:
        """Whether the override applies to a node of `cluster` with `node_labels`."""
        if self.cluster is not None and self.cluster != cluster:
            return False
        return self.label is None or node_labels.get(self.label) == self.value


class PriceTable(BaseModel):
    """USD per GPU-hour. A model matches the longest pattern it contains (case-insensitive)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    default_usd_per_gpu_hour: float = Field(default=2.0, ge=0)
    """Price of a GPU whose model no pattern matches."""
    models: dict[str, UsdPerHour] = Field(default_factory=dict)
    """Model pattern (a substring of the NVML model name) -> USD per GPU-hour."""
    overrides: tuple[PriceOverride, ...] = ()
    """Per-cluster and per-node-label prices; the first override that applies wins."""

    def usd_per_gpu_hour(
        self, model: str | None, node_labels: Mapping[str, str], cluster: str = DEFAULT_CLUSTER
    ) -> float:
        """The price of one GPU-hour of `model` on a node of `cluster` with `node_labels`."""
        for override in self.overrides:
            if override.applies(node_labels, cluster):
                price = _match(override.models, model)
                if price is not None:
                    return price
                if override.default_usd_per_gpu_hour is not None:
                    return override.default_usd_per_gpu_hour
                break
        price = _match(self.models, model)
        return self.default_usd_per_gpu_hour if price is None else price


def _match(models: Mapping[str, float], model: str | None) -> float | None:
    if not model:
        return None
    name = model.casefold()
    best: tuple[int, float] | None = None
    for pattern, price in models.items():
        if pattern.casefold() in name and (best is None or len(pattern) > best[0]):
            best = (len(pattern), price)
    return None if best is None else best[1]


# On-demand list prices per GPU-hour of the large clouds in 2025-2026, rounded: a
# starting point for showing waste in dollars, not anyone's bill. Set GPUWATCH_PRICES
# to a file of your own contract prices.
BUILTIN_PRICES = PriceTable(
    default_usd_per_gpu_hour=2.0,
    models={
        "H200": 5.00,
        "H100": 4.00,
        "H100 NVL": 4.50,
        "GH200": 5.50,
        "B200": 7.00,
        "A100-SXM4-80GB": 3.00,
        "A100 80GB": 3.00,
        "A100": 2.50,
        "L40S": 1.80,
        "L40": 1.50,
        "L4": 0.80,
        "A10G": 1.00,
        "A10": 1.00,
        "T4": 0.50,
        "V100": 1.50,
    },
)
