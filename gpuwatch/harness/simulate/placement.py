"""The simulated cluster's nodes and GPUs: which devices each pod holds, where a pod fits,
and the memory and host PIDs of the GPU processes its containers run.

Placement follows the default scheduler's shape without its detail: `spread` picks the
node with the most free devices of the resource (LeastAllocated), `binpack` the fewest
that fit. Time-slicing replicas go to the GPU with the fewest replicas taken (the device
plugin's distributed policy). A shared ResourceClaim's devices stay reserved while any pod
still uses the claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpuwatch.harness.simulate.changes import (
    Change,
    PodRun,
    PodSpec,
    ProcessStarted,
    ProcessStopped,
)
from gpuwatch.harness.simulate.gpus import CONTEXT_OVERHEAD_BYTES
from gpuwatch.harness.simulate.topology import GPU_RESOURCE, Device, NodeLayout

__all__ = ["Placement"]

FIRST_PID = 4000  # host PIDs of simulated GPU processes, per node


@dataclass
class _NodeState:
    layout: NodeLayout
    free: list[Device]
    next_pid: int = FIRST_PID
    mem_total: dict[str, int] = field(default_factory=dict)


class Placement:
    """The devices of every node, free and held, and the GPU memory processes use."""

    def __init__(
        self, layouts: tuple[NodeLayout, ...], scheduler: Literal["spread", "binpack"]
    ) -> None:
        self.scheduler = scheduler
        self._nodes = {n.name: _NodeState(n, list(n.devices)) for n in layouts}
        for state in self._nodes.values():
            state.mem_total = {gpu.uuid: gpu.mem_total_bytes for gpu in state.layout.gpus}
        self._mem_used: dict[str, int] = {}
        self._holders: dict[str, int] = {}
        self._replicas_taken: dict[str, int] = {}
        self._shared: dict[tuple[str, str], tuple[str, tuple[Device, ...], set[str]]] = {}
        """(namespace, claim) -> node, devices and the pods using a shared claim now."""

    # ---- reading ---------------------------------------------------------------------

    def free_devices(self, resource: str = GPU_RESOURCE) -> dict[str, int]:
        """Free devices of `resource` per node."""
        return {
            name: sum(1 for d in state.free if d.resource == resource)
            for name, state in self._nodes.items()
        }

    def allocated_uuids(self) -> set[str]:
        """GPUs and MIG instances some pod holds now."""
        return {uuid for uuid, count in self._holders.items() if count > 0}

    # ---- processes -------------------------------------------------------------------

    def start_processes(self, pod: PodRun, t: float, out: list[Change]) -> None:
        """Start the GPU processes of a pod's container on its devices (and on the GPUs it
        uses without holding them), as much memory each as is left."""
        spec = pod.spec
        assert pod.node is not None
        node = self._nodes[pod.node]
        uuids = list(dict.fromkeys(d.uuid for d in pod.devices))
        if spec.unallocated_gpus:
            others = [u for u in node.layout.compute_uuids if u not in uuids]
            held = self.allocated_uuids()
            others.sort(key=lambda u: u in held)  # unallocated ones first, index order kept
            uuids += others[: spec.unallocated_gpus]
        replicas = node.layout.replicas if node.layout.sharing == "time-slicing" else 1
        processes = []
        for uuid in uuids:
            total = node.mem_total[uuid]
            used = self._mem_used.get(uuid, 0)
            room = total - used - CONTEXT_OVERHEAD_BYTES
            if room < 0:
                continue  # not even a CUDA context fits: the process would not start
            mem = min(int(total / replicas * spec.mem_fraction), room)
            self._mem_used[uuid] = used + mem + CONTEXT_OVERHEAD_BYTES
            pid = node.next_pid
            node.next_pid += 1
            processes.append((pid, uuid, mem))
            up = spec.crash_after_s if spec.kind == "crashloop" else None
            out.append(
                ProcessStarted(
                    t, node.layout.name, pid, spec.uid, uuid, spec.kind, mem, spec.peak_util_pct, up
                )
            )
        pod.processes = tuple(processes)

    def stop_processes(self, pod: PodRun, t: float, out: list[Change]) -> None:
        """Stop a pod's GPU processes; their memory is free again."""
        assert pod.node is not None
        for pid, uuid, mem in pod.processes:
            self._mem_used[uuid] -= mem + CONTEXT_OVERHEAD_BYTES
            out.append(ProcessStopped(t, pod.node, pid, pod.spec.uid))
        pod.processes = ()

    # ---- scheduling ------------------------------------------------------------------

    def release(self, pod: PodRun) -> None:
        """Free the devices a finished pod held (a shared claim's once its last pod ends)."""
        if pod.node is None:
            return
        node = self._nodes[pod.node]
        for device in pod.devices:
            self._holders[device.uuid] -= 1
        if pod.spec.shared_claim and pod.spec.claim is not None:
            # The claim's devices stay reserved while another pod still uses the claim.
            key = (pod.spec.namespace, pod.spec.claim)
            users = self._shared[key][2]
            users.discard(pod.spec.uid)
            if users:
                return
            del self._shared[key]
        for device in pod.devices:
            if device.id != device.uuid:
                self._replicas_taken[device.uuid] -= 1
        order = {device.id: i for i, device in enumerate(node.layout.devices)}
        node.free = sorted([*node.free, *pod.devices], key=lambda d: order[d.id])

    def bind(self, spec: PodSpec, name: str, devices: tuple[Device, ...]) -> None:
        """Take the devices `place` found for a pod on node `name`."""
        uid = spec.uid
        node = self._nodes[name]
        for device in devices:
            self._holders[device.uuid] = self._holders.get(device.uuid, 0) + 1
        claim = (spec.namespace, spec.claim or "")
        if spec.shared_claim and claim in self._shared:
            self._shared[claim][2].add(uid)  # allocated already: the same devices
        else:
            if spec.shared_claim:
                self._shared[claim] = (name, devices, {uid})
            taken = {d.id for d in devices}
            node.free = [d for d in node.free if d.id not in taken]
            for device in devices:
                if device.id != device.uuid:
                    self._replicas_taken[device.uuid] = self._replicas_taken.get(device.uuid, 0) + 1

    def place(self, spec: PodSpec) -> tuple[str, tuple[Device, ...]] | None:
        """The node and devices a pod would get now; None when it fits no node."""
        if spec.shared_claim and spec.claim is not None:
            allocated = self._shared.get((spec.namespace, spec.claim))
            if allocated is not None:  # the claim's node and devices, whoever else uses them
                return allocated[0], allocated[1]
        best: tuple[int, str, list[Device]] | None = None
        for name, node in self._nodes.items():
            if spec.pool not in (None, node.layout.pool):
                continue
            free = [d for d in node.free if d.resource == spec.resource]
            if len(free) < spec.count:
                continue
            score = len(free) if self.scheduler == "spread" else -len(free)
            if best is None or score > best[0]:
                best = (score, name, free)
        if best is None:
            return None
        _, name, free = best
        return name, self._pick(free, spec.count)

    def _pick(self, free: list[Device], count: int) -> tuple[Device, ...]:
        """Whole GPUs and MIG instances in index order; replicas from the least shared GPU."""
        if not free or free[0].id == free[0].uuid:
            return tuple(free[:count])
        taken = dict(self._replicas_taken)
        chosen: list[Device] = []
        left = list(free)
        for _ in range(count):
            device = min(left, key=lambda d: taken.get(d.uuid, 0))  # first of the least used
            chosen.append(device)
            left.remove(device)
            taken[device.uuid] = taken.get(device.uuid, 0) + 1
        return tuple(chosen)

    def why(self, spec: PodSpec) -> str:
        """The scheduler's message: `0/4 nodes are available: 4 Insufficient nvidia.com/gpu.`"""
        reasons: dict[str, int] = {}
        for node in self._nodes.values():
            if spec.pool not in (None, node.layout.pool):
                reason = "node(s) didn't match Pod's node affinity/selector"
            else:
                reason = f"Insufficient {spec.resource}"
            reasons[reason] = reasons.get(reason, 0) + 1
        parts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        return f"0/{len(self._nodes)} nodes are available: {parts}."
