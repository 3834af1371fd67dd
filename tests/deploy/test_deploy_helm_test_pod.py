"""`helm test`: the chart's test pod, and the check it runs.

The pod is rendered and compared with the components it checks (the same image and
security contexts, the Redis sink's own Redis URL and CA); its script, the chart's
files/test-connection.py, is compiled, then run as the pod runs it (`python -c`) against
the worker's own /metrics server and a real redis-server written by the Redis sink's
own code, and against what a broken release would show.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import msgspec
import pytest
from deploy_chart import CHART, Object, helm_path, redis_server, render
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from support import free_port, run_command

from gpuwatch.harness.examples import example
from schemas.nvml_sample import NvmlSample
from schemas.settings import RedisSettings
from sinks.prometheus.collector import serve
from sinks.prometheus.metrics import WorkerMetrics
from sinks.redis.plan import gpu_live_states
from sinks.redis.sink import RedisSink

SCRIPT = CHART / "files" / "test-connection.py"
EXTERNAL_REDIS = (
    "--set", "redis.embedded.enabled=false",
    "--set", "redis.existingSecret.name=gpuwatch-redis",
    "--set", "redis.tls.caSecret.name=redis-ca",
)  # fmt: skip

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def of_component(objects: list[Object], kind: str, component: str) -> Object:
    (found,) = [
        o
        for o in objects
        if o["kind"] == kind and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def the_test_pod(objects: list[Object]) -> Object:
    return of_component(objects, "Pod", "test")


def env_of(container: Object) -> dict[str, Object]:
    return {e["name"]: e for e in container["env"]}


# --- the pod ----------------------------------------------------------------------------------


def test_the_test_pod_is_a_helm_test_hook_of_the_image_locked_down_as_the_worker(
    helm: str,
) -> None:
    objects = render(helm)
    pod = the_test_pod(objects)
    assert pod["metadata"]["annotations"] == {
        "helm.sh/hook": "test",
        "helm.sh/hook-delete-policy": "before-hook-creation",
    }
    worker = of_component(objects, "Deployment", "worker")["spec"]["template"]["spec"]
    (container,) = pod["spec"]["containers"]
    (worker_container,) = worker["containers"]
    assert container["image"] == worker_container["image"]
    assert container["securityContext"] == worker_container["securityContext"]
    assert pod["spec"]["securityContext"] == worker["securityContext"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["restartPolicy"] == "Never"
    # /tmp is the one writable path, as in every component.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}


def test_the_pod_reads_the_worker_services_metrics_port(helm: str) -> None:
    objects = render(helm, "--set", "worker.metricsPort=9999")
    service = of_component(objects, "Service", "worker")
    (port,) = service["spec"]["ports"]
    url = env_of(the_test_pod(objects)["spec"]["containers"][0])["METRICS_URL"]["value"]
    assert url == f"http://{service['metadata']['name']}:{port['port']}/metrics"
    assert port["port"] == 9999


@pytest.mark.parametrize("values", [(), EXTERNAL_REDIS], ids=["embedded", "external-tls"])
def test_the_pod_reaches_redis_as_the_redis_sink_does(helm: str, values: tuple[str, ...]) -> None:
    objects = render(helm, *values)
    sink = of_component(objects, "Deployment", "sink-redis")["spec"]["template"]["spec"]
    pod = the_test_pod(objects)["spec"]
    url = env_of(pod["containers"][0])["GPUWATCH_REDIS_URL"]
    assert url == env_of(sink["containers"][0])["GPUWATCH_REDIS_URL"]

    def ca(spec: Object) -> tuple[list[Object], list[Object]]:
        mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "redis-ca"]
        return mounts, [v for v in spec["volumes"] if v["name"] == "redis-ca"]

    assert ca(pod) == ca(sink)
    if values:
        assert url["valueFrom"]["secretKeyRef"] == {"name": "gpuwatch-redis", "key": "url"}
        assert ca(pod)[1][0]["secret"]["secretName"] == "redis-ca"


def test_without_the_redis_sink_the_pod_checks_the_worker_alone(helm: str) -> None:
    objects = render(helm, "--set", "sinkRedis.enabled=false")
    assert set(env_of(the_test_pod(objects)["spec"]["containers"][0])) == {"METRICS_URL", "WAIT_S"}


def test_a_narrowed_metrics_port_admits_the_test_pod_at_the_worker(helm: str) -> None:
    monitoring = '[{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]'
    objects = render(helm, "--set-json", f"networkPolicy.metricsFrom={monitoring}")
    pod = the_test_pod(objects)
    admit = of_component(objects, "NetworkPolicy", "test")
    worker = of_component(objects, "Deployment", "worker")
    assert admit["spec"]["podSelector"] == worker["spec"]["selector"]
    (rule,) = admit["spec"]["ingress"]
    (peer,) = rule["from"]
    assert pod["metadata"]["labels"].items() >= peer["podSelector"]["matchLabels"].items()
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    # A hook of the same test, made before the pod.
    assert admit["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert int(admit["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    # Open metrics ports need none.
    assert not [
        o
        for o in render(helm)
        if o["kind"] == "NetworkPolicy"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "test"
    ]


@pytest.mark.parametrize("kube", ["1.25.0", "1.34.0"])
def test_the_test_objects_validate_against_the_kubernetes_schemas(helm: str, kube: str) -> None:
    monitoring = '[{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]'
    objects = render(
        helm, "--kube-version", kube, *EXTERNAL_REDIS,
        "--set-json", f"networkPolicy.metricsFrom={monitoring}",
    )  # fmt: skip
    tests = [o for o in objects if o["metadata"]["labels"]["app.kubernetes.io/component"] == "test"]
    assert sorted(o["kind"] for o in tests) == ["NetworkPolicy", "Pod"]
    for o in tests:
        kubernetes_validate.validate(o, kube, strict=True)


def test_the_pod_runs_the_charts_script_and_it_compiles(helm: str) -> None:
    (container,) = the_test_pod(render(helm))["spec"]["containers"]
    python, flag, script = container["command"]
    assert (python, flag) == ("python", "-c")
    assert script == SCRIPT.read_text(encoding="utf-8")
    compile(script, str(SCRIPT), "exec")


# --- the script, run ----------------------------------------------------------------------------


@pytest.fixture
def worker_metrics_url() -> Iterator[str]:
    """The worker's own /metrics server, as a worker just started serves it (the families
    declared, no data yet)."""
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    yield from served(registry)


@pytest.fixture
def foreign_metrics_url() -> Iterator[str]:
    """A /metrics with no gpuwatch metric: another process behind the Service."""
    yield from served(CollectorRegistry())


def served(registry: CollectorRegistry) -> Iterator[str]:
    port = free_port()
    server, thread = serve(port, "127.0.0.1", registry)
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """An empty redis-server of this test alone (the one the local stack runs, on a port
    of its own)."""
    with redis_server(["--save", "", "--appendonly", "no", "--dir", str(tmp_path)]) as port:
        yield f"redis://127.0.0.1:{port}/0"


def written_by_the_sink(url: str) -> None:
    """The live GPUs of one node sample, written as `gpuwatch sink redis` writes them."""
    sample = msgspec.convert(example("gpuwatch.nvml.sample/v1"), NvmlSample)
    sink = RedisSink(RedisSettings(url=SecretStr(url)))
    try:
        sink.apply([], live=gpu_live_states(sample, {}))
    finally:
        sink.close()


def run_script(**env: str) -> subprocess.CompletedProcess[str]:
    """The chart's script as the pod runs it, with only the pod's variables set."""
    pod_env = {"PATH": os.environ["PATH"], "WAIT_S": "0"} | env
    return run_command(
        [sys.executable, "-c", SCRIPT.read_text(encoding="utf-8")], env=pod_env, timeout_s=60
    )


def test_it_passes_on_a_worker_serving_metrics_and_a_redis_the_sink_wrote(
    worker_metrics_url: str, redis_url: str
) -> None:
    written_by_the_sink(redis_url)
    done = run_script(METRICS_URL=worker_metrics_url, GPUWATCH_REDIS_URL=redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"ok worker metrics: {worker_metrics_url} serves ")
    assert lines[1] == "ok redis sink: Redis gpuwatch:gpus holds 1 GPUs"


def test_it_fails_while_the_sink_has_written_nothing(
    worker_metrics_url: str, redis_url: str
) -> None:
    done = run_script(METRICS_URL=worker_metrics_url, GPUWATCH_REDIS_URL=redis_url)
    assert done.returncode == 1
    assert done.stdout.splitlines()[1] == (
        "FAILED redis sink: Redis has no gpuwatch:gpus yet: no node sample reached the Redis sink"
    )


def test_it_fails_on_metrics_that_are_not_gpuwatchs(foreign_metrics_url: str) -> None:
    done = run_script(METRICS_URL=foreign_metrics_url)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"FAILED worker metrics: {foreign_metrics_url} serves no gpuwatch_ metric (0 others)",
        "skipped redis sink: the release has none",
    ]


def test_it_fails_on_what_it_cannot_reach_and_waits_for_it_first() -> None:
    """Nothing listens: both checks fail, after trying again until WAIT_S ran out."""
    metrics, redis = free_port(), free_port()
    started = time.monotonic()
    done = run_script(
        METRICS_URL=f"http://127.0.0.1:{metrics}/metrics",
        GPUWATCH_REDIS_URL=f"redis://127.0.0.1:{redis}/0",
        WAIT_S="2",
    )
    assert time.monotonic() - started >= 2
    assert done.returncode == 1
    worker_line, redis_line = done.stdout.splitlines()
    assert worker_line.startswith("FAILED worker metrics: URLError:"), worker_line
    assert "Connection refused" in worker_line
    assert redis_line.startswith("FAILED redis sink: ConnectionError:"), redis_line


def test_the_script_passes_the_linters() -> None:
    """It lives in the chart, outside the folders `make lint` checks."""
    ruff = Path(sys.executable).parent / "ruff"
    for argv in ([str(ruff), "check", str(SCRIPT)], [str(ruff), "format", "--check", str(SCRIPT)]):
        done = run_command(argv, timeout_s=60)
        assert done.returncode == 0, done.stdout + done.stderr
