"""This node's ResourceSlices from the API server: the agent's table of DRA devices.

The node agent only asks when the kubelet lists a claim device of a GPU driver, so a
node without DRA never talks to the API server. The table is read again when a device
is not in it (a slice published after the pod started, a MIG device just created), at
most every `retry_s`, and every `reload_s` in any case (a driver restarted with new
devices under old names). A failure (no configuration, no answer, 403) keeps the last
table, logs one WARNING per outage and is retried at the next miss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from producers.base.dra import DeviceKey, DraDevice, table_from_slices
from producers.base.kubeapi import ApiCaller, ApiError
from producers.base.paging import node_items

__all__ = ["RESOURCE_SLICES_PATH", "ResourceSliceDevices"]

log = logging.getLogger(__name__)

RESOURCE_SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
"""`resource.k8s.io/v1`, served from Kubernetes 1.34 (DRA GA)."""


class ResourceSliceDevices:
    """DeviceLookup from the ResourceSlices of one node (field selector spec.nodeName)."""

    def __init__(
        self,
        api: Callable[[], ApiCaller],
        node: str,
        drivers: Collection[str],
        *,
        reload_s: float = 300.0,
        retry_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`api` is called once, at the first need: connecting may fail (it is retried)."""
        self._connect = api
        self._api: ApiCaller | None = None
        self._node = node
        self._drivers = frozenset(drivers)
        self._reload_s = reload_s
        self._retry_s = retry_s
        self._monotonic = monotonic
        self._table: dict[DeviceKey, DraDevice] = {}
        self._loaded_at: float | None = None
        self._tried_at: float | None = None
        self.loads = 0
        """Successful reads of the slices."""
        self.failures = 0
        """Failed reads (each one counted; the first of an outage logged)."""
        self._failing = False

    def find(self, keys: Collection[DeviceKey]) -> Mapping[DeviceKey, DraDevice]:
        """The known devices of `keys`; the slices are read again when one is missing
        (not more often than `retry_s`) or the table is older than `reload_s`."""
        if not keys:
            return {}
        now = self._monotonic()
        stale = self._loaded_at is None or now - self._loaded_at >= self._reload_s
        missing = any(key not in self._table for key in keys)
        may_retry = self._tried_at is None or now - self._tried_at >= self._retry_s
        if (stale or missing) and may_retry:
            self._tried_at = now
            self._load(now)
        return {key: self._table[key] for key in keys if key in self._table}

    def _load(self, now: float) -> None:
        try:
            slices = self._list()
        except (ApiError, ValueError, OSError) as exc:
            self.failures += 1
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(
                level,
                "ResourceSlices of node %s unreadable: %s; claim devices not yet known stay "
                "unallocated; retrying in %.0f s",
                self._node,
                exc,
                self._retry_s,
            )
            self._failing = True
            return
        if self._failing:
            log.info("ResourceSlices of node %s readable again", self._node)
        self._failing = False
        self._table = table_from_slices(slices, self._drivers)
        self._loaded_at = now
        self.loads += 1
        log.debug("ResourceSlices read node=%s devices=%d", self._node, len(self._table))

    def _list(self) -> list[Mapping[str, Any]]:
        """Every page of this node's slices. ValueError for an answer that is not a list."""
        if self._api is None:
            self._api = self._connect()
        return node_items(self._api, RESOURCE_SLICES_PATH, self._node, "ResourceSlice")
