"""The stack's Kubernetes API server pieces that need no server: start order, what
`status` shows, the credentials and the command line."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatch.harness.stack import kube, manager
from gpuwatch.harness.stack.service import StackError


@dataclass
class Named:
    name: Any
    needs: tuple[str, ...] = ()


def test_a_service_starts_in_the_wave_after_those_it_needs() -> None:
    etcd, api, kafka = Named("etcd"), Named("kube-apiserver", ("etcd",)), Named("kafka")
    waves = manager._waves([api, kafka, etcd])  # type: ignore[list-item]
    assert [[d.name for d in wave] for wave in waves] == [["kafka", "etcd"], ["kube-apiserver"]]
    # What it needs is already running: nothing to wait for.
    assert [[d.name for d in w] for w in manager._waves([api])] == [["kube-apiserver"]]  # type: ignore[list-item]


def test_services_that_need_each_other_are_refused() -> None:
    a, b = Named("etcd", ("kube-apiserver",)), Named("kube-apiserver", ("etcd",))
    with pytest.raises(StackError, match="need each other"):
        manager._waves([a, b])  # type: ignore[list-item]


def test_credentials_are_made_once_and_kept_private(tmp_path: Path) -> None:
    credentials = kube.KubeCredentials(tmp_path / "kube-apiserver")
    credentials.ensure()
    token, key = credentials.admin_token, credentials.sa_key.read_bytes()
    credentials.ensure()
    assert (credentials.admin_token, credentials.sa_key.read_bytes()) == (token, key)
    assert (
        credentials.tokens.read_text()
        == f'{token},gpuwatch-admin,gpuwatch-admin,"system:masters"\n'
    )
    assert b"PRIVATE KEY" in key
    assert b"PUBLIC KEY" in credentials.sa_public.read_bytes()
    credentials.write_kubeconfig(16443)
    for private in (credentials.tokens, credentials.sa_key, credentials.kubeconfig):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    config = yaml.safe_load(credentials.kubeconfig.read_text())
    assert config["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:16443",
        "certificate-authority": str(credentials.ca),
    }
    assert config["users"][0]["user"] == {"token": token}


def test_the_command_line_is_a_cluster_s_api_server_on_loopback(tmp_path: Path) -> None:
    credentials = kube.KubeCredentials(tmp_path)
    line = kube.command(
        "/bin/kube-apiserver", etcd="http://127.0.0.1:12379", port=16443, credentials=credentials
    )
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in line[1:])
    assert flags["bind-address"] == "127.0.0.1"
    assert flags["authorization-mode"] == "RBAC"
    assert flags["token-auth-file"] == str(credentials.tokens)
    assert flags["service-account-signing-key-file"] == str(credentials.sa_key)
    assert flags["feature-gates"] == "WatchList=false"
    assert "watch-cache" not in flags  # on, as clusters run it
