"""The simulated cluster's hardware: nodes, their GPUs and MIG instances, and the devices
the device plugin advertises to the scheduler (whole GPUs, time-slicing replicas, MIG
instances), derived from a scenario's node pools."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

from gpuwatch.harness.simulate.gpus import GPU_MODELS, SimGpu
from gpuwatch.harness.simulate.node import sim_gpu_uuid
from gpuwatch.harness.simulate.scenario import NodePool, Scenario, mig_instance_bytes, node_names
from schemas.fields import DEFAULT_CLUSTER

__all__ = [
    "DRA_DRIVER",
    "GPU_RESOURCE",
    "Device",
    "NodeLayout",
    "dra_resource",
    "layout",
    "mig_resource",
    "resource_slice",
]

GPU_RESOURCE = "nvidia.com/gpu"
DRA_DRIVER = "gpu.nvidia.com"
"""The NVIDIA DRA driver: its GPUs are ResourceSlice devices `gpu-<minor>`."""
INSTANCE_TYPES = {"h100": "p5.48xlarge", "h200": "p5en.48xlarge", "l40s": "g6e.48xlarge"}


def mig_resource(profile: str) -> str:
    """The extended resource of a MIG profile under the `mixed` strategy."""
    return f"nvidia.com/mig-{profile}"


def dra_resource(profile: str | None) -> str:
    """What a claim's GPU (or MIG device of `profile`) is called in allocations, as the
    agent names it (`producers.base.dra.DraDevice.resource`)."""
    return f"{DRA_DRIVER}/gpu" if profile is None else f"{DRA_DRIVER}/mig-{profile}"


@dataclass(frozen=True, slots=True)
class Device:
    """One device the scheduler can hand out: `id` as the plugin names it, `uuid` the GPU or
    MIG instance its processes run on."""

    id: str
    uuid: str
    resource: str
    dra_name: str | None = None
    """The device's name in its node's ResourceSlice (`gpu-3`) when the DRA driver hands it
    out; None for the device plugin's."""


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """One node: its GPUs (MIG parents and instances included) and schedulable devices."""

    name: str
    pool: str
    model: str
    sharing: str
    replicas: int
    instance_type: str
    gpus: tuple[SimGpu, ...]
    devices: tuple[Device, ...]

    @property
    def product(self) -> str:
        """The `nvidia.com/gpu.product` label GPU feature discovery writes."""
        product = GPU_MODELS[self.model].name.replace(" ", "-")
        return f"{product}-SHARED" if self.sharing == "time-slicing" else product

    @property
    def capacity(self) -> dict[str, int]:
        """GPU resources the node advertises, by name."""
        out: dict[str, int] = {GPU_RESOURCE: 0} if self.sharing == "mig" else {}
        for device in self.devices:
            if device.dra_name is None:  # DRA devices are in ResourceSlices, not capacity
                out[device.resource] = out.get(device.resource, 0) + 1
        return out

    @property
    def dra(self) -> bool:
        """Whether the DRA driver hands out this node's GPUs."""
        return any(device.dra_name is not None for device in self.devices)

    @property
    def compute_uuids(self) -> tuple[str, ...]:
        """Where processes run: whole GPUs, or the MIG instances of a MIG node."""
        parents = {gpu.parent_uuid for gpu in self.gpus if gpu.parent_uuid is not None}
        return tuple(gpu.uuid for gpu in self.gpus if gpu.uuid not in parents)

    def memory_of(self, uuid: str) -> int:
        """Total memory of a GPU or MIG instance of this node."""
        return next(gpu.mem_total_bytes for gpu in self.gpus if gpu.uuid == uuid)

    @property
    def physical_gpus(self) -> int:
        """Physical GPUs (a MIG parent counts once, its instances not)."""
        return sum(1 for gpu in self.gpus if gpu.parent_uuid is None)


def _mig_uuid(node: str, gpu: int, instance: int, cluster: str) -> str:
    where = node if cluster == DEFAULT_CLUSTER else f"{cluster}/{node}"
    return "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{where}/gpu/{gpu}/mig/{instance}"))


def _node(pool: NodePool, name: str, cluster: str) -> NodeLayout:
    gpus: list[SimGpu] = []
    devices: list[Device] = []
    replicas = pool.replicas or 1
    for i in range(pool.gpus_per_node):
        gpu = SimGpu.preset(pool.model, sim_gpu_uuid(name, i, cluster), i)
        gpus.append(gpu)
        if pool.sharing == "mig":
            for j, profile in enumerate(pool.mig_profiles):
                instance = SimGpu(
                    uuid=_mig_uuid(name, i, j, cluster),
                    index=i,
                    model=gpu.model,
                    mem_total_bytes=mig_instance_bytes(profile),
                    power_idle_w=gpu.power_idle_w,
                    power_max_w=gpu.power_max_w,
                    parent_uuid=gpu.uuid,
                    mig_profile=profile,
                )
                gpus.append(instance)
                if pool.dra:
                    dra_name = f"gpu-{i}-mig-{profile.replace('.', '')}-{j}"
                    resource = dra_resource(profile)
                else:
                    dra_name, resource = None, mig_resource(profile)
                devices.append(Device(instance.uuid, instance.uuid, resource, dra_name))
        elif pool.sharing == "time-slicing":
            devices += [Device(f"{gpu.uuid}::{r}", gpu.uuid, GPU_RESOURCE) for r in range(replicas)]
        elif pool.dra:
            devices.append(Device(gpu.uuid, gpu.uuid, dra_resource(None), f"gpu-{i}"))
        else:
            devices.append(Device(gpu.uuid, gpu.uuid, GPU_RESOURCE))
    return NodeLayout(
        name=name,
        pool=pool.pool,
        model=pool.model,
        sharing=pool.sharing,
        replicas=replicas,
        instance_type=pool.instance_type or INSTANCE_TYPES.get(pool.model, "gpu.metal"),
        gpus=tuple(gpus),
        devices=tuple(devices),
    )


def layout(scenario: Scenario, cluster: str = DEFAULT_CLUSTER) -> tuple[NodeLayout, ...]:
    """Every node of the scenario, pool by pool, in name order within a pool; the GPU uuids
    of a named cluster's nodes are its own."""
    return tuple(_node(pool, name, cluster) for pool in scenario.nodes for name in node_names(pool))


def resource_slice(node: NodeLayout) -> dict[str, Any]:
    """The ResourceSlice the NVIDIA DRA driver publishes for a DRA node: one pool named
    after the node, each device with its `type`, `uuid` (and a MIG device's `parentUUID`
    and `profile`) attributes and its memory."""
    by_uuid = {gpu.uuid: gpu for gpu in node.gpus}
    devices: list[dict[str, Any]] = []
    for device in node.devices:
        if device.dra_name is None:
            continue
        gpu = by_uuid[device.uuid]
        attributes: dict[str, Any] = {
            "type": {"string": "gpu" if gpu.parent_uuid is None else "mig"},
            "uuid": {"string": gpu.uuid},
            "productName": {"string": gpu.model},
            "index": {"int": gpu.index},
        }
        if gpu.parent_uuid is not None and gpu.mig_profile is not None:
            attributes["parentUUID"] = {"string": gpu.parent_uuid}
            attributes["profile"] = {"string": gpu.mig_profile}
        devices.append(
            {
                "name": device.dra_name,
                "attributes": attributes,
                "capacity": {"memory": {"value": str(gpu.mem_total_bytes)}},
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node.name}-{DRA_DRIVER}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
