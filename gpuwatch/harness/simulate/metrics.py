"""The simulated cluster's self-metrics: every node agent's figures on one endpoint, one
`node` label per node, and the watcher's, with the names the real processes export.

The agents' families come from the real agent collector, one per node, merged into one
family per name (an exposition may name a family once). A node whose agent is down in the
scenario exports nothing, as a stopped agent would.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from producers.agent.loop import NodeAgent
from producers.agent.metrics import AgentCollector
from producers.base.publisher import Publisher
from schemas.settings import ENV_VARS

__all__ = ["FleetAgentCollector", "MetricsEndpoint", "MetricsPortError"]

log = logging.getLogger(__name__)


class FleetAgentCollector(Collector):
    """The agent metrics of many nodes in one exposition; `down()` names the nodes whose
    agent is down now (left out)."""

    def __init__(
        self,
        agents: Mapping[str, tuple[NodeAgent, Publisher]],
        down: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        self._collectors = {
            node: AgentCollector(agent, publisher) for node, (agent, publisher) in agents.items()
        }
        self._down = down

    def collect(self) -> Iterator[Metric]:
        """One family per name, a sample per node in each."""
        down = self._down()
        families: dict[str, Metric] = {}
        for node, collector in self._collectors.items():
            if node in down:
                continue
            for family in collector.collect():
                merged = families.setdefault(family.name, family)
                if merged is not family:
                    merged.samples.extend(family.samples)
        yield from families.values()


class MetricsPortError(Exception):
    """A /metrics endpoint cannot listen; the message names the port and its setting."""

    def __init__(self, what: str, bind: str, port: int, setting: str, reason: str) -> None:
        env = next((name for name, path in ENV_VARS.items() if ".".join(path) == setting), None)
        where = setting if env is None else f"{setting}, env {env}"
        super().__init__(
            f"port {port} on {bind} {reason} ({where}): cannot serve the {what} metrics"
        )
        self.port = port
        self.setting = setting


class MetricsEndpoint:
    """One registry served on `bind:port` while started."""

    def __init__(self, what: str, bind: str, port: int, setting: str) -> None:
        self.what = what
        self.bind = bind
        self.port = port
        self.setting = setting
        """The setting the port comes from (`agent.metrics_port`), for the error."""
        self.registry = CollectorRegistry()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen; MetricsPortError if the port is taken or cannot be bound."""
        try:
            self._server, self._thread = start_http_server(
                self.port, addr=self.bind, registry=self.registry
            )
        except OSError as exc:
            reason = (
                "is in use"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be bound: {exc.strerror or exc}"
            )
            raise MetricsPortError(self.what, self.bind, self.port, self.setting, reason) from exc
        log.info("serving metrics of=%s at=%s:%d", self.what, self.bind, self.port)

    def stop(self) -> None:
        """Stop listening (nothing if not started)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
