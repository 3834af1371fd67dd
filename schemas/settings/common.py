"""What every settings group shares: the model config, and the rule of a cluster's name."""

from __future__ import annotations

import msgspec
from pydantic import ConfigDict

from schemas.fields import DEFAULT_CLUSTER, Cluster

__all__ = ["MODEL", "cluster_name"]

MODEL = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
"""Every settings group: frozen, no unknown field, each field's docstring its description."""


def cluster_name(value: object) -> str:
    """`value` if it is a cluster name by the rule of `schemas.fields.Cluster`, the type
    every message's `cluster` field has; ValueError saying what a name may hold if not."""
    if value is None or value == "":
        raise ValueError(f"empty; leave it unset for the cluster {DEFAULT_CLUSTER!r}")
    try:
        return msgspec.convert(value, Cluster)
    except msgspec.ValidationError as exc:
        raise ValueError(
            f"{value!r} is not a cluster name: 1 to 63 letters, digits, '.', '_' or '-', "
            f"starting and ending with a letter or digit ({exc})"
        ) from exc
