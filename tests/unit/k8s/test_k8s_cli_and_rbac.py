"""`gpuwatch k8s-watcher`: its help, its flags over the settings, and the RBAC it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.kube import granted

from gpuwatch.cli.main import _overrides, build_parser
from gpuwatch.config import load_settings
from schemas.settings import WatcherSettings

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


def test_the_cluster_role_only_reads() -> None:
    assert granted() == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("apps", "replicasets", "get"),
        ("batch", "jobs", "get"),
        ("kueue.x-k8s.io", "workloads", "get"),
        ("kueue.x-k8s.io", "workloads", "list"),
        ("kueue.x-k8s.io", "workloads", "watch"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaimtemplates", "get"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
    }
