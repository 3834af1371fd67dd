"""`gpuwatch bench alerts`: how soon an idle GPU's alert is in the topic, Redis and Prometheus.

On topics, an app id and a Redis database of its own, a worker (with its /metrics), a
`gpuwatch sink redis` and a private Prometheus run: the Prometheus has a configuration of
its own in a temporary directory, scraping the bench's worker every second, evaluating the
shipped rules (deploy/prometheus/gpuwatch-rules.yml) every second, so the shared stack's
Prometheus is untouched. A few simulated nodes send a sample a second, each at its end in
wall time as an agent does; their idle and notebook GPUs are at 0 % from the first. The
worker's idle threshold is `GPUWATCH_IDLE_ALERT_AFTER_S` = 10 s (not the 60 s default: the
latency after the threshold does not depend on it, and the run takes seconds).

Three probes note when each GpuIdleAllocated alert first shows: a consumer of the `alerts`
topic, a reader of Redis' `gpuwatch:alerts:firing` every 20 ms, and a query of Prometheus'
`ALERTS{alertname="GpuIdleAllocated",alertstate="firing"}` every 100 ms
(`gpuwatch.harness.bench.alert_figures` has the arithmetic and the DCGM figure beside it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.harness.bench import scratch
from gpuwatch.harness.bench.alert_figures import AlertResult, Fired, alert_result
from gpuwatch.harness.bench.backlog import Say, wait_for, wait_ready
from gpuwatch.harness.bench.load import build_fleet, produce, send_live
from gpuwatch.harness.bench.probes import Offsets, Poller
from gpuwatch.harness.bench.procs import SinkProcess, WorkerProcess, free_port, supervised
from gpuwatch.harness.stack.prometheus import default_config
from gpuwatch.kafka import TopicPartition, consumer
from schemas.settings import Settings
from schemas.topics import ALERTS, K8S_PODS, NVML_SAMPLES
from sinks.redis import client as redis_client
from sinks.redis.keys import RedisKeys

__all__ = [
    "IDLE_ALERT_AFTER_S",
    "NODES",
    "AlertsQuery",
    "PrivatePrometheus",
    "bench_alerts",
    "prometheus_config",
]

log = logging.getLogger(__name__)

IDLE_ALERT_AFTER_S = 10  # the bench's threshold: a run of seconds, the latency after it alike
NODES = 6  # two GPUs at 0 % each (the idle pod's and the notebook's): 12 alerts
AFTER_S = 12  # samples sent past the threshold: the alerts fire within them
SETTLE_S = 15.0  # after the last sample, the stages get this long to show every alert
SCRAPE_S = 1.0  # the private Prometheus: a second to scrape and to evaluate
READY_S = 60.0  # Prometheus starts in seconds
QUERY = 'ALERTS{alertname="GpuIdleAllocated",alertstate="firing"}'
LEAD_S = 1.0  # the first sample ends this long after the fleet is built

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def prometheus_config(worker_port: int, rules: Path, interval_s: float = SCRAPE_S) -> str:
    """A Prometheus configuration scraping the worker at `worker_port`, loading `rules`."""
    every = f"{interval_s:g}s"
    config = {
        "global": {
            "scrape_interval": every,
            "evaluation_interval": every,
            "scrape_timeout": every,
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "gpuwatch-worker",
                "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}],
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


class PrivatePrometheus:
    """A `prometheus` process of the bench's own, on a free port and a temporary directory."""

    def __init__(self, home: Path, worker_port: int) -> None:
        rules = default_config().parent / "gpuwatch-rules.yml"
        config = home / "prometheus.yml"
        config.write_text(prometheus_config(worker_port, rules))
        self.port = free_port()
        self.log_path = home / "prometheus.log"
        argv = [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def get(self, path: str, **query: str) -> Any:
        """GET an API path; its `data`, or None when Prometheus does not answer."""
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(query)}"
        try:
            with _OPENER.open(url, timeout=2) as response:
                body = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.debug("prometheus query failed url=%s error=%r", url, exc)
            return None
        return body.get("data") if body.get("status") == "success" else None

    def ready(self) -> bool:
        """The rules loaded, GpuIdleAllocated among them, and the worker scraped up."""
        if self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the bench's Prometheus exited:\n{tail}")
        rules = self.get("/api/v1/rules") or {}
        names = {r.get("name") for g in rules.get("groups", ()) for r in g.get("rules", ())}
        up = self.get("/api/v1/query", query='up{job="gpuwatch-worker"} == 1') or {}
        return "GpuIdleAllocated" in names and bool(up.get("result"))

    def stop(self) -> None:
        """SIGTERM, SIGKILL past 15 s."""
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _AlertsReader(Poller):
    """Reads the `alerts` topic from the start: each GpuIdleAllocated's first firing."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("alerts-reader", 0.0)
        topic = ALERTS.full_name(settings.kafka.topic_prefix)
        self._consumer = consumer(settings.kafka, enable_auto_commit=False, fetch_max_wait_ms=20)
        tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
        self._consumer.assign(tps)
        self._consumer.seek_to_beginning(*tps)
        self.fired: dict[str, Fired] = {}
        self.seen: dict[str, float] = {}

    def _poll(self) -> None:
        for records in self._consumer.poll(timeout_ms=100).values():
            now = time.time()
            for record in records:
                alert = ALERTS.decode(record.value)
                if alert.name != "GpuIdleAllocated" or alert.status != "firing":
                    continue
                if alert.fingerprint in self.fired or alert.subject.uuid is None:
                    continue
                node = alert.subject.node or ""
                self.fired[alert.fingerprint] = Fired(
                    alert.fingerprint, str(alert.subject.uuid), node, alert.ts
                )
                self.seen[alert.fingerprint] = now

    def _close(self) -> None:
        self._consumer.close()


class _FiringProbe(Poller):
    """Reads the fingerprints of Redis' firing alerts every 20 ms: first seen of each."""

    def __init__(self, url: str) -> None:
        super().__init__("firing-probe", 0.02)
        self._client = redis_client.connect(url, timeout_s=5)
        self._key = RedisKeys().alerts_firing()
        self.seen: dict[str, float] = {}

    def _poll(self) -> None:
        try:
            keys = self._client.hkeys(self._key)
        except redis_client.RedisError:
            return  # the next read tells
        now = time.time()
        for key in keys:
            self.seen.setdefault(key.decode() if isinstance(key, bytes) else str(key), now)

    def _close(self) -> None:
        self._client.close()


class AlertsQuery(Poller):
    """Asks Prometheus for the firing GpuIdleAllocated alerts every 100 ms: first seen per GPU."""

    def __init__(self, prometheus: PrivatePrometheus) -> None:
        super().__init__("alerts-query", 0.1)
        self._prometheus = prometheus
        self.seen: dict[str, float] = {}

    def _poll(self) -> None:
        data = self._prometheus.get("/api/v1/query", query=QUERY) or {}
        now = time.time()
        for row in data.get("result", ()):
            gpu = row.get("metric", {}).get("gpu")
            if gpu:
                self.seen.setdefault(gpu, now)

    def _close(self) -> None:
        pass


def _send(
    scoped: Settings, nodes: int, gpus: int, idle_after_s: int
) -> dict[str, list[tuple[int, float]]]:
    """Build a small fleet starting now and send its samples live: per node, each sample's
    (end ms, wall time handed to the client)."""
    t0_ms = int((time.time() + LEAD_S) * 1000) - 1000
    fleet = build_fleet(nodes, gpus, idle_after_s + AFTER_S, t0_ms, watch=0)
    prefix = scoped.kafka.topic_prefix
    asyncio.run(produce(scoped.kafka, K8S_PODS.full_name(prefix), fleet.pod_events))
    timed, ends = [], []
    for key, value in fleet.backlog:
        sample = NVML_SAMPLES.decode(value)
        end = sample.ts + sample.interval_ms
        timed.append((end / 1000, key, value))
        ends.append((key.decode(), end))
    sent_at = asyncio.run(send_live(scoped.kafka, NVML_SAMPLES.full_name(prefix), timed))
    sent: dict[str, list[tuple[int, float]]] = {}
    for (node, end), at in zip(ends, sent_at, strict=True):
        sent.setdefault(node, []).append((end, at))
    return sent


def bench_alerts(
    settings: Settings,
    redis_url: str,
    say: Say,
    *,
    nodes: int = NODES,
    gpus: int = 8,
    idle_after_s: int = IDLE_ALERT_AFTER_S,
) -> AlertResult:
    """Run the idle-alert part (see the module docstring); Redis at `redis_url` is flushed."""
    with scratch.space(settings, redis_url) as (scoped, home):
        worker = WorkerProcess(
            scoped, redis_url, home / "worker.log", GPUWATCH_IDLE_ALERT_AFTER_S=str(idle_after_s)
        )
        sink = SinkProcess(scoped, redis_url, home / "sink.log")
        prometheus = PrivatePrometheus(home, worker.metrics_port)
        try:
            with supervised([worker, sink]):
                running = (worker, sink, prometheus)
                return _measure(scoped, redis_url, say, running, (nodes, gpus, idle_after_s))
        finally:
            prometheus.stop()


def _measure(
    scoped: Settings,
    redis_url: str,
    say: Say,
    running: tuple[WorkerProcess, SinkProcess, PrivatePrometheus],
    shape: tuple[int, int, int],
) -> AlertResult:
    """Wait for the three, send the fleet live, note when each alert shows where."""
    worker, sink, prometheus = running
    nodes, gpus, idle_after_s = shape
    say("idle alerts: worker, Redis sink and a private Prometheus starting")
    offsets = Offsets(scoped)
    try:
        wait_ready(offsets, scoped, [worker], sink)
    finally:
        offsets.close()
    if not wait_for(prometheus.ready, [worker, sink], READY_S):
        raise RuntimeError(f"the bench's Prometheus had no rules or target in {READY_S:.0f} s")
    with (
        _AlertsReader(scoped) as topic,
        _FiringProbe(redis_url) as firing,
        AlertsQuery(prometheus) as query,
    ):
        say(f"idle alerts: {nodes} nodes sampled live, idle threshold {idle_after_s} s")
        sent = _send(scoped, nodes, gpus, idle_after_s)

        def shown() -> bool:
            gpus_seen = set(query.seen)
            return bool(topic.fired) and all(
                f in firing.seen and a.gpu in gpus_seen for f, a in topic.fired.items()
            )

        wait_for(shown, [worker, sink], SETTLE_S)
    fired = list(topic.fired.values())
    by_gpu = {a.gpu: a.fingerprint for a in fired}
    prom_seen = {by_gpu[gpu]: at for gpu, at in query.seen.items() if gpu in by_gpu}
    return alert_result(
        idle_after_s=idle_after_s,
        nodes=nodes,
        fired=fired,
        sent=sent,
        seen={"topic": topic.seen, "redis": firing.seen, "prometheus": prom_seen},
        prometheus_s=(SCRAPE_S, SCRAPE_S),
    )
