"""A simulated GPU node: SimReader devices plus the pods that own its processes and devices."""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuwatch.harness.simulate.gpus import GPU_MODELS, SimGpu, SimReader, SimWorkload, WorkloadKind
from producers.base.ports import DeviceAllocation, PodRef
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import PodUid

GIB = 1 << 30
# A node's default mix, as seen on shared research clusters: mostly training, some
# inference, notebooks and forgotten pods that hold memory at 0 %.
DEFAULT_MIX: tuple[WorkloadKind, ...] = (
    "training",
    "training",
    "inference",
    "notebook",
    "training",
    "idle",
    "inference",
    "training",
)


@dataclass(frozen=True, slots=True)
class SimPod:
    """A pod of the simulated node: its uid, names and the GPUs it was allocated."""

    uid: PodUid
    namespace: str
    name: str
    container: str
    gpu_uuids: tuple[str, ...]
    resource: str = "nvidia.com/gpu"


@dataclass
class SimPods:
    """PodResolver and AllocationSource for simulated pods (pid -> pod, pod -> devices)."""

    pods: dict[PodUid, SimPod] = field(default_factory=dict)
    pids: dict[int, PodUid] = field(default_factory=dict)

    def add(self, pod: SimPod, pids: Sequence[int]) -> None:
        """Register a pod and the PIDs of its GPU processes."""
        self.pods[pod.uid] = pod
        for pid in pids:
            self.pids[pid] = pod.uid

    def remove(self, uid: PodUid) -> None:
        """Forget a pod (it finished): its allocation ends with it."""
        self.pods.pop(uid, None)
        for pid in [pid for pid, owner in self.pids.items() if owner == uid]:
            del self.pids[pid]

    def resolve(self, pid: int) -> PodRef | None:
        """The pod of a simulated PID, or None for a PID of no pod."""
        uid = self.pids.get(pid)
        if uid is None:
            return None
        pod = self.pods[uid]
        return PodRef(pod_uid=uid, container_id=None, container=pod.container)

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        """Every pod's devices, as the kubelet would list them."""
        return tuple(
            DeviceAllocation(
                pod_uid=pod.uid,
                namespace=pod.namespace,
                pod=pod.name,
                container=pod.container,
                resource=pod.resource,
                device_ids=pod.gpu_uuids,
            )
            for pod in self.pods.values()
        )


def sim_gpu_uuid(node: str, index: int, cluster: str = DEFAULT_CLUSTER) -> str:
    """A stable, realistic GPU uuid for a simulated node's device; a named cluster's differ
    from the default's (real uuids are unique across clusters, node names are not)."""
    where = node if cluster == DEFAULT_CLUSTER else f"{cluster}/{node}"
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{where}/gpu/{index}"))


def simple_node(
    node: str,
    gpus: int = 8,
    model: str = "h100",
    *,
    seed: int = 0,
    now: Callable[[], float] | None = None,
    mix: Sequence[WorkloadKind] = DEFAULT_MIX,
) -> tuple[SimReader, SimPods]:
    """A node of `gpus` GPUs of `model`, one single-GPU pod per GPU with the `mix` kinds."""
    if model not in GPU_MODELS:
        raise ValueError(f"unknown GPU model {model!r} (known: {', '.join(GPU_MODELS)})")
    rng = random.Random(f"{seed}/{node}")
    devices = [SimGpu.preset(model, sim_gpu_uuid(node, i), i) for i in range(gpus)]
    total = GPU_MODELS[model].mem_total_bytes
    workloads: list[SimWorkload] = []
    pods = SimPods()
    for index, device in enumerate(devices):
        kind = mix[index % len(mix)]
        pid = 10_000 + index
        mem = int(total * rng.uniform(0.3, 0.85)) if kind != "idle" else 2 * GIB
        workloads.append(SimWorkload(pid, device.uuid, kind, mem))
        uid = PodUid(str(uuidlib.UUID(int=rng.getrandbits(128), version=4)))
        pods.add(
            SimPod(uid, "ml", f"{kind}-{node}-{index}", kind, (device.uuid,)),
            [pid],
        )
    reader = SimReader(devices, workloads, seed=seed, **({"now": now} if now else {}))
    return reader, pods
