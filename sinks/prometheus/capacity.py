"""The fleet's capacity as series: free GPUs per node; stranded, reclaimable and blocked per
model and GPU resource, from the latest `capacity` record of each (cluster, model, resource).

A record is the whole picture of its key (streams/SEMANTICS-capacity.md), so it replaces the
key's series at once: a node that left `free_by_node` (it has nothing free now) loses its
`gpuwatch_free_gpus` series, and an absent series reads as no free device
(`sum by (model) (gpuwatch_free_gpus)` is the record's `free`). Removal rather than a 0
because the record lists only nodes with something free: keeping a 0 for every node ever
seen would hold series of nodes long deleted, and which nodes are there at all is the node
metrics' business, not this one's. A model whose nodes all went away keeps its zero counts.

Only a record of a later `ts` replaces a key's picture: the topic is read again from its
start whenever a partition comes to a metrics sink, and a redelivered or older record must
not bring back an older picture. Keys are few (clusters x models x GPU resources); at most
`max_keys` are held, the rest refused and counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schemas.capacity import Capacity
from sinks.prometheus.collector import CAPACITY_LABELS, FREE_LABELS, Row, clean, label_text

__all__ = ["CAPACITY_FAMILIES", "CapacitySeries"]

CAPACITY_FAMILIES = (
    "gpuwatch_free_gpus",
    "gpuwatch_stranded_gpus",
    "gpuwatch_reclaimable_gpus",
    "gpuwatch_blocked_pods",
)
"""The families a capacity record feeds, free devices per node first."""


@dataclass(frozen=True, slots=True)
class _Picture:
    """One key's latest record (its `ts`) as the rows of each family."""

    ts: int
    rows: dict[str, tuple[Row, ...]]


def _rows(rec: Capacity) -> dict[str, tuple[Row, ...]]:
    """The series of one record; label values cleaned and their text built once, here."""
    model = (clean(rec.model), clean(rec.resource), clean(rec.cluster))
    text = label_text(CAPACITY_LABELS, model)
    free = []
    for node, count in sorted(rec.free_by_node.items()):
        if count > 0:  # the record lists only nodes with free devices; a 0 is none
            values = (clean(node), *model)
            free.append((values, label_text(FREE_LABELS, values), float(count)))
    return {
        "gpuwatch_free_gpus": tuple(free),
        "gpuwatch_stranded_gpus": ((model, text, float(rec.stranded)),),
        "gpuwatch_reclaimable_gpus": ((model, text, float(rec.reclaimable)),),
        "gpuwatch_blocked_pods": ((model, text, float(rec.blocked)),),
    }


class CapacitySeries:
    """The latest capacity picture of each key, at most `max_keys` keys; not thread-safe."""

    def __init__(self, max_keys: int) -> None:
        self._max = max_keys
        self._pictures: dict[str, _Picture] = {}

    def __len__(self) -> int:
        """The number of keys held."""
        return len(self._pictures)

    def observe(self, rec: Capacity) -> int:
        """Apply a record unless its key holds one as new or newer; 1 when refused by the
        cap (a key not held while `max_keys` are), else 0."""
        key = rec.key()
        held = self._pictures.get(key)
        if held is not None and rec.ts <= held.ts:
            return 0  # read again, or older than the picture shown
        if held is None and len(self._pictures) >= self._max:
            return 1
        self._pictures[key] = _Picture(rec.ts, _rows(rec))
        return 0

    def forget(self, keys: Iterable[str]) -> None:
        """Drop the pictures of `keys` (`capacity_key`s of a revoked partition)."""
        for key in keys:
            self._pictures.pop(key, None)

    def rows(self) -> dict[str, list[Row]]:
        """Family name -> every series, keys in the order they came, nodes by name."""
        out: dict[str, list[Row]] = {name: [] for name in CAPACITY_FAMILIES}
        for picture in self._pictures.values():
            for name, rows in picture.rows.items():
                out[name].extend(rows)
        return out
