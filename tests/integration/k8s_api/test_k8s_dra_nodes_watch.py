"""A DRA node's GPUs in its k8s.nodes values, from the ResourceSlices of the real
kube-apiserver 1.34 (`resource.k8s.io/v1`), the watcher running as its own service
account (deploy/rbac/k8s-watcher.yaml: list and watch on resourceslices)."""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support import dra
from support.apiservers import LiveApiServer
from support.kube import RBAC

from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from producers.agent.slices import RESOURCE_SLICES_PATH
from producers.base.kubeapi import ApiError
from producers.k8s.client import KubernetesApi
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import Backoff
from schemas import K8sNode
from schemas.settings import WatcherSettings

FAST = Backoff(base_s=0.01, cap_s=0.05, rng=random.Random(11))
NODE = "dra-watched-0"
DRIVER = "gpu.nvidia.com"


class Nodes:
    """The node values the watcher published, from its threads."""

    def __init__(self) -> None:
        self.seen: list[K8sNode] = []
        self._lock = threading.Lock()

    def __call__(self, value: K8sNode) -> None:
        with self._lock:
            self.seen.append(value)

    def of(self, name: str) -> list[K8sNode]:
        with self._lock:
            return [n for n in self.seen if n.node == name]

    def allocatable(self, name: str) -> dict[str, int] | None:
        values = self.of(name)
        return dict(values[-1].gpu_allocatable) if values else None


def device(minor: int, profile: str | None = None) -> dict[str, Any]:
    """A GPU (or a MIG device of `profile`) as the NVIDIA DRA driver publishes it."""
    attributes: dict[str, Any] = {
        "type": {"string": "mig" if profile else "gpu"},
        "uuid": {"string": f"{'MIG' if profile else 'GPU'}-{minor:08x}-aaaa-4bbb-8ccc-0123"},
    }
    if profile:
        attributes["profile"] = {"string": profile}
        attributes["parentUUID"] = {"string": "GPU-00000003-aaaa-4bbb-8ccc-0123"}
    return {
        "name": f"gpu-{minor}" if not profile else f"gpu-3-mig-{minor}",
        "attributes": attributes,
    }


resource_slice = functools.partial(dra.resource_slice, node=NODE)


def dra_node() -> dict[str, Any]:
    """A node whose GPUs only the DRA driver hands out: no GPU resource, no GPU label."""
    node = m.gpu_node(NODE, created=time.time())
    for field in ("capacity", "allocatable"):
        del node["status"][field]["nvidia.com/gpu"]
    del node["metadata"]["labels"]["nvidia.com/gpu.present"]
    return node


@pytest.fixture
def slices(real: LiveApiServer) -> Iterator[list[str]]:
    """Names of the slices a test creates; deleted afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ApiError):
            real.request("DELETE", f"{RESOURCE_SLICES_PATH}/{name}")


def watcher_token(real: LiveApiServer, wait: Any) -> str:
    """A token of the watcher's service account, its role bound (once the authorizer,
    which follows bindings through a cache, says so)."""
    for document in yaml.safe_load_all(RBAC.read_text("utf-8")):
        real.apply(document)
    account = next(
        d for d in yaml.safe_load_all(RBAC.read_text("utf-8")) if d["kind"] == "ServiceAccount"
    )
    meta = account["metadata"]
    token = real.service_account_token(meta["namespace"], meta["name"])

    def allowed() -> bool:
        try:
            real.request("GET", f"{RESOURCE_SLICES_PATH}?limit=1", token=token)
        except ApiError as exc:
            if exc.status != 403:
                raise
            return False
        return True

    wait(allowed, "the authorizer to allow the watcher's list of ResourceSlices")
    return token


def test_a_dra_nodes_gpus_are_published_and_follow_its_slices(
    real: LiveApiServer, slices: list[str], wait: Any
) -> None:
    token = watcher_token(real, wait)
    real.create("nodes", dra_node())
    real.apply(resource_slice("dra-watched-0-gpu-g1", [device(i) for i in range(4)]))
    slices.append("dra-watched-0-gpu-g1")
    other = resource_slice("dra-watched-0-nic", [device(9)], driver="nic.example.com")
    real.apply(other)
    slices.append("dra-watched-0-nic")
    nodes = Nodes()
    api = real.client_as(token)
    watcher = K8sWatcher(
        api,
        WatcherSettings(),
        emit_pod=lambda _: None,
        emit_node=nodes,
        watch_timeout_s=30,
        backoff=FAST,
        dra_recheck_s=0.05,
    )
    watcher.start()
    try:
        wait(
            lambda: nodes.allocatable(NODE) == {"gpu.nvidia.com/gpu": 4},
            "the DRA node with its 4 GPUs",
            timeout_s=20,
        )
        first = nodes.of(NODE)[-1]
        assert first.gpu_capacity == {"gpu.nvidia.com/gpu": 4}
        assert first.type in ("ADDED", "RESYNC")
        assert watcher.dra is not None
        assert watcher.dra.version == "v1"

        # The driver republishes its pool: a new generation (one GPU split into MIG
        # devices) before the old one is deleted. The old slice no longer counts.
        before = int(time.time() * 1000)
        devices = [device(i) for i in range(3)] + [device(i, "1g.10gb") for i in range(2)]
        real.apply(resource_slice("dra-watched-0-gpu-g2", devices, generation=2))
        slices.append("dra-watched-0-gpu-g2")
        split = {"gpu.nvidia.com/gpu": 3, "gpu.nvidia.com/mig-1g.10gb": 2}
        wait(lambda: nodes.allocatable(NODE) == split, "the node with its new devices")
        again = nodes.of(NODE)[-1]
        assert again.type == "MODIFIED"
        assert again.gpu_capacity == split
        assert again.ts >= before
        published = len(nodes.of(NODE))
        real.request("DELETE", f"{RESOURCE_SLICES_PATH}/dra-watched-0-gpu-g1")
        real.request("DELETE", f"{RESOURCE_SLICES_PATH}/dra-watched-0-nic")
        # The stale generation and the other driver's slice gone: nothing to publish.
        # (Bookmarks show the watch has seen past both deletions.)
        slice_watch = next(w for w in watcher.watches if w.collection.resource == "resourceslices")
        wait(lambda: slice_watch.stats.tracked == 1, "the old slice forgotten")
        assert len(nodes.of(NODE)) == published
        real.request("DELETE", f"{RESOURCE_SLICES_PATH}/dra-watched-0-gpu-g2")
        wait(lambda: nodes.allocatable(NODE) == {}, "the node without DRA devices")
        assert all(not w.stats.api_errors for w in watcher.watches)
    finally:
        watcher.stop()
        api.close()


def test_without_resource_slices_served_it_is_said_once_and_looked_for_again(
    caplog: pytest.LogCaptureFixture, wait: Any
) -> None:
    caplog.set_level(logging.INFO, logger="producers.k8s.watcher")
    with FakeApiServer(bookmark_interval_s=0.1, dra=False) as server:  # no resource.k8s.io
        server.create("nodes", m.gpu_node("h100-0", created=time.time()))
        nodes = Nodes()
        api = KubernetesApi.for_host(server.url)
        watcher = K8sWatcher(
            api, WatcherSettings(), emit_pod=lambda _: None, emit_node=nodes, dra_recheck_s=0.05
        )
        watcher.start()
        try:
            assert watcher.dra is not None
            dra = watcher.dra
            wait(lambda: dra.checks >= 3, "three looks for ResourceSlices")
            absent = [r for r in caplog.records if "allocation not served" in r.getMessage()]
            assert len(absent) == 1
            assert watcher.synced
            assert nodes.allocatable("h100-0") == {"nvidia.com/gpu": 8}
            assert dra.version is None
        finally:
            watcher.stop()
            api.close()


def test_no_slice_is_watched_when_no_dra_driver_is_set() -> None:
    watcher = K8sWatcher(
        KubernetesApi.for_host("http://127.0.0.1:9"),
        WatcherSettings(dra_drivers=()),
        emit_pod=lambda _: None,
        emit_node=lambda _: None,
    )
    assert watcher.dra is None
