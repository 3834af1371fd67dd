"""A node with nothing on it, for node agent tests that count ticks and samples: no GPUs
to read, no pod to name, and an agent of it."""

from __future__ import annotations

from producers.agent.loop import NodeAgent, Publish
from producers.base.ports import DeviceAllocation, PodRef, ReadResult


class SecondClock:
    """Wall and monotonic time that step one second per tick, so every sample but the
    first claims the same interval and has the same size, however fast the test runs."""

    def __init__(self) -> None:
        self._ticks = 0

    def time(self) -> float:
        self._ticks += 1
        return 1_765_000_000.0 + self._ticks

    def monotonic(self) -> float:
        return float(self._ticks)


class NoGpus:
    def read(self) -> ReadResult:
        return ReadResult(())

    def close(self) -> None:
        return None


class NoPods:
    def resolve(self, pid: int) -> PodRef | None:
        return None

    def list_allocations(self) -> tuple[DeviceAllocation, ...] | None:
        return None


def empty_node_agent(node: str, publish: Publish) -> NodeAgent:
    """The agent of `node`, a node with no GPUs and no pods, ticking every second on a
    clock of its own."""
    pods = NoPods()
    return NodeAgent(
        node=node,
        reader=NoGpus(),
        resolver=pods,
        allocations=pods,
        publish=publish,
        interval_s=1.0,
        clock=SecondClock(),
    )
