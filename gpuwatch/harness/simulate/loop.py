"""The simulation's tick loop: the cluster moved to the next tick's event time, its changes
written to the API server and the nodes, every node sampled, at `speed` times real time.

Event time is `epoch + ticks * interval`, the same for every node and every pod change,
however fast or late the wall clock runs: a tick that comes late is taken late, never
skipped, so samples tile event time without gaps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatch.harness.simulate.changes import Change
from gpuwatch.harness.simulate.cluster import Cluster
from gpuwatch.harness.simulate.kube.cluster import ApiWriter, KubeMirror
from gpuwatch.harness.simulate.nodes import NodeFleet, WorkSetup
from gpuwatch.harness.simulate.scenario import AGENT_DOWN_S, Fault, Scenario
from producers.agent.loop import Publish
from schemas.fields import DEFAULT_CLUSTER

__all__ = ["GpuEvent", "SimClock", "Simulation", "faults_due"]

log = logging.getLogger(__name__)

REPORT_EVERY_S = 10.0  # wall seconds between progress lines


class SimClock:
    """The agents' clock: `time` is the simulation's event time, `monotonic` the real one
    (it only times how long a tick took)."""

    def __init__(self, epoch: float) -> None:
        self.epoch = epoch
        self._now = epoch

    def time(self) -> float:
        """Event time, epoch seconds."""
        return self._now

    def monotonic(self) -> float:
        """Real monotonic seconds."""
        return time.monotonic()

    def now_ms(self) -> int:
        """Event time, epoch milliseconds (the watcher's clock)."""
        return round(self._now * 1000)

    def set(self, epoch_s: float) -> None:
        """Move event time (the loop's thread only)."""
        self._now = epoch_s


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """A GPU fault of the scenario beginning, or its `duration_s` running out (`ends`)."""

    fault: Fault
    ends: bool = False


def faults_due(
    faults: tuple[Fault, ...], start: float, end: float
) -> tuple[set[str], list[GpuEvent]]:
    """For the interval [start, end): the nodes whose agent is down (no sample of an
    interval starting in [at_s, at_s + duration_s)), and the GPU faults that begin or end
    in it, in time order. A GPU fault shows in the sample of the interval it begins in,
    and no longer in that of the interval it ends in."""
    down = {
        f.node
        for f in faults
        if f.kind == "agent-down"
        and f.at_s <= start < f.at_s + (AGENT_DOWN_S if f.duration_s is None else f.duration_s)
    }
    events: list[tuple[float, GpuEvent]] = []
    for f in faults:
        if f.kind == "agent-down":
            continue
        if start <= f.at_s < end:
            events.append((f.at_s, GpuEvent(f)))
        if f.duration_s is not None and start <= f.at_s + f.duration_s < end:
            events.append((f.at_s + f.duration_s, GpuEvent(f, ends=True)))
    events.sort(key=lambda timed: timed[0])  # stable: a fault begins before it ends
    return down, [event for _, event in events]


class Simulation:
    """One simulated cluster wired to an API server and its nodes' publish functions."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        api: ApiWriter,
        publish_for: Callable[[str], Publish],
        interval_s: float,
        clock: SimClock,
        cluster: str = DEFAULT_CLUSTER,
        work: WorkSetup | None = None,
    ) -> None:
        """`publish_for(node)`: the publish function of that node's agent's samples, which
        name `cluster`; `work`: where the pods' units of work are served and sent."""
        self.scenario = scenario
        self.interval_s = interval_s
        self.clock = clock
        epoch = clock.epoch
        self.cluster = Cluster(scenario, cluster=cluster)
        self.mirror = KubeMirror(api, epoch)
        self.fleet = NodeFleet(
            self.cluster.layouts,
            seed=scenario.seed,
            clock=self.clock,
            epoch=epoch,
            interval_s=interval_s,
            publish_for=publish_for,
            cluster=cluster,
            uid_of=self.mirror.uid_of,
            work=work,
        )
        self.ticks = 0
        self.samples = 0
        self.late_ticks = 0
        """Ticks taken more than one period after they were due (the machine is too slow)."""
        self.changes = 0
        self.down: frozenset[str] = frozenset()
        """The nodes whose agent is down in the last tick (a fault of the scenario)."""

    @property
    def sim_time_s(self) -> float:
        """Simulated seconds since the epoch."""
        return self.ticks * self.interval_s

    def prepare(self) -> None:
        """Create the nodes and apply everything that happened before the epoch."""
        self.mirror.create_nodes(self.cluster.layouts)
        self._apply(self.cluster.advance(0.0))

    def _apply(self, changes: list[Change]) -> None:
        for change in changes:
            self.mirror.apply(change)
            self.fleet.apply(change)
        self.changes += len(changes)

    def tick(self) -> None:
        """One interval: the cluster up to the tick's time, then one sample of every node."""
        start = self.sim_time_s
        self.ticks += 1
        now = self.sim_time_s
        self.clock.set(self.clock.epoch + now)
        self._apply(self.cluster.advance(now))
        down, events = faults_due(self.scenario.faults, start, now)
        self.down = frozenset(down)
        for event in events:
            self._fault(event)
        self.samples += self.fleet.tick(self.down)

    def _fault(self, event: GpuEvent) -> None:
        """A GPU fault begins or ends on its node's simulated GPU."""
        fault = event.fault
        node = self.fleet.nodes[fault.node]
        uuid = next(g.uuid for g in node.layout.gpus if g.index == fault.gpu and not g.parent_uuid)
        reader = node.reader
        log.info(
            "simulated gpu fault node=%s gpu=%d kind=%s %s",
            fault.node,
            fault.gpu,
            fault.kind,
            "ends" if event.ends else "begins",
        )
        if fault.kind == "throttle":
            reader.set_throttle(uuid, fault.reason, active=not event.ends)
        elif fault.kind == "xid":
            if event.ends:  # Xid 79's duration: the GPU is back
                reader.set_lost(uuid, lost=False)
            else:
                reader.inject_xid(uuid, fault.code)
        elif fault.kind == "ecc":
            reader.inject_ecc(uuid)
        elif fault.kind == "remap-failure":
            reader.fail_remap(uuid)

    def run(
        self,
        stop: threading.Event,
        *,
        speed: float,
        duration_s: float | None,
        until_s: float | None = None,
        report: Callable[[Simulation], None] | None = None,
    ) -> None:
        """Tick every `interval_s / speed` wall seconds until `stop`, `duration_s` wall
        seconds, or `until_s` simulated seconds after the epoch, whichever comes first."""
        period = self.interval_s / speed
        started = time.monotonic()
        next_report = started + REPORT_EVERY_S
        k = 0
        while not stop.is_set():
            if until_s is not None and self.sim_time_s + self.interval_s > until_s + 1e-9:
                break
            k += 1
            due = started + k * period
            if duration_s is not None and due - started > duration_s + 1e-9:
                break
            wait = due - time.monotonic()
            if wait > 0:
                if stop.wait(wait):
                    break
            elif -wait > period:
                self.late_ticks += 1
            self.tick()
            if report is not None and time.monotonic() >= next_report:
                next_report += REPORT_EVERY_S
                report(self)
