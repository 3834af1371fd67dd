"""`gpuwatch k8s-watcher` as a cluster runs it: against the real kube-apiserver of the local
stack, with a kubeconfig of its own service account (deploy/rbac applied, a token from the
TokenRequest API, the server's CA), publishing to real Kafka."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import watcher_command
import yaml
from jsonschema import Draft202012Validator
from support import reaped
from support.apiservers import LiveApiServer
from support.kube import RBAC

from gpuwatch.harness.simulate.kube import manifests as m
from gpuwatch.harness.stack import kube as stack_kube
from schemas import K8S_PODS
from schemas.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def watcher_kubeconfig(real: LiveApiServer, kube_stack: Settings, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of the watcher's service account, bound to its ClusterRole."""
    documents = list(yaml.safe_load_all(RBAC.read_text("utf-8")))
    for document in documents:
        real.apply(document)
    account = next(d for d in documents if d["kind"] == "ServiceAccount")["metadata"]
    token = real.service_account_token(account["namespace"], account["name"])
    credentials = stack_kube.credentials(kube_stack)
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    yield credentials.kubeconfig_for(
        tmp_path / "watcher.kubeconfig", kube_stack.stack.kube_port, user, token
    )
    for path in (
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gpuwatch-k8s-watcher",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpuwatch-k8s-watcher",
        f"/api/v1/namespaces/{account['namespace']}/serviceaccounts/{account['name']}",
    ):
        real.request("DELETE", path)


def test_the_command_watches_the_real_server_as_its_service_account(
    *,
    scoped: Settings,
    real: LiveApiServer,
    watcher_kubeconfig: Path,
    free_port: Callable[[], int],
    consume: Callable[[Settings, str], list[Any]],
    validators: dict[str, Draft202012Validator],
    wait: Callable[..., None],
) -> None:
    real.install_kueue(scoped)  # its workloads are listed and watched too, with the same RBAC
    real.create(
        "pods", m.gpu_pod("p", "ml", created=time.time(), labels={"team": "vision", "secret": "x"})
    )
    real.create("pods", m.gpu_pod("q", "web", created=time.time()))
    metrics_port = free_port()
    process = watcher_command.start(watcher_kubeconfig, scoped, metrics_port)
    with reaped(process):
        first = 'gpuwatch_k8s_watcher_sent_total{topic="k8s.pods"} 1.0'
        wait(
            lambda: first in watcher_command.scrape(metrics_port),
            "the first list's pod acknowledged",
        )
        real.modify("pods", "ml", "p", lambda o: o["status"].update(phase="Running"))
        sent = 'gpuwatch_k8s_watcher_sent_total{topic="k8s.pods"} 2.0'
        wait(lambda: sent in watcher_command.scrape(metrics_port), "both pod messages acknowledged")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    # 1 pod + its change; a list of nodes, of pods, of Kueue's workloads and of ResourceSlices
    records = consume(scoped, K8S_PODS.full_name(scoped.kafka.topic_prefix))
    published = [(r.offset, json.loads(r.value)) for r in records]
    assert watcher_command.stopped(stderr) == ("2", "4", "2"), (stderr, published)
    for record in records:
        assert list(validators[K8S_PODS.name].iter_errors(json.loads(record.value))) == []
    values = [K8S_PODS.decode(r.value) for r in records]
    assert [(v.type, v.name, v.phase) for v in values] == [
        ("RESYNC", "p", "Pending"),
        ("MODIFIED", "p", "Running"),
    ]
    assert values[0].labels == {"team": "vision"}
    assert values[0].uid == (real.get("pods", "ml", "p") or {})["metadata"]["uid"]
