"""The test API server speaks list/watch as the real one does, through the real client:
each test runs against both (conftest.py), so the real kube-apiserver keeps the test
server honest. What only the test server can do on cue (cut a connection, fail the next
request, expire open watches, keep a request log) is checked on it alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.fake_apiserver import FakeApiServer
from support.kube import controlled

from gpuwatch.harness.simulate.kube import manifests as m
from producers.base.kubeapi import ApiError, Collection, Disconnected, Expired
from producers.k8s.client import KubernetesApi

T0 = 1_741_079_551.0
PODS = Collection("pods")


def events(lines: Any, count: int) -> list[tuple[str, dict[str, Any]]]:
    """The next `count` events of an open watch, then close it."""
    out: list[tuple[str, dict[str, Any]]] = []
    iterator = iter(lines)
    try:
        for _ in range(count):
            event = json.loads(next(iterator))
            out.append((event["type"], event["object"]))
    finally:
        lines.close()
    return out


def changes(lines: Any, count: int) -> list[tuple[str, str]]:
    """(type, name) of the next `count` events that are not bookmarks."""
    out: list[tuple[str, str]] = []
    iterator = iter(lines)
    try:
        while len(out) < count:
            event = json.loads(next(iterator))
            if event["type"] != "BOOKMARK":
                out.append((event["type"], event["object"]["metadata"].get("name")))
    finally:
        lines.close()
    return out


def listed(kube: KubernetesApi, collection: Collection = PODS, **options: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        kube.list(collection, limit=options.get("limit", 0), continue_token=options.get("token"))
    )
    return body


def test_a_paginated_list_is_one_consistent_snapshot(
    apiserver: FakeApiServer, kube: KubernetesApi
) -> None:
    for i in range(5):
        apiserver.create("pods", m.gpu_pod(f"p{i}", created=T0))
    first = listed(kube, limit=2)
    apiserver.create("pods", m.gpu_pod("late", created=T0))
    apiserver.delete("pods", "default", "p4")
    names = [item["metadata"]["name"] for item in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = listed(kube, limit=2, token=token)
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += [item["metadata"]["name"] for item in page["items"]]
        token = page["metadata"].get("continue")
    assert names == ["p0", "p1", "p2", "p3", "p4"]
    assert first["kind"] == "PodList"
    assert "kind" not in first["items"][0]  # list items carry no kind, as in the real API


@pytest.mark.test_server_only(
    "the real server lists from its watch cache, which outlives etcd's compaction; "
    "test_k8s_real_apiserver.py expires a continue token on a server without it"
)
def test_an_expired_continue_token_is_410(apiserver: FakeApiServer, kube: KubernetesApi) -> None:
    for i in range(3):
        apiserver.create("pods", m.gpu_pod(f"p{i}", created=T0))
    token = listed(kube, limit=1)["metadata"]["continue"]
    apiserver.compact()
    with pytest.raises(Expired, match="continue parameter is too old"):
        listed(kube, limit=1, token=token)


def test_a_watch_replays_every_change_after_its_resource_version(
    apiserver: FakeApiServer, kube: KubernetesApi
) -> None:
    apiserver.create("pods", m.gpu_pod("before", created=T0))
    version = listed(kube)["metadata"]["resourceVersion"]
    created = apiserver.create("pods", m.gpu_pod("p", created=T0))
    apiserver.modify("pods", "default", "p", lambda o: o["status"].update(phase="Running"))
    deleted = apiserver.delete("pods", "default", "p")
    real = not isinstance(apiserver, FakeApiServer)
    # A real delete, even with a grace period of 0, first writes deletionTimestamp (a
    # MODIFIED), then removes the pod.
    got = events(kube.watch(PODS, resource_version=version, timeout_s=30), 4 if real else 3)
    assert [(t, o["metadata"]["name"]) for t, o in got] == [
        ("ADDED", "p"),
        ("MODIFIED", "p"),
        *([("MODIFIED", "p")] if real else []),
        ("DELETED", "p"),
    ]
    assert got[0][1]["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert got[1][1]["status"]["phase"] == "Running"
    assert got[0][1]["kind"] == "Pod"
    if real:
        return
    assert got[2][1]["metadata"]["resourceVersion"] == deleted["metadata"]["resourceVersion"]
    request = apiserver.requests[-1]
    assert request.watch
    assert request.params["resourceVersion"] == version
    assert request.params["allowWatchBookmarks"] == "true"
    assert request.params["timeoutSeconds"] == "30"


def test_bookmarks_carry_the_latest_version_past_what_the_watch_filters_out(
    apiserver: FakeApiServer, kube: KubernetesApi
) -> None:
    version = listed(kube)["metadata"]["resourceVersion"]
    node = apiserver.create("nodes", m.gpu_node("n1", created=T0))  # the pod watch skips it
    # The real server bookmarks 2 s before a watch's timeout (and every minute).
    lines = kube.watch(PODS, resource_version=version, timeout_s=4)
    iterator = iter(lines)
    try:
        event = json.loads(next(iterator))
    finally:
        lines.close()
    assert event["type"] == "BOOKMARK"
    # At least the node's version: a real server writes on its own too (its leases).
    carried = int(event["object"]["metadata"]["resourceVersion"])
    assert carried >= int(node["metadata"]["resourceVersion"]) > int(version)
    assert event["object"]["spec"] == {"containers": None}


@pytest.mark.test_server_only(
    "the real server watches from its watch cache, which outlives etcd's compaction; "
    "test_k8s_real_apiserver.py gets a 410 from a server without it"
)
def test_a_compacted_resource_version_is_410_in_the_stream_or_as_the_status(
    kube: KubernetesApi, apiserver: FakeApiServer
) -> None:
    version = listed(kube)["metadata"]["resourceVersion"]
    apiserver.create("pods", m.gpu_pod("p", created=T0))
    apiserver.compact()
    [(type_, status)] = events(kube.watch(PODS, resource_version=version, timeout_s=30), 1)
    assert type_ == "ERROR"
    assert (status["code"], status["reason"]) == (410, "Expired")
    apiserver.expired_as_status = True
    with pytest.raises(Expired, match="too old resource version"):
        kube.watch(PODS, resource_version=version, timeout_s=30)


@pytest.mark.test_server_only("no real server ends open watches with 410 on cue")
def test_expire_sends_410_on_open_watches(
    apiserver: FakeApiServer, kube: KubernetesApi, wait: Any
) -> None:
    lines = kube.watch(PODS, resource_version=apiserver.resource_version, timeout_s=30)
    wait(lambda: apiserver.open_watches("pods") == 1, "the watch to open")
    assert apiserver.expire_watches() == 1
    kinds = [json.loads(line)["type"] for line in lines]  # ends after the error
    assert kinds[-1] == "ERROR"


def test_a_label_selector_turns_leaving_and_entering_into_deleted_and_added(
    apiserver: FakeApiServer, kube: KubernetesApi
) -> None:
    selected = Collection("pods", label_selector="team=vision,tier notin (test)")
    apiserver.create("pods", m.gpu_pod("in", created=T0, labels={"team": "vision"}))
    apiserver.create("pods", m.gpu_pod("out", created=T0, labels={"team": "nlp"}))
    body = listed(kube, selected)
    assert [i["metadata"]["name"] for i in body["items"]] == ["in"]
    version = body["metadata"]["resourceVersion"]
    apiserver.modify("pods", "default", "in", lambda o: o["metadata"]["labels"].update(tier="test"))
    apiserver.modify(
        "pods", "default", "out", lambda o: o["metadata"]["labels"].update(team="vision")
    )
    apiserver.modify("pods", "default", "out", lambda o: o["status"].update(phase="Running"))
    lines = kube.watch(selected, resource_version=version, timeout_s=30)
    assert changes(lines, 3) == [("DELETED", "in"), ("ADDED", "out"), ("MODIFIED", "out")]


def test_a_namespaced_watch_sees_its_namespace_only(
    apiserver: FakeApiServer, kube: KubernetesApi
) -> None:
    version = apiserver.resource_version
    apiserver.create("pods", m.gpu_pod("a", "ml", created=T0))
    apiserver.create("pods", m.gpu_pod("b", "web", created=T0))
    apiserver.create("pods", m.gpu_pod("c", "ml", created=T0))
    lines = kube.watch(Collection("pods", "ml"), resource_version=version, timeout_s=30)
    assert changes(lines, 2) == [("ADDED", "a"), ("ADDED", "c")]
    if isinstance(apiserver, FakeApiServer):
        assert apiserver.requests[-1].path == "/api/v1/namespaces/ml/pods"


def test_the_server_timeout_ends_the_stream_cleanly(
    apiserver: FakeApiServer, kube: KubernetesApi
) -> None:
    lines = kube.watch(
        Collection("nodes"), resource_version=apiserver.resource_version, timeout_s=1
    )
    assert {json.loads(line)["type"] for line in lines} <= {"BOOKMARK"}  # ends, no error
    lines.close()


@pytest.mark.test_server_only("cutting a connection mid-stream needs the server's own socket")
def test_a_dropped_watch_raises_disconnected(
    apiserver: FakeApiServer, kube: KubernetesApi, wait: Any
) -> None:
    lines = kube.watch(PODS, resource_version=apiserver.resource_version, timeout_s=30)
    wait(lambda: apiserver.open_watches() == 1, "the watch to open")
    apiserver.drop_watches()
    with pytest.raises(Disconnected, match="broke off"):
        for _ in lines:
            pass
    lines.close()


def test_a_watch_from_zero_starts_with_the_current_objects(
    apiserver: FakeApiServer, kube: KubernetesApi
) -> None:
    apiserver.create("pods", m.gpu_pod("a", created=T0))
    lines = kube.watch(PODS, resource_version="0", timeout_s=30)
    assert changes(lines, 1) == [("ADDED", "a")]


@pytest.mark.test_server_only("failing the next request on cue is the test server's own")
def test_injected_failures_are_http_errors(apiserver: FakeApiServer, kube: KubernetesApi) -> None:
    apiserver.fail_next(1, status=503)
    with pytest.raises(ApiError) as failed:
        listed(kube)
    assert failed.value.status == 503
    assert listed(kube)["kind"] == "PodList"  # the next one answers


def test_owners_are_read_by_name(apiserver: FakeApiServer, kube: KubernetesApi) -> None:
    apiserver.create("replicasets", controlled("web-7d9c", ("apps/v1", "Deployment", "web"), "d1"))
    body = kube.get_controller("ReplicaSet", "ml", "web-7d9c")
    assert body is not None
    assert json.loads(body)["metadata"]["ownerReferences"][0]["name"] == "web"
    assert kube.get_controller("Job", "ml", "nope") is None
    if isinstance(apiserver, FakeApiServer):
        assert apiserver.requests[-1].path == "/apis/batch/v1/namespaces/ml/jobs/nope"


def test_closing_the_server_ends_open_watches(kube: KubernetesApi, wait: Any) -> None:
    server = FakeApiServer().start()
    api = KubernetesApi.for_host(server.url)
    try:
        lines = api.watch(PODS, resource_version=server.resource_version, timeout_s=30)
        wait(lambda: server.open_watches() == 1, "the watch to open")
    finally:
        server.close()
    with pytest.raises(Disconnected):
        for _ in lines:
            pass
    lines.close()
    api.close()
