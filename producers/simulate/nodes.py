"""The simulated nodes' side: one SimReader and one real NodeAgent per node, with the
kubelet's allocations and the PID-to-pod map following the cluster's changes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from producers.agent.assemble import SharingConfig
from producers.agent.loop import Clock, NodeAgent, Publish
from producers.agent.readings import DeviceAllocation, PodRef
from producers.simulate.cluster import (
    Change,
    PodBound,
    PodCreated,
    PodDeleted,
    PodFinished,
    PodSpec,
    ProcessStarted,
    ProcessStopped,
)
from producers.simulate.gpus import SimReader, SimWorkload
from producers.simulate.topology import NodeLayout
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import PodUid

__all__ = ["NodeFleet", "PodTable", "SimNode"]

log = logging.getLogger(__name__)


class PodTable:
    """One node's PodResolver and AllocationSource: what the kubelet and /proc would say."""

    def __init__(self) -> None:
        self._pids: dict[int, PodRef] = {}
        self._allocations: dict[str, DeviceAllocation] = {}
        self._listed: tuple[DeviceAllocation, ...] | None = ()

    def resolve(self, pid: int) -> PodRef | None:
        """The pod of a simulated PID, or None."""
        return self._pids.get(pid)

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        """Every pod's devices on this node (the same tuple until they change)."""
        if self._listed is None:
            self._listed = tuple(self._allocations.values())
        return self._listed

    def allocate(
        self, spec: PodSpec, device_ids: tuple[str, ...], pod_uid: str | None = None
    ) -> None:
        """A pod's container holds these devices (as the device plugin named them); the
        kubelet names the pod by `pod_uid` (the API server's uid; default the spec's)."""
        if not device_ids:
            return
        self._allocations[spec.uid] = DeviceAllocation(
            pod_uid=PodUid(pod_uid or spec.uid),
            namespace=spec.namespace,
            pod=spec.name,
            container=spec.container,
            resource=spec.resource,
            device_ids=device_ids,
        )
        self._listed = None

    def release(self, uid: str) -> None:
        """The pod's devices are free again."""
        if self._allocations.pop(uid, None) is not None:
            self._listed = None

    def add_process(self, pid: int, uid: str, container: str) -> None:
        """A process of a pod's container."""
        self._pids[pid] = PodRef(pod_uid=PodUid(uid), container_id=None, container=container)

    def remove_process(self, pid: int) -> None:
        """The process exited."""
        self._pids.pop(pid, None)


@dataclass
class SimNode:
    """One node: its layout, simulated GPUs, pod table and agent."""

    layout: NodeLayout
    reader: SimReader
    table: PodTable
    agent: NodeAgent


class NodeFleet:
    """Every node of the cluster; `apply` follows the cluster, `tick` samples each node."""

    def __init__(
        self,
        layouts: Iterable[NodeLayout],
        *,
        seed: int,
        clock: Clock,
        epoch: float,
        interval_s: float,
        publish_for: Callable[[str], Publish],
        cluster: str = DEFAULT_CLUSTER,
        uid_of: Callable[[str], str] = str,
    ) -> None:
        """`publish_for(node)`: the publish function of that node's agent; every agent's
        samples name `cluster`, and a pod by `uid_of(its uid in the simulation)` (the uid
        the API server gave it)."""
        self.epoch = epoch
        self._uid_of = uid_of
        self.nodes: dict[str, SimNode] = {}
        self._specs: dict[str, PodSpec] = {}
        for layout in layouts:
            reader = SimReader(layout.gpus, seed=hash_seed(seed, layout.name), now=clock.time)
            table = PodTable()
            sharing = (
                SharingConfig(default="time-slicing") if layout.sharing == "time-slicing" else None
            )
            agent = NodeAgent(
                node=layout.name,
                reader=reader,
                resolver=table,
                allocations=table,
                publish=publish_for(layout.name),
                interval_s=interval_s,
                sharing=sharing,
                clock=clock,
                cluster=cluster,
            )
            self.nodes[layout.name] = SimNode(layout, reader, table, agent)

    def apply(self, change: Change) -> None:
        """Follow one cluster change: allocations, processes."""
        if isinstance(change, PodCreated):
            self._specs[change.spec.uid] = change.spec
        elif isinstance(change, PodBound):
            spec = self._specs[change.uid]
            ids = tuple(device.id for device in change.devices)
            self.nodes[change.node].table.allocate(spec, ids, self._uid_of(spec.uid))
        elif isinstance(change, PodFinished | PodDeleted):
            for node in self.nodes.values():
                node.table.release(change.uid)
            if isinstance(change, PodDeleted):
                self._specs.pop(change.uid, None)
        elif isinstance(change, ProcessStarted):
            node = self.nodes[change.node]
            node.reader.add_workload(
                SimWorkload(
                    pid=change.pid,
                    gpu_uuid=change.gpu_uuid,
                    kind=change.kind,
                    mem_bytes=change.mem_bytes,
                    start_s=self.epoch + change.at,
                    peak_util_pct=change.peak_util_pct,
                    up_s=change.up_s,
                )
            )
            container = self._specs[change.uid].container
            node.table.add_process(change.pid, self._uid_of(change.uid), container)
        elif isinstance(change, ProcessStopped):
            node = self.nodes[change.node]
            node.reader.remove_workload(change.pid)
            node.table.remove_process(change.pid)

    def tick(self, skip: frozenset[str] = frozenset()) -> int:
        """One sample of every node but those in `skip` (their agent is down); how many."""
        taken = 0
        for name, node in self.nodes.items():
            if name in skip:
                continue
            try:
                node.agent.tick()
            except Exception:  # one node's bad tick must not stop the others
                log.exception("simulated node tick failed node=%s", name)
                continue
            taken += 1
        return taken


def hash_seed(seed: int, name: str) -> int:
    """A per-node seed that does not depend on Python's string hash randomisation."""
    value = seed & 0xFFFFFFFF
    for char in name.encode():
        value = (value * 1_000_003 + char) & 0xFFFFFFFFFFFF
    return value
