"""The node's opted-in pods listed from the test API server (its `fieldSelector`), and a
scrape of a pod found that way, end to end."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlencode

import pytest
from support.fake_apiserver import FakeApiServer

from gpuwatch.harness.simulate.kube.manifests import bound, gpu_pod, running
from gpuwatch.harness.simulate.kube.store import parse_field_selector
from producers.base.kubeapi import ApiError
from producers.k8s.client import KubernetesApi
from producers.work.scraper import WorkScraper
from producers.work.targets import (
    ANNOTATION,
    PATH_ANNOTATION,
    PODS_PATH,
    PORT_ANNOTATION,
    ApiTargets,
)

T0 = 1_764_412_320_000
AT = T0 / 1000
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval_s=None) as api:
        yield api


@pytest.fixture
def client(server: FakeApiServer) -> Iterator[KubernetesApi]:
    api = KubernetesApi.for_host(server.url)
    yield api
    api.close()


def pod(
    name: str,
    node: str | None,
    *,
    annotations: Mapping[str, str] | None = None,
    ip: str = "127.0.0.1",
    phase: str = "Running",
) -> dict[str, Any]:
    obj = gpu_pod(name, "ml", created=AT)
    if node is not None:
        obj = running(bound(obj, node, AT), AT)
        obj["status"]["podIP"] = ip
        obj["status"]["phase"] = phase
    obj["metadata"]["annotations"] = dict(annotations or {})
    return obj


def names(body: bytes) -> list[str]:
    return [i["metadata"]["name"] for i in json.loads(body)["items"]]


def test_the_test_server_lists_pods_by_field_selector(
    server: FakeApiServer, client: KubernetesApi
) -> None:
    server.create("pods", pod("a", "n1"))
    server.create("pods", pod("b", "n2"))
    server.create("pods", pod("c", "n1", phase="Succeeded"))
    server.create("pods", pod("queued", None))

    def listed(selector: str) -> list[str]:
        return names(client.call("GET", f"{PODS_PATH}?{urlencode({'fieldSelector': selector})}"))

    assert listed("spec.nodeName=n1") == ["a", "c"]
    assert listed("spec.nodeName==n2") == ["b"]
    assert listed("spec.nodeName=n1,status.phase!=Succeeded") == ["a"]
    assert listed("spec.nodeName=") == ["queued"]  # not scheduled: the field is ""
    assert listed("") == ["a", "b", "c", "queued"]
    with pytest.raises(ApiError) as bad:
        listed("spec.nodeName")
    assert bad.value.status == 400


def test_a_watch_by_field_selector_sees_pods_arrive_on_and_leave_the_node(
    server: FakeApiServer,
) -> None:
    server.create("pods", pod("queued", None))
    rv = server.resource_version
    server.modify("pods", "ml", "queued", lambda p: p["spec"].update(nodeName="n1"))
    server.create("pods", pod("elsewhere", "n2"))
    server.modify("pods", "ml", "queued", lambda p: p["spec"].update(nodeName="n3"))
    query = urlencode(
        {"watch": "true", "resourceVersion": rv, "fieldSelector": "spec.nodeName=n1",
         "timeoutSeconds": "1"}
    )  # fmt: skip
    with _NO_PROXY.open(f"{server.url}{PODS_PATH}?{query}", timeout=10) as stream:
        events = [json.loads(line) for line in stream.read().splitlines() if line.strip()]
    assert [(e["type"], e["object"]["spec"]["nodeName"]) for e in events] == [
        ("ADDED", "n1"),
        ("DELETED", "n3"),
    ]


def test_field_selector_terms() -> None:
    obj = {"spec": {"nodeName": "n1", "hostNetwork": True}, "status": {"phase": "Running"}}
    assert parse_field_selector("spec.hostNetwork=true")(obj)
    assert parse_field_selector("spec.nodeName = n1 , status.phase!=Failed")(obj)
    assert not parse_field_selector("status.podIP!=")(obj)
    assert parse_field_selector(None)(obj)
    with pytest.raises(ValueError, match="invalid field selector"):
        parse_field_selector("spec.nodeName in (a)")


OPTED = {ANNOTATION: "steps=train_steps_total", PORT_ANNOTATION: "8000"}


def test_api_targets_are_the_running_opted_in_pods_of_the_node(
    server: FakeApiServer, client: KubernetesApi
) -> None:
    server.create("pods", pod("a", "n1", annotations=OPTED, ip="10.0.0.1"))
    server.create("pods", pod("b", "n2", annotations=OPTED, ip="10.0.0.2"))  # another node
    server.create("pods", pod("c", "n1", ip="10.0.0.3"))  # not opted in
    server.create("pods", pod("d", "n1", annotations=OPTED, phase="Succeeded"))
    server.create("pods", pod("e", "n1", annotations={**OPTED, PORT_ANNOTATION: "x"}))
    now = [0.0]
    targets = ApiTargets(lambda: client, "n1", refresh_s=60.0, monotonic=lambda: now[0])
    found = targets.targets()
    assert [(t.pod, t.url, t.namespace) for t in found] == [
        ("a", "http://10.0.0.1:8000/metrics", "ml")
    ]
    assert found[0].uid == server.get("pods", "ml", "a")["metadata"]["uid"]  # type: ignore[index]
    assert targets.bad_annotations == 1
    listed = [r for r in server.requests if r.path == PODS_PATH]
    assert listed[-1].params["fieldSelector"] == "spec.nodeName=n1"

    server.create("pods", pod("f", "n1", annotations=OPTED, ip="10.0.0.6"))
    assert [t.pod for t in targets.targets()] == ["a"]  # cached
    now[0] = 60.0
    assert [t.pod for t in targets.targets()] == ["a", "f"]

    server.fail_next(1, status=503, resource="pods")
    now[0] = 120.0
    assert [t.pod for t in targets.targets()] == ["a", "f"]  # kept through the failure
    assert (targets.loads, targets.failures) == (2, 1)


class Counting(BaseHTTPRequestHandler):
    steps = 0

    def do_GET(self) -> None:
        Counting.steps += 25
        body = f"# TYPE train_steps counter\ntrain_steps_total {Counting.steps}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def test_a_pod_listed_from_the_api_is_scraped(server: FakeApiServer, client: KubernetesApi) -> None:
    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=endpoint.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        port = str(endpoint.server_address[1])
        annotations = {**OPTED, PORT_ANNOTATION: port, PATH_ANNOTATION: "/stats"}
        created = server.create("pods", pod("train-0", "n1", annotations=annotations))
        scraper = WorkScraper(
            ApiTargets(lambda: client, "n1"),
            node="n1",
            cluster="default",
            interval_s=15.0,
            timeout_s=2.0,
            max_bytes=1 << 20,
            max_series=100,
            clock_ms=lambda: T0,
        )
        try:
            assert scraper.scrape_once(T0) == []
            [record] = scraper.scrape_once(T0 + 15_000)
        finally:
            scraper.close()
    finally:
        endpoint.shutdown()
        endpoint.server_close()
        thread.join()
    assert record.uid == created["metadata"]["uid"]
    assert (record.namespace, record.pod, record.node) == ("ml", "train-0", "n1")
    assert (record.start, record.ts, record.units) == (T0, T0 + 15_000, {"steps": 25.0})
