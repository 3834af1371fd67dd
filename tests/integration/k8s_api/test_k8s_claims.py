"""A DRA pod's GPU request, read by the watcher from its ResourceClaimTemplate or shared
ResourceClaim (resource.k8s.io/v1), on the test server and the real kube-apiserver 1.34."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any

from gpuwatch.harness.simulate.kube import manifests as m
from producers.base.kubeapi import ApiError
from producers.k8s.client import KubernetesApi
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import Backoff
from schemas import K8sPod
from schemas.settings import WatcherSettings

FAST = Backoff(base_s=0.01, cap_s=0.05, rng=random.Random(7))


def devices(device_class: str, count: int) -> dict[str, Any]:
    request = {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}
    return {"devices": {"requests": [request]}}


def claim_pod(name: str, source: dict[str, str]) -> dict[str, Any]:
    """A pod whose container uses one claim and asks for no extended resource."""
    pod = m.gpu_pod(name, "ml", created=time.time())
    container = pod["spec"]["containers"][0]
    container["resources"] = {"claims": [{"name": "gpus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", **source}]
    return pod


def test_a_dra_pods_gpu_request_comes_from_its_claims(apiserver: Any, kube: KubernetesApi,
                                                       wait: Any) -> None:  # fmt: skip
    template = {"metadata": {"name": "train-gpus", "namespace": "ml"},
                "spec": {"spec": devices("gpu.nvidia.com", 4)}}  # fmt: skip
    shared = {"metadata": {"name": "shared-gpu", "namespace": "ml"},
              "spec": devices("gpu.nvidia.com", 1)}  # fmt: skip
    apiserver.create("resourceclaimtemplates", template)
    apiserver.create("resourceclaims", shared)
    apiserver.create("pods", claim_pod("train-0", {"resourceClaimTemplateName": "train-gpus"}))
    apiserver.create("pods", claim_pod("infer-0", {"resourceClaimName": "shared-gpu"}))
    apiserver.create("pods", claim_pod("early-0", {"resourceClaimTemplateName": "not-yet"}))
    seen: list[K8sPod] = []
    lock = threading.Lock()

    def emit(value: K8sPod) -> None:
        with lock:
            seen.append(value)

    watcher = K8sWatcher(kube, WatcherSettings(), emit_pod=emit, emit_node=lambda _: None,
                         watch_timeout_s=30, backoff=FAST)  # fmt: skip
    watcher.start()
    try:
        wait(lambda: len(seen) == 3, "the three claim pods")
        requests = {p.name: dict(p.gpu_request) for p in seen}
        assert requests == {
            "train-0": {"gpu.nvidia.com": 4},
            "infer-0": {"gpu.nvidia.com": 1},
            "early-0": {},  # its template is not there (yet)
        }
        assert watcher.claims.stats.lookups == 3
    finally:
        watcher.stop()
        for resource, name in (("resourceclaimtemplates", "train-gpus"),
                               ("resourceclaims", "shared-gpu")):  # fmt: skip
            with contextlib.suppress(ApiError, KeyError):
                apiserver.delete(resource, "ml", name)
