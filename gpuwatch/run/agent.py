"""Wires `gpuwatch node-agent`: a GPU reader, PID and allocation sources, Kafka, metrics."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Literal

from prometheus_client import CollectorRegistry, start_http_server

from producers.agent.loop import NodeAgent
from producers.agent.metrics import AgentCollector, ClaimStats, WorkCollector
from producers.agent.slices import ResourceSliceDevices
from producers.base.kafka import KafkaSender, linger_ms
from producers.base.kubeapi import ApiCaller, ApiError
from producers.base.ports import AllocationSource, GpuReader, PodResolver
from producers.base.publisher import Publisher
from producers.work.scraper import WorkScraper, WorkScraperThread, pod_work
from producers.work.targets import ApiTargets
from schemas.nvml_sample import PodWork
from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES, WORK_UNITS

log = logging.getLogger(__name__)

Backend = Literal["nvml", "sim"]
WORK_BUFFER_BYTES = 8 << 20  # records of units of work kept while Kafka is away: hours
# SIGTERM to exit within the DaemonSet's 30 s grace period, whatever the broker does: each
# publisher sends what it holds for at most this long, then closes (what is left is counted).
STOP_SAMPLES_S = 10.0
STOP_WORK_S = 5.0


class AgentStartError(Exception):
    """The agent cannot start here (no driver, bad option); the message says what to do."""


@dataclass(frozen=True)
class AgentOptions:
    """What the command line chose on top of the settings."""

    backend: Backend
    sim_gpus: int = 8
    sim_model: str = "h100"
    seed: int = 0
    duration_s: float | None = None
    """Stop after this many seconds (scripts, tests); None: until SIGTERM/SIGINT."""


def _sources(
    settings: Settings, options: AgentOptions, node: str
) -> tuple[GpuReader, PodResolver, AllocationSource]:
    if options.backend == "sim":
        from gpuwatch.harness.simulate.node import simple_node

        try:
            reader, pods = simple_node(node, options.sim_gpus, options.sim_model, seed=options.seed)
        except ValueError as exc:
            raise AgentStartError(str(exc)) from exc
        return reader, pods, pods

    from producers.cgroups import CgroupPodResolver
    from producers.nvml.reader import NvmlReader, NvmlUnavailable
    from producers.podresources.client import KubeletAllocationSource
    from producers.podresources.poduids import PodLogUids

    agent = settings.agent
    try:
        nvml = NvmlReader()
    except NvmlUnavailable as exc:
        raise AgentStartError(
            f"no usable NVIDIA driver here ({exc}); on a machine without GPUs use --backend sim"
        ) from exc
    allocations = KubeletAllocationSource(
        agent.kubelet_socket,
        agent.gpu_resources,
        agent.gpu_resource_prefixes,
        pod_uids=PodLogUids(agent.pod_logs_dir),
        dra_drivers=agent.dra_drivers,
        devices=resource_slices(settings, node) if agent.dra_drivers else None,
    )
    return nvml, CgroupPodResolver(agent.proc_root), allocations


def resource_slices(settings: Settings, node: str) -> ResourceSliceDevices:
    """This node's DRA devices, from an API server the agent connects to at first need."""
    return ResourceSliceDevices(_api(settings), node, settings.agent.dra_drivers)


def _api(settings: Settings) -> Callable[[], ApiCaller]:
    """An API server connection made at first need (its failure is an ApiError, retried)."""
    from producers.k8s.client import K8sConfigError, connect

    def api() -> ApiCaller:
        try:
            return connect(settings.watcher.kubeconfig, settings.watcher.context)
        except K8sConfigError as exc:
            raise ApiError(str(exc)) from exc

    return api


class WorkUnitsFeed:
    """The scrapes of the node's opted-in pods (`gpuwatch.io/work`): a thread scrapes them
    every `work_interval_s`; each tick of the agent takes what it found, publishes every
    record to `work.units` and hands the increases to the sample (`NodeAgent(work=)`)."""

    def __init__(self, settings: Settings, node: str) -> None:
        a = settings.agent
        self.targets = ApiTargets(_api(settings), node)
        self.scraper = WorkScraper(
            self.targets,
            node=node,
            cluster=settings.cluster.name,
            interval_s=a.work_interval_s,
            timeout_s=a.work_timeout_s,
            max_bytes=a.work_max_bytes,
            max_series=a.work_max_series,
            clock_ms=lambda: int(time.time() * 1000),
        )
        self.thread = WorkScraperThread(self.scraper)
        sender = KafkaSender(
            settings.kafka,
            WORK_UNITS.full_name(settings.kafka.topic_prefix),
            client_id=f"gpuwatch-node-agent-{node}-work",
            delivery_timeout_s=a.delivery_timeout_s,
        )
        self.publisher = Publisher(sender, WORK_BUFFER_BYTES)

    def __call__(self) -> tuple[PodWork, ...]:
        records = self.thread.drain()
        for record in records:
            self.publisher.publish(record.uid.encode(), WORK_UNITS.encode(record))
        return pod_work(records)

    def start(self) -> None:
        """Publish, and scrape from now on."""
        self.publisher.start()
        self.thread.start()

    def stop(self) -> None:
        """Stop scraping, flush what is buffered."""
        self.thread.stop(timeout=STOP_WORK_S)
        self.scraper.close()
        self.publisher.stop(timeout_s=STOP_WORK_S)


def run(settings: Settings, options: AgentOptions) -> int:
    """Sample until stopped; SIGTERM and SIGINT flush what is buffered and exit 0."""
    node = settings.agent.node_name or socket.gethostname()
    reader, resolver, allocations = _sources(settings, options, node)
    # Units of work: the pods of a real node only (a `sim` backend's pods are not listed).
    scrape = options.backend == "nvml" and settings.agent.work_enabled
    work = WorkUnitsFeed(settings, node) if scrape else None
    topic = NVML_SAMPLES.full_name(settings.kafka.topic_prefix)
    sender = KafkaSender(
        settings.kafka,
        topic,
        client_id=f"gpuwatch-node-agent-{node}",
        delivery_timeout_s=settings.agent.delivery_timeout_s,
        linger_ms=linger_ms(settings.agent.interval_s),
    )
    publisher = Publisher(sender, settings.agent.buffer_bytes)
    agent = NodeAgent(
        node=node,
        reader=reader,
        resolver=resolver,
        allocations=allocations,
        publish=publisher.publish,
        interval_s=settings.agent.interval_s,
        cluster=settings.cluster.name,
        work=work,
    )
    registry = CollectorRegistry()
    claims = allocations if isinstance(allocations, ClaimStats) else None
    registry.register(AgentCollector(agent, publisher, claims))
    if work is not None:
        registry.register(WorkCollector(node, work.scraper.stats, work.targets))
    server, server_thread = start_http_server(
        settings.agent.metrics_port, addr=settings.metrics.bind, registry=registry
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping signal=%s", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    timer = None
    if options.duration_s is not None:
        timer = threading.Timer(options.duration_s, stop.set)
        timer.daemon = True
        timer.start()
    log.info(
        "node agent started cluster=%s node=%s backend=%s topic=%s interval_s=%s metrics=%s:%d",
        settings.cluster.name,
        node,
        options.backend,
        topic,
        settings.agent.interval_s,
        settings.metrics.bind,
        settings.agent.metrics_port,
    )
    publisher.start()
    if work is not None:
        work.start()
    try:
        agent.run(stop)
    finally:
        if timer is not None:
            timer.cancel()
        if work is not None:
            work.stop()
        publisher.stop(timeout_s=STOP_SAMPLES_S)
        reader.close()
        close = getattr(allocations, "close", None)
        if callable(close):
            close()
        server.shutdown()
        server.server_close()
        server_thread.join(timeout=5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info(
        "node agent stopped node=%s samples=%d sent=%d dropped=%d lost=%d undelivered=%d "
        "retried=%d",
        node,
        agent.stats.ticks,
        publisher.stats.sent,
        publisher.outbox.dropped,
        publisher.stats.failed,
        publisher.stats.undelivered,
        publisher.stats.retried,
    )
    return 0
