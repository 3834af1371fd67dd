"""Wires `gpuwatch node-agent`: a GPU reader, PID and allocation sources, Kafka, metrics."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from dataclasses import dataclass
from types import FrameType
from typing import Literal

from prometheus_client import CollectorRegistry, start_http_server

from producers.agent.loop import NodeAgent
from producers.agent.metrics import AgentCollector, ClaimStats
from producers.agent.publisher import Publisher
from producers.agent.readings import AllocationSource, GpuReader, PodResolver
from producers.k8s.api import ApiError
from producers.k8s.slices import ApiCaller, ResourceSliceDevices
from producers.kafka import KafkaSender, linger_ms
from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES

log = logging.getLogger(__name__)

Backend = Literal["nvml", "sim"]


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
        from producers.simulate.node import simple_node

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
    from producers.k8s.client import K8sConfigError, connect

    def api() -> ApiCaller:
        try:
            return connect(settings.watcher.kubeconfig, settings.watcher.context)
        except K8sConfigError as exc:
            raise ApiError(str(exc)) from exc

    return ResourceSliceDevices(api, node, settings.agent.dra_drivers)


def run(settings: Settings, options: AgentOptions) -> int:
    """Sample until stopped; SIGTERM and SIGINT flush what is buffered and exit 0."""
    node = settings.agent.node_name or socket.gethostname()
    reader, resolver, allocations = _sources(settings, options, node)
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
    )
    registry = CollectorRegistry()
    claims = allocations if isinstance(allocations, ClaimStats) else None
    registry.register(AgentCollector(agent, publisher, claims))
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
    try:
        agent.run(stop)
    finally:
        if timer is not None:
            timer.cancel()
        publisher.stop(timeout_s=10.0)
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
        "node agent stopped node=%s samples=%d sent=%d dropped=%d lost=%d",
        node,
        agent.stats.ticks,
        publisher.stats.sent,
        publisher.outbox.dropped,
        publisher.stats.failed,
    )
    return 0
