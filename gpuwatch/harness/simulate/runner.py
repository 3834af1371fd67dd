"""A simulation wired to the real producers: the in-process API server watched by the real
Kubernetes watcher (through the `kubernetes` client), the simulated nodes' real agents,
and the real publishing path (Publisher, outbox, KafkaSender) to the three topics.

Given a `LiveApiServer`, the simulation writes to a real kube-apiserver instead, and the
watcher watches that: the objects carry `SIMULATOR_LABELS`, and an earlier run's leftovers
(pods, ReplicaSets, Jobs, nodes with those labels, nothing else) are deleted at the
start; what a run leaves stays for `kubectl` to look at until the next one. The server
stamps creation times with its wall clock, so a pod the scenario created before the start
shows as created when the simulation wrote it (`gpuwatch.harness.simulate.kube.live`).

Every node has its own Publisher (buffer and counters) over one Kafka client and one sender
thread, and one watcher serves every namespace, so a fleet of hundreds of GPUs costs one
process a fraction of a core at 1 Hz. With `serve_metrics`, the agents' and the watcher's
self-metrics are served on their settings' ports, as the real processes serve them. Every
message names the settings' cluster (`cluster.name`), as the real producers' do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from gpuwatch.harness.simulate.kube.live import LiveApiServer
from gpuwatch.harness.simulate.loop import SimClock, Simulation
from gpuwatch.harness.simulate.metrics import FleetAgentCollector, MetricsEndpoint
from gpuwatch.harness.simulate.nodes import WorkSetup
from gpuwatch.harness.simulate.publishing import NodePublishers
from gpuwatch.harness.simulate.scenario import Scenario
from gpuwatch.harness.simulate.work import WorkCounters, WorkServer
from producers.base.kafka import KafkaSender
from producers.base.kubeapi import KubeApi
from producers.base.publisher import MessageSender, Publisher
from producers.k8s.client import KubernetesApi
from producers.k8s.metrics import WatcherCollector
from producers.k8s.watcher import K8sWatcher
from schemas.codec import TopicSpec
from schemas.settings import Settings
from schemas.topics import K8S_NODES, K8S_PODS, K8S_WORKLOADS, NVML_SAMPLES, WORK_UNITS

__all__ = [
    "SenderFactory",
    "SimulationHandle",
    "SimulationService",
    "SimulationSummary",
    "caught_up",
    "run_simulation",
    "start_simulation",
]

log = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)
SenderFactory = Callable[[str, str], MessageSender]
"""(full topic name, client id) -> the sender of that topic."""

WATCH_BUFFER_BYTES = 64 << 20  # as the watcher's: hours of a busy cluster's pod churn
SYNC_TIMEOUT_S = 15.0  # the watcher's first lists; a local API server answers in milliseconds
DRAIN_TIMEOUT_S = 10.0  # the watcher publishing the last changes before it stops
FLUSH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SimulationSummary:
    """What a simulation did, for the command line and for callers."""

    scenario: str
    seed: int
    speed: float
    epoch_ms: int
    end_ms: int
    """Event time reached."""
    ticks: int
    late_ticks: int
    nodes: int
    gpus: int
    samples: int
    pods: dict[str, str]
    """`namespace/name` -> status (Pending, Running, CrashLoopBackOff, Completed, ...)."""
    sent: dict[str, int]
    """Messages acknowledged by Kafka, by topic (short name)."""
    dropped: dict[str, int]
    failed: dict[str, int]
    wall_s: float
    cpu_s: float
    """Process CPU seconds while it ran (every thread, the Kafka clients' included)."""
    unschedulable: dict[str, str] = field(default_factory=dict)
    """`namespace/name` -> the scheduler's message, for pods Pending that fit nowhere."""
    scrapes: dict[str, int] = field(default_factory=dict)
    """The agents' scrapes of units of work by outcome (`producers.work.scraper.OUTCOMES`;
    empty when no pod counts units of work)."""
    work_records: int = 0
    """`work.units` records the scrapes made, every one handed to its publisher: `sent`,
    `dropped` and `failed` of `work.units` account for them."""

    def status_counts(self) -> dict[str, int]:
        """How many pods end in each status."""
        return dict(sorted(Counter(self.pods.values()).items()))


def _kafka_senders(settings: Settings) -> SenderFactory:
    def make(topic: str, client_id: str) -> MessageSender:
        return KafkaSender(
            settings.kafka,
            topic,
            client_id=client_id,
            delivery_timeout_s=settings.agent.delivery_timeout_s,
        )

    return make


def caught_up(positions: Iterable[tuple[str, str | None]], written: Mapping[str, int]) -> bool:
    """Whether every watch has seen the last write of its resource: each (resource, the
    watch's resourceVersion, None before its first list) at or past `written[resource]`,
    the resourceVersion of the last write of that resource (none written: nothing to see).

    A real server cannot be asked for a bookmark: a watch reaches a version by the event
    of that write itself, so the last write of each resource is what it waits for."""
    return all(int(version or 0) >= written.get(resource, 0) for resource, version in positions)


def _emitter(publisher: Publisher, spec: TopicSpec[T]) -> Callable[[T], None]:
    def emit(value: T) -> None:
        publisher.publish(spec.key_of(value).encode(), spec.encode(value))

    return emit


class SimulationService:
    """API server, simulated cluster, watcher and publishers together: start, run, stop.

    The API server is the in-process one, started and closed here, or `api`, a real one
    that the caller closes."""

    def __init__(
        self,
        settings: Settings,
        scenario: Scenario,
        *,
        speed: float = 1.0,
        epoch_s: float | None = None,
        senders: SenderFactory | None = None,
        serve_metrics: bool = False,
        api: LiveApiServer | None = None,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be above 0, not {speed}")
        self.settings = settings
        self.scenario = scenario
        self.speed = speed
        epoch = float(int(time.time() if epoch_s is None else epoch_s))
        make = senders or _kafka_senders(settings)
        prefix = settings.kafka.topic_prefix
        self.samples = NodePublishers(
            make(NVML_SAMPLES.full_name(prefix), "gpuwatch-simulate-samples"),
            settings.agent.buffer_bytes,
        )
        """Each node agent's publisher of nvml.samples."""
        self.publishers: dict[str, Publisher] = {
            K8S_PODS.name: Publisher(
                make(K8S_PODS.full_name(prefix), "gpuwatch-simulate-pods"), WATCH_BUFFER_BYTES
            ),
            K8S_NODES.name: Publisher(
                make(K8S_NODES.full_name(prefix), "gpuwatch-simulate-nodes-k8s"),
                WATCH_BUFFER_BYTES,
            ),
            K8S_WORKLOADS.name: Publisher(
                make(K8S_WORKLOADS.full_name(prefix), "gpuwatch-simulate-workloads"),
                WATCH_BUFFER_BYTES,
            ),
        }
        """The watcher's publishers, by topic (short name)."""
        clock = SimClock(epoch)
        self.work_server: WorkServer | None = None
        """The simulated pods' /metrics, when the scenario's pods count units of work."""
        work = None
        if any(w.work for w in scenario.workloads):
            self.publishers[WORK_UNITS.name] = Publisher(
                make(WORK_UNITS.full_name(prefix), "gpuwatch-simulate-work"), WATCH_BUFFER_BYTES
            )
            self.work_server = WorkServer(WorkCounters(clock.time))
            work = WorkSetup(
                counters=self.work_server.counters,
                port=self.work_server.port,
                emit=_emitter(self.publishers[WORK_UNITS.name], WORK_UNITS),
                settings=settings.agent,
            )
        self.api: FakeApiServer | LiveApiServer = (
            FakeApiServer(clock=clock.time) if api is None else api
        )
        """The API server the simulated cluster is written to."""
        self.simulation = Simulation(
            scenario,
            api=self.api,
            publish_for=self.samples.publish_for,
            interval_s=settings.agent.interval_s,
            clock=clock,
            cluster=settings.cluster.name,
            work=work,
        )
        leaking = tuple(
            f"{spec.namespace}/{spec.name}"
            for spec in self.simulation.cluster.initial
            if spec.unallocated_gpus
        )
        watcher = settings.watcher.model_copy(
            update={
                "namespaces": (),  # one cluster-wide watch, whatever a deployment restricts
                "label_selector": None,
                "extra_pods": (*settings.watcher.extra_pods, *leaking),
            }
        )
        self._watcher_settings = watcher
        self.watcher: K8sWatcher | None = None
        self._kube: KubernetesApi | None = None
        self._started = False
        self.endpoints: dict[str, MetricsEndpoint] = {}
        """The /metrics served, `agents` and `watcher` (none without `serve_metrics`)."""
        if serve_metrics:
            self._add_endpoints(settings)

    def _add_endpoints(self, settings: Settings) -> None:
        bind = settings.metrics.bind
        agents = MetricsEndpoint(
            "node agents'", bind, settings.agent.metrics_port, "agent.metrics_port"
        )
        fleet = self.simulation.fleet.nodes
        agents.registry.register(
            FleetAgentCollector(
                {name: (node.agent, self.samples.by_node[name]) for name, node in fleet.items()},
                down=lambda: self.simulation.down,
            )
        )
        self.endpoints["agents"] = agents
        self.endpoints["watcher"] = MetricsEndpoint(
            "Kubernetes watcher's", bind, settings.watcher.metrics_port, "watcher.metrics_port"
        )

    def start(self, stop: threading.Event | None = None) -> None:
        """Serve /metrics (first: a port taken stops it before anything runs; raises
        MetricsPortError), serve the API (a real one: delete an earlier run's leftovers),
        apply the history before the epoch, start publishing and watching."""
        for endpoint in self.endpoints.values():
            endpoint.start()
        api = self.api
        if isinstance(api, FakeApiServer):
            api.start()
            self._started = True
            self._kube = kube = KubernetesApi.for_host(api.url)
        else:
            removed = api.remove_leftovers()
            log.info(
                "writing to a real API server url=%s removed_leftovers=%s",
                api.url,
                ",".join(f"{r}:{n}" for r, n in removed.items()) or "none",
            )
            self._kube = kube = api.client()
        if self.work_server is not None:
            self.work_server.start()
        self.simulation.prepare()
        self.samples.start()
        for publisher in self.publishers.values():
            publisher.start()
        self.watcher = self.watcher_over(kube)
        if "watcher" in self.endpoints:
            self.endpoints["watcher"].registry.register(
                WatcherCollector(self.watcher.watches, self.watcher.owners.stats, self.publishers)
            )
        self.watcher.start()
        stop = stop or threading.Event()
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while not self.watcher.synced and time.monotonic() < deadline and not stop.is_set():
            stop.wait(0.02)
        if not self.watcher.synced and not stop.is_set():
            log.warning("watcher not synced after %.0f s, simulating anyway", SYNC_TIMEOUT_S)

    def watcher_over(self, api: KubeApi) -> K8sWatcher:
        """The real watcher over `api` (in `start`, the API server's client): one
        cluster-wide watch, event time from the simulation's clock, every message naming
        the settings' cluster, published to the watcher's publishers."""
        return K8sWatcher(
            api,
            self._watcher_settings,
            emit_pod=_emitter(self.publishers[K8S_PODS.name], K8S_PODS),
            emit_node=_emitter(self.publishers[K8S_NODES.name], K8S_NODES),
            emit_workload=_emitter(self.publishers[K8S_WORKLOADS.name], K8S_WORKLOADS),
            now_ms=self.simulation.clock.now_ms,
            cluster=self.settings.cluster.name,
        )

    def _drained(self) -> bool:
        """Whether the watcher has seen every change written to the API server."""
        watcher = self.watcher
        if watcher is None:
            return True
        if isinstance(self.api, LiveApiServer):
            positions = ((w.collection.resource, w.resource_version) for w in watcher.watches)
            return caught_up(positions, self.api.written)
        latest = int(self.api.resource_version)
        return all(int(w.resource_version or 0) >= latest for w in watcher.watches)

    def stop(self) -> None:
        """Let the watcher catch up, stop it, flush the publishers, close the in-process API
        server and the /metrics endpoints."""
        if self.watcher is not None:
            self._drain()
            self.watcher.stop()
        self.samples.stop(timeout_s=FLUSH_TIMEOUT_S)
        for publisher in self.publishers.values():
            publisher.stop(timeout_s=FLUSH_TIMEOUT_S)
        if self._kube is not None:
            self._kube.close()
        if isinstance(self.api, FakeApiServer) and self._started:
            self.api.close()
        for endpoint in self.endpoints.values():
            endpoint.stop()
        self.simulation.fleet.close()
        if self.work_server is not None:
            self.work_server.close()

    def _drain(self) -> None:
        """Wait (up to DRAIN_TIMEOUT_S) until the watcher has seen every write: the
        in-process server moves every watch to its latest resourceVersion with a bookmark
        on demand; a real one's watches get there by the events of the last writes."""
        fake = self.api if isinstance(self.api, FakeApiServer) else None
        if fake is not None:
            fake.bookmark()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not (drained := self._drained()) and time.monotonic() < deadline:
            time.sleep(0.02)
            if fake is not None:
                fake.bookmark()
        if not drained:
            log.warning("watcher stopped before it saw every change timeout_s=%g", DRAIN_TIMEOUT_S)

    def summary(self, *, wall_s: float, cpu_s: float) -> SimulationSummary:
        """The summary as things stand."""
        sim = self.simulation
        pods = {f"{p.spec.namespace}/{p.spec.name}": p.status for p in sim.cluster.pods.values()}
        waiting = {
            f"{p.spec.namespace}/{p.spec.name}": p.unschedulable
            for p in sim.cluster.pods.values()
            if p.unschedulable is not None
        }
        scrapers = [n.work.scraper.stats for n in sim.fleet.nodes.values() if n.work is not None]
        scrapes: Counter[str] = Counter()
        for stats in scrapers:
            scrapes.update(stats.outcomes())  # update, not +: an outcome at 0 is kept
        return SimulationSummary(
            scenario=self.scenario.name,
            seed=self.scenario.seed,
            speed=self.speed,
            epoch_ms=round(sim.clock.epoch * 1000),
            end_ms=sim.clock.now_ms(),
            ticks=sim.ticks,
            late_ticks=sim.late_ticks,
            nodes=len(sim.cluster.layouts),
            gpus=sum(n.physical_gpus for n in sim.cluster.layouts),
            samples=sim.samples,
            pods=dict(sorted(pods.items())),
            sent={
                NVML_SAMPLES.name: self.samples.sent,
                **{name: p.stats.sent for name, p in self.publishers.items()},
            },
            dropped={
                NVML_SAMPLES.name: self.samples.dropped,
                **{name: p.outbox.dropped for name, p in self.publishers.items()},
            },
            failed={
                NVML_SAMPLES.name: self.samples.failed,
                **{name: p.stats.failed for name, p in self.publishers.items()},
            },
            wall_s=wall_s,
            cpu_s=cpu_s,
            unschedulable=dict(sorted(waiting.items())),
            scrapes=dict(scrapes),
            work_records=sum(s.records for s in scrapers),
        )


def _report(sim: Simulation) -> None:
    counts = Counter(p.status for p in sim.cluster.pods.values())
    log.info(
        "simulated t_s=%.0f ticks=%d samples=%d late_ticks=%d pods=%s",
        sim.sim_time_s,
        sim.ticks,
        sim.samples,
        sim.late_ticks,
        ",".join(f"{k}:{v}" for k, v in sorted(counts.items())),
    )


def run_simulation(
    settings: Settings,
    scenario: Scenario,
    *,
    speed: float = 1.0,
    duration_s: float | None = None,
    stop_event: threading.Event | None = None,
    epoch_s: float | None = None,
    until_s: float | None = None,
    senders: SenderFactory | None = None,
    serve_metrics: bool = False,
    api: LiveApiServer | None = None,
) -> SimulationSummary:
    """Run `scenario` until `stop_event` is set, `duration_s` wall seconds pass, or event
    time reaches `until_s` simulated seconds after the epoch.

    Event time starts at `epoch_s` (default: now, whole seconds) and runs `speed` times
    faster than wall time. Samples go to nvml.samples, pod and node changes (through the
    watcher) to k8s.pods and k8s.nodes, under the settings' topic prefix; the topics must
    exist. `senders` replaces the Kafka clients (tests). `serve_metrics` serves the agents'
    and the watcher's /metrics on `settings.agent.metrics_port` and
    `settings.watcher.metrics_port` (MetricsPortError if one is taken). `api`: a real API
    server to write the cluster to and watch (left open), instead of the in-process one;
    ApiError if it refuses a write.
    """
    stop = stop_event or threading.Event()
    cpu0, wall0 = time.process_time(), time.monotonic()
    service = SimulationService(
        settings,
        scenario,
        speed=speed,
        epoch_s=epoch_s,
        senders=senders,
        serve_metrics=serve_metrics,
        api=api,
    )
    log.info(
        "simulation starting cluster=%s scenario=%s seed=%d nodes=%d speed=%g interval_s=%g "
        "topics=%s*",
        settings.cluster.name,
        scenario.name,
        scenario.seed,
        len(service.simulation.cluster.layouts),
        speed,
        settings.agent.interval_s,
        settings.kafka.topic_prefix,
    )
    try:
        service.start(stop)
        service.simulation.run(
            stop, speed=speed, duration_s=duration_s, until_s=until_s, report=_report
        )
    finally:
        service.stop()
    summary = service.summary(wall_s=time.monotonic() - wall0, cpu_s=time.process_time() - cpu0)
    log.info(
        "simulation stopped scenario=%s ticks=%d samples=%d sent=%s dropped=%s pods=%s",
        summary.scenario,
        summary.ticks,
        summary.samples,
        summary.sent,
        summary.dropped,
        summary.status_counts(),
    )
    return summary


class SimulationHandle:
    """A simulation on a thread of its own: `stop()` ends it and returns its summary."""

    def __init__(self, target: Callable[[threading.Event], SimulationSummary]) -> None:
        self.summary: SimulationSummary | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._target = target
        self._thread = threading.Thread(target=self._run, name="gpuwatch-simulate", daemon=True)

    def _run(self) -> None:
        try:
            self.summary = self._target(self._stop)
        except BaseException as exc:  # kept for the caller of stop()/wait()
            log.exception("simulation failed")
            self.error = exc

    def start(self) -> SimulationHandle:
        """Start the thread."""
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the simulation still runs."""
        return self._thread.is_alive()

    def wait(self, timeout_s: float | None = None) -> SimulationSummary | None:
        """Wait for the end (its duration); the summary, None if still running."""
        self._thread.join(timeout_s)
        if self.error is not None:
            raise RuntimeError("the simulation failed") from self.error
        return None if self._thread.is_alive() else self.summary

    def stop(self, timeout_s: float = 30.0) -> SimulationSummary | None:
        """Stop it (flushing what is buffered) and wait; the summary."""
        self._stop.set()
        return self.wait(timeout_s)


def start_simulation(
    settings: Settings,
    scenario: Scenario,
    *,
    speed: float = 1.0,
    duration_s: float | None = None,
    epoch_s: float | None = None,
    until_s: float | None = None,
    senders: SenderFactory | None = None,
    serve_metrics: bool = False,
    api: LiveApiServer | None = None,
) -> SimulationHandle:
    """`run_simulation` on a background thread (until `stop()` or `duration_s`)."""

    def target(stop: threading.Event) -> SimulationSummary:
        return run_simulation(
            settings,
            scenario,
            speed=speed,
            duration_s=duration_s,
            stop_event=stop,
            epoch_s=epoch_s,
            until_s=until_s,
            senders=senders,
            serve_metrics=serve_metrics,
            api=api,
        )

    return SimulationHandle(target).start()
