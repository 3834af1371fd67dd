"""The node agent's table of DRA devices read from the real kube-apiserver 1.34
(`resource.k8s.io/v1`), with ResourceSlices as the NVIDIA DRA driver writes them and the
agent's RBAC (deploy/rbac/node-agent.yaml) enforced by the real authorizer."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import dra
from support.apiservers import LiveApiServer

from producers.agent.slices import RESOURCE_SLICES_PATH, ResourceSliceDevices
from producers.base.dra import DraDevice
from producers.base.kubeapi import ApiError
from schemas.ids import GpuUuid

RBAC = Path(__file__).parents[3] / "deploy" / "rbac" / "node-agent.yaml"
NODE = "dra-node-1"
DRIVER = "gpu.nvidia.com"
GPU = [f"GPU-{i:08x}-aaaa-4bbb-8ccc-0123456789ab" for i in range(3)]
MIG = "MIG-4f0c2d9a-7b61-5e3a-9c8d-2b1a0f9e8d7c"
MIG_NAME = "gpu-2-mig-1g10gb-9-0"


def gpu(minor: int) -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": GPU[minor]},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "index": {"int": minor},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def mig() -> dict[str, Any]:
    return {
        "name": MIG_NAME,
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": MIG},
            "parentUUID": {"string": GPU[2]},
            "profile": {"string": "1g.10gb"},
        },
        "capacity": {"memory": {"value": "9984Mi"}},
    }


resource_slice = functools.partial(dra.resource_slice, node=NODE)


@pytest.fixture
def slices(real: LiveApiServer) -> Iterator[list[str]]:
    """Names of the slices a test creates; deleted afterwards with the agent's RBAC."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ApiError):
            real.request("DELETE", f"{RESOURCE_SLICES_PATH}/{name}")
    for path in (
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gpuwatch-node-agent",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpuwatch-node-agent",
        "/api/v1/namespaces/gpuwatch/serviceaccounts/gpuwatch-node-agent",
    ):
        with contextlib.suppress(ApiError):
            real.request("DELETE", path)


def agent_token(real: LiveApiServer, wait: Any, *, with_role: bool = True) -> str:
    """A token of the node agent's service account, its role bound or not (once the
    authorizer, which follows bindings through a cache, says so)."""
    for document in yaml.safe_load_all(RBAC.read_text("utf-8")):
        if with_role or document["kind"] == "ServiceAccount":
            real.apply(document)
    token = real.service_account_token("gpuwatch", "gpuwatch-node-agent")

    def allowed() -> bool:
        try:
            real.request("GET", f"{RESOURCE_SLICES_PATH}?limit=1", token=token)
        except ApiError as exc:
            if exc.status != 403:
                raise
            return False
        return True

    wait(lambda: allowed() == with_role, f"the authorizer to say allowed={with_role}")
    return token


def create(real: LiveApiServer, names: list[str], document: dict[str, Any]) -> None:
    real.apply(document)
    names.append(document["metadata"]["name"])


def key(name: str) -> tuple[str, str, str]:
    return (DRIVER, NODE, name)


def test_the_agent_reads_its_nodes_slices_with_its_own_rbac(
    real: LiveApiServer, slices: list[str], wait: Any
) -> None:
    token = agent_token(real, wait)
    create(real, slices, resource_slice("dra-node-1-gpu-g1", [gpu(0), gpu(1)]))
    create(real, slices, resource_slice("dra-node-2-gpu", [gpu(2)], node="dra-node-2"))
    create(
        real,
        slices,
        resource_slice(
            "dra-node-1-nic",
            [{"name": "eth1", "attributes": {"uuid": {"string": "nic-1"}}}],
            driver="nic.example.com",
        ),
    )
    clients: list[Any] = []

    def connect() -> Any:
        clients.append(real.client_as(token))
        return clients[-1]

    table = ResourceSliceDevices(connect, NODE, {DRIVER}, retry_s=0.0)
    try:
        found = table.find({key("gpu-0"), key("gpu-1"), key("gpu-2")})
        assert found == {
            key("gpu-0"): DraDevice(DRIVER, NODE, "gpu-0", GpuUuid(GPU[0])),
            key("gpu-1"): DraDevice(DRIVER, NODE, "gpu-1", GpuUuid(GPU[1])),
        }  # gpu-2 is another node's
        assert (table.loads, table.failures, len(clients)) == (1, 0, 1)

        # The driver republishes its pool with a MIG device: generation 2, then deletes
        # generation 1. A device not in the table makes the agent read again.
        create(real, slices, resource_slice("dra-node-1-gpu-g2", [gpu(0), mig()], generation=2))
        found = table.find({key(MIG_NAME), key("gpu-1")})
        assert found == {
            key(MIG_NAME): DraDevice(
                DRIVER, NODE, MIG_NAME, GpuUuid(MIG), "mig", "1g.10gb", GpuUuid(GPU[2])
            )
        }  # gpu-1 was only in generation 1, which is stale now
        assert table.loads == 2

        # What the role does not grant is refused.
        # Pods it may list (units of work), not get or watch; claims not at all.
        refused = (
            "/api/v1/namespaces/default/pods/any",
            "/api/v1/pods?watch=true",
            "/apis/resource.k8s.io/v1/resourceclaims",
        )
        for path in refused:
            with pytest.raises(ApiError) as denied:
                real.request("GET", path, token=token)
            assert denied.value.status == 403, path
    finally:
        for client in clients:
            client.close()


def test_a_forbidden_read_is_counted_warned_once_and_retried(
    real: LiveApiServer, slices: list[str], caplog: pytest.LogCaptureFixture, wait: Any
) -> None:
    caplog.set_level(logging.DEBUG, logger="producers.agent.slices")
    token = agent_token(real, wait, with_role=False)
    create(real, slices, resource_slice("dra-node-1-gpu-g1", [gpu(0)]))
    api = real.client_as(token)
    now = [0.0]
    table = ResourceSliceDevices(
        lambda: api, NODE, {DRIVER}, retry_s=10.0, monotonic=lambda: now[0]
    )
    try:
        assert table.find({key("gpu-0")}) == {}
        assert table.find({key("gpu-0")}) == {}  # within retry_s: not asked again
        assert table.failures == 1
        now[0] = 10.0
        assert table.find({key("gpu-0")}) == {}
        assert table.failures == 2
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "403" in warnings[0].getMessage()

        # The role is bound: the next retry reads the table.
        agent_token(real, wait)
        now[0] = 20.0
        assert table.find({key("gpu-0")}) == {
            key("gpu-0"): DraDevice(DRIVER, NODE, "gpu-0", GpuUuid(GPU[0]))
        }
        assert any("readable again" in r.getMessage() for r in caplog.records)
    finally:
        api.close()
