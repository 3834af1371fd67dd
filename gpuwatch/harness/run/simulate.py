"""Wires `gpuwatch simulate`: a scenario, its overrides, the topics check, /metrics, signals,
summary; with `--kube`, the local stack's kube-apiserver as the simulated cluster's API.

From Python (`gpuwatch demo`): `load(...)` a scenario, then `run_simulation(settings,
scenario, speed=..., duration_s=..., stop_event=...)` in the foreground or
`start_simulation(...)` for a handle whose `stop()` returns the summary.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import FrameType

from gpuwatch.harness.simulate.kube.live import SIMULATOR_LABELS, LiveApiServer
from gpuwatch.harness.simulate.metrics import MetricsPortError
from gpuwatch.harness.simulate.runner import (
    SimulationHandle,
    SimulationSummary,
    run_simulation,
    start_simulation,
)
from gpuwatch.harness.simulate.scenario import (
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_names,
    with_overrides,
)
from gpuwatch.harness.stack import kube, manager
from gpuwatch.harness.stack.service import StackError
from producers.base.kubeapi import ApiError
from producers.k8s.client import K8sConfigError
from schemas.settings import Settings
from schemas.topics import K8S_NODES, K8S_PODS, K8S_WORKLOADS, NVML_SAMPLES

__all__ = [
    "ScenarioError",
    "SimulateKubeError",
    "SimulateMetricsError",
    "SimulateOptions",
    "SimulateStartError",
    "SimulationHandle",
    "SimulationSummary",
    "format_summary",
    "kube_api",
    "load",
    "parse_epoch",
    "run",
    "run_simulation",
    "scenario_names",
    "start_simulation",
]

log = logging.getLogger(__name__)

PODS_LISTED = 40  # the summary names each pod up to this many, else counts by status


class SimulateStartError(Exception):
    """The simulation cannot start (bad scenario, topics missing); the message says why."""


class SimulateKubeError(SimulateStartError):
    """The local stack's API server (`--kube`) cannot be started, reached, or refused a
    write; the message says which."""


class SimulateMetricsError(SimulateStartError):
    """A /metrics port cannot be bound (taken by a node agent, a watcher, another simulation);
    the message names the port and its setting."""


@dataclass(frozen=True)
class SimulateOptions:
    """What the command line chose."""

    scenario: str = "small"
    speed: float = 1.0
    duration_s: float | None = None
    until_s: float | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    seed: int | None = None
    epoch_s: float | None = None
    check_topics: bool = True
    metrics: bool = True
    """Serve the agents' and the watcher's /metrics on their settings' ports."""
    kube: bool = False
    """Write the simulated cluster to the local stack's kube-apiserver and watch it there,
    instead of the in-process API server."""


def load(ref: str, **overrides: int | None) -> Scenario:
    """A scenario by name or path, with the overrides of `with_overrides` applied (`nodes`,
    `gpus_per_node`, `seed`; None leaves one as it is); ScenarioError if unusable."""
    return with_overrides(load_scenario(ref), **overrides)


def parse_epoch(text: str) -> float:
    """Epoch seconds from `1764412345` or an ISO 8601 time (`2025-11-29T10:00:00Z`)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"not epoch seconds nor an ISO 8601 time: {text!r}") from exc
    if when.tzinfo is None:
        raise ValueError(f"give the time zone of {text!r} (e.g. a trailing Z for UTC)")
    return when.timestamp()


def _check_topics(settings: Settings) -> None:
    from gpuwatch import kafka

    prefix = settings.kafka.topic_prefix
    inputs = (NVML_SAMPLES, K8S_PODS, K8S_NODES, K8S_WORKLOADS)
    wanted = {spec.full_name(prefix) for spec in inputs}
    try:
        rows = kafka.describe_topics(settings)
    except kafka.TopicAdminError as exc:
        raise SimulateStartError(f"cannot reach Kafka to check the topics: {exc}") from exc
    missing = sorted(row.name for row in rows if row.name in wanted and row.outcome == "missing")
    if missing:
        raise SimulateStartError(
            f"topics missing: {', '.join(missing)}; create them with `gpuwatch topics create`"
        )


def kube_api(settings: Settings, progress: Callable[[str], None]) -> LiveApiServer:
    """The local stack's kube-apiserver (the stack started with it, unless it runs), as
    the simulator writes to it: its admin, every object labelled `SIMULATOR_LABELS`.
    SimulateKubeError if it does not come up."""
    try:
        statuses = manager.up(settings, progress, kube=True)
    except StackError as exc:
        raise SimulateKubeError(f"the stack's API server cannot start: {exc}") from exc
    down = [f"{s.name}: {s.detail}" for s in statuses if not s.healthy]
    if down:
        raise SimulateKubeError("the stack did not come up: " + ", ".join(down))
    try:
        return LiveApiServer(
            kube.api_url(settings), kube.admin_kubeconfig(settings), labels=SIMULATOR_LABELS
        )
    except K8sConfigError as exc:
        raise SimulateKubeError(str(exc)) from exc


def format_summary(summary: SimulationSummary) -> str:
    """The summary for a terminal."""
    simulated = (summary.end_ms - summary.epoch_ms) / 1000
    lines = [
        f"scenario {summary.scenario} (seed {summary.seed}): {summary.nodes} nodes, "
        f"{summary.gpus} GPUs, {simulated:.0f} s simulated in {summary.wall_s:.1f} s "
        f"(speed {summary.speed:g}, {summary.ticks} ticks, {summary.late_ticks} late), "
        f"CPU {summary.cpu_s:.1f} s",
        "published: "
        + ", ".join(
            f"{topic} {summary.sent.get(topic, 0)} sent"
            + (f" ({summary.dropped[topic]} dropped)" if summary.dropped.get(topic) else "")
            for topic in summary.sent
        ),
        "pods: " + ", ".join(f"{status} {n}" for status, n in summary.status_counts().items()),
    ]
    if len(summary.pods) <= PODS_LISTED:
        width = max((len(name) for name in summary.pods), default=0)
        for name, status in summary.pods.items():
            why = summary.unschedulable.get(name)
            lines.append(f"  {name:<{width}}  {status}" + (f"  ({why})" if why else ""))
    return "\n".join(lines)


def run(
    settings: Settings,
    options: SimulateOptions,
    progress: Callable[[str], None] = lambda message: None,
) -> int:
    """Simulate until the duration ends or SIGTERM/SIGINT; print the summary. With
    `options.kube`, first start the stack with its API server (`progress` says how it
    goes) and print how to watch the simulated cluster there with kubectl."""
    try:
        scenario = load(
            options.scenario,
            nodes=options.nodes,
            gpus_per_node=options.gpus_per_node,
            seed=options.seed,
        )
    except ScenarioError as exc:
        raise SimulateStartError(str(exc)) from exc
    if options.check_topics:
        _check_topics(settings)
    api = kube_api(settings, progress) if options.kube else None
    if api is not None:
        print(
            f"simulated cluster on the API server {api.url}; watch it with\n"
            f"  kubectl --kubeconfig {api.kubeconfig} get pods -A -w",
            flush=True,
        )
    try:
        return _run(settings, options, scenario, api)
    finally:
        if api is not None:
            api.close()


def _run(
    settings: Settings, options: SimulateOptions, scenario: Scenario, api: LiveApiServer | None
) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping signal=%s", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        summary = run_simulation(
            settings,
            scenario,
            speed=options.speed,
            duration_s=options.duration_s,
            until_s=options.until_s,
            stop_event=stop,
            epoch_s=options.epoch_s,
            serve_metrics=options.metrics,
            api=api,
        )
    except MetricsPortError as exc:
        raise SimulateMetricsError(
            f"{exc}; stop what listens there, set another port, or pass --no-metrics"
        ) from exc
    except ApiError as exc:
        if api is None:
            raise
        raise SimulateKubeError(f"the API server at {api.url} refused a write: {exc}") from exc
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(format_summary(summary), flush=True)
    return 0
