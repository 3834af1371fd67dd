"""The agent's outbox holds the hours its settings say: measured with recorded H100 readings."""

from __future__ import annotations

import re
import uuid

from fixtures.nvml.recorded_nvml import node

from producers.agent.loop import NodeAgent
from producers.base.outbox import Entry, Outbox
from producers.base.ports import DeviceAllocation, PodRef
from producers.nvml.reader import NvmlReader
from schemas import NVML_SAMPLES
from schemas.ids import PodUid
from schemas.settings import AgentSettings

GPUS = 8
GPU_UUIDS = [f"GPU-{uuid.UUID(int=n + 1)}" for n in range(GPUS)]
POD_UIDS = [PodUid(str(uuid.UUID(int=1000 + n))) for n in range(GPUS)]


class Pods:
    """A training pod on each GPU; every process found belongs to one of them."""

    def resolve(self, pid: int) -> PodRef | None:
        return PodRef(POD_UIDS[pid % GPUS], "containerd://" + "0" * 64, "trainer")

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        return tuple(
            DeviceAllocation(
                POD_UIDS[n],
                "ml-research",
                f"llm-pretrain-worker-{n}",
                "trainer",
                "nvidia.com/gpu",
                (GPU_UUIDS[n],),
            )
            for n in range(GPUS)
        )


def busy_node_samples(count: int) -> list[Entry]:
    """Samples of an 8-GPU node of recorded H100s under load (three processes a GPU, as
    captured), as the agent puts them in its outbox."""
    recorded = node(*[("h100_80gb_hbm3", "load", gpu) for gpu in GPU_UUIDS])
    entries: list[Entry] = []
    agent = NodeAgent(
        node="gpu-node-017",
        reader=NvmlReader(recorded),
        resolver=Pods(),
        allocations=Pods(),
        publish=lambda key, value: entries.append(Entry(key, value)),
        interval_s=1.0,
    )
    for _ in range(count):
        agent.tick()
    return entries


def documented_hours() -> float:
    described = AgentSettings.model_fields["buffer_bytes"].description or ""
    found = re.search(r"about (\d+(?:\.\d+)?) hours of an? (?:busy )?8-GPU node at 1 Hz", described)
    assert found is not None, described
    return float(found.group(1))


def test_the_default_outbox_holds_the_documented_hours_of_a_busy_8_gpu_node() -> None:
    samples = busy_node_samples(10)
    decoded = NVML_SAMPLES.decode(samples[0].value)
    assert len(decoded.gpus) == GPUS
    assert sum(len(gpu.processes) for gpu in decoded.gpus) == 3 * GPUS
    per_sample = max(e.size for e in samples)
    box = Outbox(AgentSettings().buffer_bytes)
    held = 0
    while box.put(samples[held % len(samples)]) == 0:  # one a second, until the first drop
        held += 1

    hours = held / 3600
    assert round(hours) == documented_hours(), f"{per_sample} bytes a sample: {hours:.2f} h"
    assert box.size_bytes <= box.max_bytes
