"""The simulated nodes' side: one SimReader and one real NodeAgent per node, with the
kubelet's allocations and the PID-to-pod map following the cluster's changes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuwatch.harness.simulate.changes import (
    Change,
    ContainerCrashed,
    ContainerStarted,
    PodBound,
    PodCreated,
    PodDeleted,
    PodFinished,
    PodSpec,
    ProcessStarted,
    ProcessStopped,
)
from gpuwatch.harness.simulate.gpus import SimReader, SimWorkload
from gpuwatch.harness.simulate.topology import DRA_DRIVER, Device, NodeLayout, resource_slice
from gpuwatch.harness.simulate.work import NodeTargets, NodeWork, WorkCounters
from producers.agent.assemble import SharingConfig
from producers.agent.loop import Clock, NodeAgent, Publish
from producers.base.dra import DeviceKey, DraDevice, table_from_slices
from producers.base.ports import DeviceAllocation, PodRef
from producers.podresources.claims import ClaimDevice, claim_allocations
from producers.work.scraper import WorkScraper
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import PodUid
from schemas.settings import AgentSettings
from schemas.work_units import WorkUnits

__all__ = ["NodeFleet", "PodTable", "SimNode", "WorkSetup"]

log = logging.getLogger(__name__)


class PodTable:
    """One node's PodResolver and AllocationSource: what the kubelet and /proc would say.

    A DRA node's claim devices are listed as the kubelet lists them (driver, pool, device
    name) and turned into GPU uuids by the agent's own code, with the node's ResourceSlice
    as the table.
    """

    def __init__(self, slices: Mapping[DeviceKey, DraDevice] | None = None, pool: str = "") -> None:
        """`slices`: a DRA node's devices, of its pool `pool` (the node's name)."""
        self._pids: dict[int, PodRef] = {}
        self._allocations: dict[str, DeviceAllocation] = {}
        self._claims: dict[str, tuple[ClaimDevice, ...]] = {}
        self._slices: Mapping[DeviceKey, DraDevice] = slices or {}
        self._pool = pool
        self._listed: tuple[DeviceAllocation, ...] | None = ()

    def resolve(self, pid: int) -> PodRef | None:
        """The pod of a simulated PID, or None."""
        return self._pids.get(pid)

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        """Every pod's devices on this node (the same tuple until they change)."""
        if self._listed is None:
            uses = [use for uses in self._claims.values() for use in uses]
            claimed, _ = claim_allocations(uses, self._slices)
            self._listed = tuple(self._allocations.values()) + claimed
        return self._listed

    def claim(self, spec: PodSpec, devices: tuple[Device, ...], pod_uid: str | None = None) -> None:
        """A pod's container uses its claim's devices (named as in the node's slice)."""
        self._claims[spec.uid] = tuple(
            ClaimDevice(
                pod_uid=PodUid(pod_uid or spec.uid),
                namespace=spec.namespace,
                pod=spec.name,
                container=spec.container,
                claim=f"{spec.namespace}/{spec.claim}",
                driver=DRA_DRIVER,
                pool=self._pool,
                device=device.dra_name or device.id,
            )
            for device in devices
        )
        self._listed = None

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
        if self._claims.pop(uid, None) is not None:
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
    work: NodeWork | None = None
    """Its agent's scrapes of units of work (None: the scenario has none)."""


@dataclass(frozen=True)
class WorkSetup:
    """Where the simulated pods' counters are served and where the scrapes' records go."""

    counters: WorkCounters
    port: Callable[[], int]
    """Where the counters are served (known once the server listens)."""
    emit: Callable[[WorkUnits], None]
    settings: AgentSettings


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
        work: WorkSetup | None = None,
    ) -> None:
        """`publish_for(node)`: the publish function of that node's agent; every agent's
        samples name `cluster`, and a pod by `uid_of(its uid in the simulation)` (the uid
        the API server gave it). With `work`, each agent scrapes the units of work of its
        node's pods that count them."""
        self.epoch = epoch
        self._uid_of = uid_of
        self._work = work
        self._bound: dict[str, str] = {}  # pod uid -> node, of the pods counting work
        self.nodes: dict[str, SimNode] = {}
        self._specs: dict[str, PodSpec] = {}
        for layout in layouts:
            reader = SimReader(layout.gpus, seed=hash_seed(seed, layout.name), now=clock.time)
            slices = (
                table_from_slices([resource_slice(layout)], {DRA_DRIVER}) if layout.dra else None
            )
            table = PodTable(slices, layout.name)
            sharing = (
                SharingConfig(default="time-slicing") if layout.sharing == "time-slicing" else None
            )
            scrapes = None
            if work is not None:
                a = work.settings
                targets = NodeTargets(layout.name, work.port)
                scraper = WorkScraper(
                    targets,
                    node=layout.name,
                    cluster=cluster,
                    interval_s=a.work_interval_s,
                    timeout_s=a.work_timeout_s,
                    max_bytes=a.work_max_bytes,
                    max_series=a.work_max_series,
                    clock_ms=_now_ms(clock),
                    workers=1,
                )
                scrapes = NodeWork(targets, scraper, emit=work.emit, now_ms=_now_ms(clock))
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
                work=scrapes,
            )
            self.nodes[layout.name] = SimNode(layout, reader, table, agent, scrapes)

    def apply(self, change: Change) -> None:
        """Follow one cluster change: allocations, processes."""
        if self._work is not None:
            self._follow_work(change, self._work)
        if isinstance(change, PodCreated):
            self._specs[change.spec.uid] = change.spec
        elif isinstance(change, PodBound):
            spec = self._specs[change.uid]
            table = self.nodes[change.node].table
            if spec.claim is not None:
                table.claim(spec, change.devices, self._uid_of(spec.uid))
            else:
                ids = tuple(device.id for device in change.devices)
                table.allocate(spec, ids, self._uid_of(spec.uid))
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

    def _follow_work(self, change: Change, work: WorkSetup) -> None:
        """The counters and scrape targets of the pods that count units of work."""
        followed = PodBound | ContainerStarted | ContainerCrashed | PodFinished | PodDeleted
        if not isinstance(change, followed):
            return
        spec = self._specs.get(change.uid)
        if spec is None or not spec.work:
            return
        uid = self._uid_of(spec.uid)
        if isinstance(change, PodBound):
            if self.nodes[change.node].work is not None:
                self._bound[spec.uid] = change.node
        elif isinstance(change, ContainerStarted):
            work.counters.start(uid, spec.work, self.epoch + change.at)
            # Scraped from when it runs, as an agent lists its node's Running pods: a pod
            # bound but still pulling its image or creating its container has no IP yet.
            node = self._scrapes(self._bound.get(spec.uid))
            if node is not None:
                node.targets.add(spec.namespace, spec.name, uid, spec.work)
        elif isinstance(change, ContainerCrashed):
            work.counters.stop(uid, self.epoch + change.at)
        elif isinstance(change, PodFinished | PodDeleted):
            work.counters.stop(uid, self.epoch + change.at)
            node = self._scrapes(self._bound.pop(spec.uid, None))
            if node is not None:
                node.targets.remove(uid)
            if isinstance(change, PodDeleted):
                work.counters.remove(uid)

    def _scrapes(self, node: str | None) -> NodeWork | None:
        """The scrapes of units of work of the node a pod is bound to (None: not bound)."""
        return None if node is None else self.nodes[node].work

    def close(self) -> None:
        """Release the scrapers' connections."""
        for node in self.nodes.values():
            if node.work is not None:
                node.work.scraper.close()

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


def _now_ms(clock: Clock) -> Callable[[], int]:
    def now_ms() -> int:
        return int(clock.time() * 1000)

    return now_ms


def hash_seed(seed: int, name: str) -> int:
    """A per-node seed that does not depend on Python's string hash randomisation."""
    value = seed & 0xFFFFFFFF
    for char in name.encode():
        value = (value * 1_000_003 + char) & 0xFFFFFFFFFFFF
    return value
