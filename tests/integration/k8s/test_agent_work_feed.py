"""The node agent's units of work end to end, the real parts talking: its node's pods listed
from an API server (fieldSelector spec.nodeName), each opted-in pod's /metrics scraped over
HTTP by the scraper's thread, every record published to `work.units` in Kafka and the
increases handed to the next sample (`gpuwatch.run.agent.WorkUnitsFeed`)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from gpuwatch.run.agent import WorkUnitsFeed
from schemas.nvml_sample import PodWork
from schemas.settings import Settings
from schemas.topics import WORK_UNITS

STEPS = {"value": 0.0}


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = (
            "# TYPE train_steps counter\n"
            f'train_steps_total{{rank="0"}} {STEPS["value"]}\n'
            f'train_steps_total{{rank="1"}} {STEPS["value"]}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        return


@pytest.fixture
def metrics_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _pod(name: str, node: str, port: int, *, opted: bool = True) -> dict[str, Any]:
    pod = m.gpu_pod(name, "ml", created=time.time())
    if opted:
        pod["metadata"]["annotations"] = {
            "gpuwatch.io/work": "steps=train_steps_total",
            "gpuwatch.io/work-port": str(port),
        }
    pod["spec"]["nodeName"] = node
    pod["status"] |= {"phase": "Running", "podIP": "127.0.0.1"}
    return pod


def test_the_feed_scrapes_its_nodes_pods_and_publishes_their_steps(
    scoped: Settings,
    apiserver: FakeApiServer,
    kubeconfig: Path,
    metrics_port: int,
    consume: Callable[[Settings, str], list[Any]],
) -> None:
    apiserver.create("pods", _pod("train-0", "n1", metrics_port))
    apiserver.create("pods", _pod("elsewhere-0", "n2", metrics_port))  # another node's
    apiserver.create("pods", _pod("plain-0", "n1", metrics_port, opted=False))
    settings = scoped.model_copy(
        update={
            "agent": scoped.agent.model_copy(update={"work_interval_s": 1.0}),
            "watcher": scoped.watcher.model_copy(update={"kubeconfig": kubeconfig}),
        }
    )
    feed = WorkUnitsFeed(settings, "n1")
    got: list[PodWork] = []

    def steps() -> float:
        got.extend(feed())
        return sum(w.units.get("steps", 0.0) for w in got)

    feed.start()
    try:
        ok = feed.scraper.stats.outcomes
        wait_until(lambda: ok()["ok"] >= 1, what="the baseline scrape", timeout_s=10)
        STEPS["value"] = 150.0  # each of the two ranks: 300 steps since the baseline
        wait_until(lambda: steps() >= 300, what="300 steps", timeout_s=10)
    finally:
        feed.stop()
    (train,) = [p for p in apiserver.objects("pods") if p["metadata"]["name"] == "train-0"]
    assert {w.pod_uid for w in got} == {train["metadata"]["uid"]}  # n1's opted-in pod only
    assert steps() == 300.0
    topic = WORK_UNITS.full_name(settings.kafka.topic_prefix)
    records = [WORK_UNITS.decode(r.value) for r in consume(settings, topic)]
    assert {(r.pod, r.node) for r in records} == {("train-0", "n1")}
    assert sum(r.units["steps"] for r in records) == 300.0
    for before, after in itertools.pairwise(records):
        assert after.start == before.ts  # each scrape starts where the last one ended
