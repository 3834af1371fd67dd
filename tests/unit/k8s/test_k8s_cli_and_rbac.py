"""`gpuwatch k8s-watcher`: its help, its flags over the settings, and the RBAC it needs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatch.cli.main import _overrides, build_parser
from gpuwatch.config import load_settings
from producers.k8s.client import KubernetesApi
from producers.k8s.watcher import K8sWatcher
from producers.simulate.kube import manifests as m
from producers.simulate.kube.apiserver import FakeApiServer
from schemas.settings import WatcherSettings

RBAC = Path(__file__).parents[3] / "deploy" / "rbac" / "k8s-watcher.yaml"
GPUWATCH = Path(sys.executable).with_name("gpuwatch")


def test_help_documents_selectors_label_allow_list_and_resource_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["k8s-watcher", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in [
        "--namespace NS",
        "repeat for several",
        "all namespaces",
        "--selector SELECTOR",
        "label selector",
        "'team=vision,tier!=test'",
        "--label KEY",
        "allow-list",
        "never all labels",
        "team, project",
        "--gpu-resource NAME",
        "nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*",
        "a trailing * makes it a prefix",
        "--kubeconfig FILE",
        "in-cluster",
        "--context NAME",
        "--metrics-port PORT",
        "9482",
        "410 Gone",
        "RESYNC",
        "deploy/rbac/k8s-watcher.yaml",
    ]:
        assert phrase in text, phrase


def test_flags_override_the_watcher_settings() -> None:
    args = build_parser().parse_args(
        [
            "k8s-watcher",
            "--kubeconfig",
            "/etc/kc",
            "--context",
            "prod",
            "--namespace",
            "ml",
            "--namespace",
            "research",
            "--selector",
            "team in (a,b)",
            "--gpu-resource",
            "amd.com/gpu",
            "--gpu-resource",
            "nvidia.com/mig-*",
            "--label",
            "team",
            "--label",
            "cost-center",
            "--metrics-port",
            "9999",
        ]
    )
    settings = load_settings(env={"HOME": "/tmp"}, overrides=_overrides(args))
    watcher = settings.watcher
    assert watcher.kubeconfig == Path("/etc/kc")
    assert watcher.context == "prod"
    assert watcher.namespaces == ("ml", "research")
    assert watcher.label_selector == "team in (a,b)"
    assert (watcher.gpu_resources, watcher.gpu_resource_prefixes) == (
        ("amd.com/gpu",),
        ("nvidia.com/mig-",),
    )
    assert watcher.pod_label_allowlist == ("team", "cost-center")
    assert watcher.metrics_port == 9999
    assert settings.agent.metrics_port == 9481  # the node agent's flag of the same name is apart


def test_without_flags_the_settings_stand() -> None:
    args = build_parser().parse_args(["k8s-watcher"])
    env = {
        "HOME": "/tmp",
        "GPUWATCH_WATCH_NAMESPACES": "a,b",
        "GPUWATCH_POD_LABEL_ALLOWLIST": "team",
    }
    watcher = load_settings(env=env, overrides=_overrides(args)).watcher
    assert watcher.namespaces == ("a", "b")
    assert watcher.pod_label_allowlist == ("team",)
    assert watcher.gpu_resources == WatcherSettings().gpu_resources


def test_a_missing_kubeconfig_is_a_one_line_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "GPUWATCH_"))}
    result = subprocess.run(
        [str(GPUWATCH), "k8s-watcher", "--kubeconfig", str(tmp_path / "absent"), "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 1
    assert "no usable Kubernetes configuration" in result.stderr
    assert "Traceback" not in result.stderr


def rules() -> list[dict[str, Any]]:
    documents = list(yaml.safe_load_all(RBAC.read_text(encoding="utf-8")))
    by_kind = {d["kind"]: d for d in documents}
    account, role, binding = (
        by_kind["ServiceAccount"],
        by_kind["ClusterRole"],
        by_kind["ClusterRoleBinding"],
    )
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    found: list[dict[str, Any]] = role["rules"]
    return found


def test_the_cluster_role_only_reads() -> None:
    granted = {
        (g, r, v)
        for rule in rules()
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("apps", "replicasets", "get"),
        ("batch", "jobs", "get"),
    }


def test_every_request_the_watcher_makes_is_granted(wait: Any) -> None:
    granted = {
        (g, r, v)
        for rule in rules()
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    groups = {"/api/v1": "", "/apis/apps/v1": "apps", "/apis/batch/v1": "batch"}
    with FakeApiServer(bookmark_interval_s=0.1) as server:
        server.create(
            "pods", m.gpu_pod("w", "ml", created=time.time(), owner=("ReplicaSet", "web-1"))
        )
        server.create("pods", m.gpu_pod("j", "ml", created=time.time(), owner=("Job", "train")))
        api = KubernetesApi.for_host(server.url)
        watcher = K8sWatcher(
            api,
            WatcherSettings(namespaces=("ml",)),
            emit_pod=lambda _: None,
            emit_node=lambda _: None,
        )
        watcher.start()
        try:
            wait(lambda: watcher.synced and server.open_watches() == 2, "the watches")
        finally:
            watcher.stop()
            api.close()
    used = set()
    for request in server.requests:
        prefix = next(p for p in groups if request.path.startswith(p + "/"))
        parts = request.path[len(prefix) + 1 :].split("/")
        if parts[0] == "namespaces":
            parts = parts[2:]
        verb = "watch" if request.watch else ("get" if len(parts) > 1 else "list")
        used.add((groups[prefix], parts[0], verb))
    assert used == {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("apps", "replicasets", "get"),
        ("batch", "jobs", "get"),
    }
    assert used <= granted
