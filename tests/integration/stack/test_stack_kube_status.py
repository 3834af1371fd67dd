"""`gpuwatch stack status` and the stack's Kubernetes API server."""

from __future__ import annotations

from pathlib import Path

from support.apiservers import stack_up

from gpuwatch.config import load_settings
from gpuwatch.harness.stack import kube, manager
from gpuwatch.harness.stack.service import StackPaths
from schemas.settings import Settings


def test_status_shows_the_api_server_only_when_the_stack_runs_it(tmp_path: Path) -> None:
    settings = load_settings({"GPUWATCH_STATE_DIR": str(tmp_path)})
    names = [s.name for s in manager.status(settings)]
    assert names == ["kafka", "redis", "prometheus"]
    kube_on = load_settings({"GPUWATCH_STATE_DIR": str(tmp_path), "GPUWATCH_STACK_KUBE": "true"})
    assert [s.name for s in manager.status(kube_on)][3:] == ["etcd", "kube-apiserver"]
    pid_file = StackPaths.of(tmp_path).pid_file("kube-apiserver")
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text("999999999\n")  # started by `stack up --kube`, now stale
    assert "kube-apiserver" in [s.name for s in manager.status(settings)]


def test_the_stack_s_api_server_answers_its_admin_as_kubernetes_1_34(kube_stack: Settings) -> None:
    from support.apiservers import LiveApiServer

    credentials = stack_up(kube_stack)
    states = {s.name: s.state for s in manager.status(kube_stack)}
    assert states["etcd"] == "up"
    assert states["kube-apiserver"] == "up"
    server = LiveApiServer(
        f"https://127.0.0.1:{kube_stack.stack.kube_port}",
        credentials.kubeconfig,
        kube.etcd_url(kube_stack),
    )
    try:
        version = server.request("GET", "/version")
        assert (version["major"], version["minor"]) == ("1", "34")
        assert version["gitVersion"] == kube.KUBE_VERSION
        groups = server.request("GET", "/apis/resource.k8s.io/v1")
        assert "resourceclaims" in {r["name"] for r in groups["resources"]}
    finally:
        server.close()


def test_an_isolated_api_server_starts_after_etcd_and_stops_before_it(tmp_path: Path) -> None:
    """A stack of its own: `up --kube` starts etcd, then the API server once etcd answers;
    `down` stops the API server first (it leaves its lease in etcd as it goes), so both
    stop on SIGTERM rather than being killed."""
    from support import free_ports

    kafka_port, controller, redis_port, prometheus_port, etcd, peer, api = free_ports(7)
    settings = load_settings(
        overrides={
            "stack.state_dir": tmp_path / "state",
            "stack.kafka_port": kafka_port,
            "stack.kafka_controller_port": controller,
            "stack.redis_port": redis_port,
            "stack.prometheus_port": prometheus_port,
            "stack.etcd_port": etcd,
            "stack.etcd_peer_port": peer,
            "stack.kube_port": api,
            "stack.ready_timeout_s": 60,
        }
    )
    messages: list[str] = []
    try:
        up = {s.name: s.state for s in manager.up(settings, messages.append, kube=True)}
        assert up["etcd"] == up["kube-apiserver"] == "up", messages
        started = [m.split()[1] for m in messages if m.startswith("starting ")]
        assert started.index("kube-apiserver") > started.index("etcd")
        answered = [m for m in messages if " is up on " in m]
        assert answered.index(next(m for m in answered if m.startswith("etcd"))) < answered.index(
            next(m for m in answered if m.startswith("kube-apiserver"))
        )
        assert kube.credentials(settings).kubeconfig.exists()
    finally:
        down = {s.name: s.detail for s in manager.down(settings)}
    assert down["kube-apiserver"].startswith("stopped"), down
    assert down["etcd"].startswith("stopped"), down
