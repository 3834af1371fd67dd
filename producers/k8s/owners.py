"""A pod's owner, resolved to the workload people know: ReplicaSet -> Deployment, Job -> CronJob.

Pods point at their direct controller. For two kinds that one is an implementation
detail, so one lookup goes a level up: a ReplicaSet's controller (a Deployment, an Argo
Rollout) and a Job's controller (a CronJob, a JobSet). Answers are cached: an object's
controller does not change, and a busy namespace has thousands of pods per ReplicaSet.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from producers.k8s.objects import OwnerReference
from schemas.k8s_pod import Owner

log = logging.getLogger(__name__)

RESOLVED_KINDS = frozenset({"ReplicaSet", "Job"})
CACHE_SIZE = 10_000  # ReplicaSets and Jobs remembered; far above one cluster's live ones


class LookupFailed(Exception):  # noqa: N818 - a condition, like SendBlocked
    """The owner's own owner could not be read now (API down); try again on the next event."""


Lookup = Callable[[str, str, str], OwnerReference | None]
"""(kind, namespace, name) -> the controller reference of that object, None when it has
none or does not exist (404, 403); raises LookupFailed when the answer is unknown."""


def controller_of(references: Sequence[OwnerReference] | None) -> OwnerReference | None:
    """The controlling reference (`controller: true`), else the first one, else None."""
    references = [ref for ref in references or () if ref.get("kind") and ref.get("name")]
    for ref in references:
        if ref.get("controller"):
            return ref
    return references[0] if references else None


@dataclass
class OwnerStats:
    """Lookups made and failed, for the watcher's metrics."""

    lookups: int = 0
    failures: int = 0


class OwnerResolver:
    """Resolves a pod's owner references to an `Owner`, one API lookup per ReplicaSet/Job."""

    def __init__(self, lookup: Lookup | None, cache_size: int = CACHE_SIZE) -> None:
        self._lookup = lookup
        self._cache: OrderedDict[tuple[str, str, str], Owner | None] = OrderedDict()
        self._cache_size = cache_size
        self.stats = OwnerStats()

    def resolve(self, namespace: str, references: Sequence[OwnerReference] | None) -> Owner | None:
        """The top workload where one lookup finds it, else the direct controller."""
        ref = controller_of(references)
        if ref is None:
            return None
        direct = Owner(kind=str(ref.get("kind")), name=str(ref.get("name")))
        if direct.kind not in RESOLVED_KINDS or self._lookup is None:
            return direct
        parent = self._parent(direct.kind, namespace, direct.name)
        return parent or direct

    def _parent(self, kind: str, namespace: str, name: str) -> Owner | None:
        key = (kind, namespace, name)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        assert self._lookup is not None
        self.stats.lookups += 1
        try:
            ref = self._lookup(kind, namespace, name)
        except LookupFailed as exc:
            # Not cached: the next event of the pod asks again and gets the full answer.
            self.stats.failures += 1
            log.warning(
                "owner lookup failed kind=%s object=%s/%s error=%s", kind, namespace, name, exc
            )
            return None
        parent = controller_of([ref]) if ref is not None else None
        owner = (
            Owner(kind=str(parent.get("kind")), name=str(parent.get("name")))
            if parent is not None
            else None
        )
        self._cache[key] = owner
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return owner
