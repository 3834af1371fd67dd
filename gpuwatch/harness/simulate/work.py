"""Units of work in the simulation: pods that count training steps, tokens or requests as
Prometheus counters, served over real HTTP, and scraped by the node agents as a real one
scrapes its node's pods.

A workload with `work` (units a second, scenario.py) gives each pod a counter per unit,
named as the common exporters name them (`train_steps_total`, vLLM's
`vllm:generation_tokens_total`...). A counter starts at 0 when the container starts (a
restart after a crash starts it again, with a new `process_start_time_seconds`) and stops
counting when it ends. `WorkServer` answers `GET /pods/<uid>/metrics` with every counter
at the simulation's event time (`now_s`), so that a scrape in a tick reads the value of
that tick. The pods' annotations (`annotations`) point the agents there: pod IP
127.0.0.1, the server's port, that path. Each node's agent scrapes its node's pods
(`NodeWork`) every `work_interval_s` of event time, inside its tick, so the simulation
stays deterministic: the records go to `work.units`, the increases onto the sample.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from producers.work.scraper import WorkScraper, pod_work
from producers.work.targets import WorkTarget, parse_target
from schemas.nvml_sample import PodWork
from schemas.work_units import WorkUnits

__all__ = [
    "METRICS",
    "NodeTargets",
    "NodeWork",
    "WorkCounters",
    "WorkServer",
    "metric_of",
    "work_annotations",
]

log = logging.getLogger(__name__)

POD_IP = "127.0.0.1"
METRICS: Mapping[str, str] = {
    "steps": "train_steps_total",
    "samples": "train_samples_total",
    "tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "requests": "vllm:request_success_total",
    "inferences": "nv_inference_count",
}
"""The counter a unit is read from, as common exporters name it (PyTorch Lightning's
loggers, vLLM, Triton); another unit `u` is `u_total`."""
_PATH = re.compile(r"^/pods/(?P<uid>[0-9a-f-]{1,64})/metrics$")


def metric_of(unit: str) -> str:
    """The counter that counts `unit`."""
    return METRICS.get(unit, f"{unit}_total")


def work_annotations(work: Mapping[str, float], port: int, uid: str) -> dict[str, str]:
    """The `gpuwatch.io/work*` annotations of a pod counting `work` (empty: none)."""
    if not work:
        return {}
    return {
        "gpuwatch.io/work": ",".join(f"{u}={metric_of(u)}" for u in sorted(work)),
        "gpuwatch.io/work-port": str(port),
        "gpuwatch.io/work-path": f"/pods/{uid}/metrics",
    }


@dataclass
class _Counting:
    rates: Mapping[str, float]
    started_s: float
    stopped_s: float | None = None


class WorkCounters:
    """Every pod's counters, by the uid the samples name it by; thread-safe."""

    def __init__(self, now_s: Callable[[], float]) -> None:
        self._now_s = now_s
        self._pods: dict[str, _Counting] = {}
        self._lock = threading.Lock()

    def start(self, uid: str, rates: Mapping[str, float], at_s: float) -> None:
        """The pod's container starts (again): its counters from 0 (epoch seconds)."""
        with self._lock:
            self._pods[uid] = _Counting(dict(rates), at_s)

    def stop(self, uid: str, at_s: float) -> None:
        """The container ended or crashed: the counters keep their values."""
        with self._lock:
            counting = self._pods.get(uid)
            if counting is not None and counting.stopped_s is None:
                counting.stopped_s = at_s

    def remove(self, uid: str) -> None:
        """The pod is gone."""
        with self._lock:
            self._pods.pop(uid, None)

    def exposition(self, uid: str) -> bytes | None:
        """The pod's /metrics now, in the text format; None for a pod with no counters."""
        now = self._now_s()
        with self._lock:
            counting = self._pods.get(uid)
            if counting is None:
                return None
            end = now if counting.stopped_s is None else min(now, counting.stopped_s)
            ran = max(0.0, end - counting.started_s)
            lines = [
                "# HELP process_start_time_seconds Start time of the process since unix epoch.",
                "# TYPE process_start_time_seconds gauge",
                f"process_start_time_seconds {counting.started_s:.3f}",
            ]
            for unit, rate in sorted(counting.rates.items()):
                metric = metric_of(unit)
                family = metric.removesuffix("_total")
                lines += [
                    f"# HELP {family} {unit} done by the process.",
                    f"# TYPE {family} counter",
                    f'{metric}{{model_name="sim"}} {rate * ran:.6f}',
                ]
        return ("\n".join(lines) + "\n").encode()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        match = _PATH.match(self.path.split("?", 1)[0])
        body = None if match is None else self.server.counters.exposition(match["uid"])
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # a scrape a second per pod: not for the log


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    counters: WorkCounters


class WorkServer:
    """The pods' /metrics on 127.0.0.1 (a port of the system's choosing)."""

    def __init__(self, counters: WorkCounters) -> None:
        self.counters = counters
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def port(self) -> int:
        """Where it listens; RuntimeError before `start`."""
        if self._server is None:
            raise RuntimeError("the work server is not started")
        return int(self._server.server_address[1])

    def start(self) -> WorkServer:
        """Listen, and serve on a thread of its own."""
        self._server = _Server((POD_IP, 0), _Handler)
        self._server.counters = self.counters
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gpuwatch-sim-work", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving."""
        if self._server is None:
            return
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        self._server = None


class NodeTargets:
    """The pods of one node that count units of work (a `TargetSource`): their annotations
    read as the agent reads a pod's, with the port `port()` of the server then."""

    def __init__(self, node: str, port: Callable[[], int]) -> None:
        self.node = node
        self._port = port
        self._pods: dict[str, tuple[str, str, Mapping[str, float]]] = {}

    def add(self, namespace: str, pod: str, uid: str, work: Mapping[str, float]) -> None:
        """A pod of the node that counts `work` (units a second), from when it runs."""
        self._pods[uid] = (namespace, pod, work)

    def remove(self, uid: str) -> None:
        """The pod stopped running."""
        self._pods.pop(uid, None)

    def targets(self) -> Sequence[WorkTarget]:
        """The pods to scrape now."""
        port = self._port()
        found = (
            parse_target(ns, pod, uid, self.node, work_annotations(work, port, uid), POD_IP)
            for uid, (ns, pod, work) in self._pods.items()
        )
        return [target for target in found if target is not None]

    def __len__(self) -> int:
        return len(self._pods)


class NodeWork:
    """One node agent's scrapes: every `interval_s` of event time, within its tick."""

    def __init__(
        self,
        targets: NodeTargets,
        scraper: WorkScraper,
        *,
        emit: Callable[[WorkUnits], None],
        now_ms: Callable[[], int],
    ) -> None:
        self.targets = targets
        self.scraper = scraper
        self._emit = emit
        self._now_ms = now_ms
        self._interval_ms = max(1, round(scraper.interval_s * 1000))
        self._next_ms: int | None = None

    def __call__(self) -> tuple[PodWork, ...]:
        """The increases of a scrape due by now (the agent's `work`), each also emitted."""
        now = self._now_ms()
        if self._next_ms is None:  # on the grid of the interval: the first at or after now
            self._next_ms = now + (-now) % self._interval_ms
        if now < self._next_ms:
            return ()
        self._next_ms = now - now % self._interval_ms + self._interval_ms
        if not len(self.targets):
            return ()
        records = self.scraper.scrape_once(now)
        for record in records:
            self._emit(record)
        return pod_work(records)
