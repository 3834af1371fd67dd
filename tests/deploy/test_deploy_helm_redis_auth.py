"""The embedded Redis bounded by maxmemory and behind a password, and every Redis client of
the chart given that password from its Secret: rendered with `helm template`, run as the
kubelet would run it (a real redis-server with the rendered args, the env expanded), and
installed then upgraded on the local stack's kube-apiserver (the password read back by
`lookup`, not made anew).
"""

from __future__ import annotations

import base64
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_deploy_helm as chart
import yaml
from deploy_chart import CHART, Object, redis_server, render, template
from support import run_command

from gpuwatch.config import load_settings
from gpuwatch.harness.stack import kube
from schemas.settings import Settings
from sinks.redis.client import RedisError, connect

pytestmark = pytest.mark.timeout(900)  # the first use may build helm

SECRET = "gw-gpuwatch-redis"  # "<fullname>-redis" of the release "gw"
EMBEDDED_URL = "redis://:$(REDIS_PASSWORD)@gw-gpuwatch-redis:6379/0"
EXPANSION = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# The fixtures of test_deploy_helm: the helm binary and the default rendering.
helm = chart.helm
default = chart.default


def component_of(obj: Object) -> str:
    label: str = obj["metadata"]["labels"]["app.kubernetes.io/component"]
    return label


def redis_container(objects: list[Object]) -> Object:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and component_of(o) == "redis"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    found: Object = container
    return found


def secrets(objects: list[Object]) -> dict[str, Object]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}


def pod_containers(objects: list[Object]) -> Iterator[tuple[str, Object]]:
    """Every container and first container of every pod template or pod, the test pod's too."""
    for obj in objects:
        spec = obj["spec"] if obj["kind"] == "Pod" else obj.get("spec", {}).get("template", {})
        spec = spec.get("spec", spec)
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            yield component_of(obj), container


def redis_clients(objects: list[Object]) -> dict[str, Object]:
    """The containers given GPUWATCH_REDIS_URL, by component."""
    return {
        component: container
        for component, container in pod_containers(objects)
        if any(e["name"] == "GPUWATCH_REDIS_URL" for e in container.get("env", []))
    }


def option(args: list[str], name: str) -> str:
    """The value after `name` in redis-server's args (given once)."""
    assert args.count(name) == 1, args
    return args[args.index(name) + 1]


def secret_ref(container: Object, variable: str) -> dict[str, str]:
    (entry,) = [e for e in container["env"] if e["name"] == variable]
    assert "value" not in entry
    ref: dict[str, str] = entry["valueFrom"]["secretKeyRef"]
    return ref


def password_of(objects: list[Object], name: str = SECRET) -> str:
    return base64.b64decode(secrets(objects)[name]["data"]["password"]).decode()


def expanded(container: Object, values: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: each secretKeyRef read from
    `values` (by secret name/key), each $(VAR) of a value replaced by a variable set before
    it."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = values[f"{ref['name']}/{ref['key']}"]
        else:
            env[entry["name"]] = EXPANSION.sub(
                lambda m: env.get(m.group(1), m.group(0)), entry["value"]
            )
    return env


def redis_bytes(size: str) -> int:
    """Bytes of a Redis memory size (redis.conf: 1k = 1000, 1kb = 1024)."""
    number, unit = re.fullmatch(r"(\d+)([a-z]*)", size.lower()).groups()  # type: ignore[union-attr]
    units = {"": 1, "k": 1000, "kb": 1024, "m": 10**6, "mb": 1 << 20, "g": 10**9, "gb": 1 << 30}
    return int(number) * units[unit]


def kube_bytes(quantity: str) -> int:
    """Bytes of a Kubernetes memory quantity in binary units (Mi, Gi)."""
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) << {"Mi": 20, "Gi": 30}[unit]


def expand_args(args: list[str], env: dict[str, str]) -> list[str]:
    return [EXPANSION.sub(lambda m: env.get(m.group(1), m.group(0)), arg) for arg in args]


# --- rendered -----------------------------------------------------------------------------


def test_the_embedded_redis_is_bounded_below_its_limit_and_refuses_writes_when_full(
    default: list[Object],
) -> None:
    container = redis_container(default)
    args = container["args"]
    assert option(args, "--maxmemory") == "768mb"
    assert option(args, "--maxmemory-policy") == "noeviction"
    # 75 % of the container's limit: the rest for client buffers and a snapshot's fork.
    limit = container["resources"]["limits"]["memory"]
    assert (redis_bytes(option(args, "--maxmemory")), kube_bytes(limit)) == (768 << 20, 1 << 30)


def test_the_memory_bound_and_policy_come_from_the_values(helm: str) -> None:
    objects = render(
        helm, "--set", "redis.embedded.maxmemory=3gb",
        "--set", "redis.embedded.maxmemoryPolicy=allkeys-lru",
        "--set", "redis.embedded.resources.limits.memory=4Gi",
    )  # fmt: skip
    args = redis_container(objects)["args"]
    assert (option(args, "--maxmemory"), option(args, "--maxmemory-policy")) == (
        "3gb",
        "allkeys-lru",
    )
    refused = template(helm, "--set", "redis.embedded.maxmemoryPolicy=evict-everything")
    assert refused.returncode == 1
    assert "maxmemoryPolicy" in refused.stderr


def test_the_embedded_redis_requires_the_password_of_the_charts_secret(
    default: list[Object],
) -> None:
    (secret,) = secrets(default).values()
    assert secret["metadata"]["name"] == SECRET
    assert secret["type"] == "Opaque"
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password_of(default))
    container = redis_container(default)
    assert option(container["args"], "--requirepass") == "$(REDIS_PASSWORD)"
    assert secret_ref(container, "REDIS_PASSWORD") == {"name": SECRET, "key": "password"}
    env = {e["name"]: e for e in container["env"]}
    assert list(env) == ["REDIS_PASSWORD", "REDISCLI_AUTH"]  # defined before it is used
    assert env["REDISCLI_AUTH"] == {"name": "REDISCLI_AUTH", "value": "$(REDIS_PASSWORD)"}
    # The probe passes no password on its command line (-a, -u): redis-cli reads REDISCLI_AUTH.
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert "redis-cli ping" in probe
    assert not re.search(r"\s-(a|u)\s|--pass|--user", probe)


def test_the_password_is_in_no_rendered_value_arg_or_url(helm: str) -> None:
    done = template(helm)
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    password = password_of(objects)
    assert password not in done.stdout  # the Secret holds it base64-encoded alone
    encoded = secrets(objects)[SECRET]["data"]["password"]
    assert done.stdout.count(encoded) == 1


def test_every_redis_client_takes_the_password_from_the_secret(default: list[Object]) -> None:
    clients = redis_clients(default)
    assert set(clients) == {"sink-redis", "test"}  # the Redis sink and the `helm test` pod
    for container in clients.values():
        names = [e["name"] for e in container["env"]]
        assert names.index("REDIS_PASSWORD") < names.index("GPUWATCH_REDIS_URL")
        assert secret_ref(container, "REDIS_PASSWORD") == {"name": SECRET, "key": "password"}
        (url,) = [e["value"] for e in container["env"] if e["name"] == "GPUWATCH_REDIS_URL"]
        assert url == EMBEDDED_URL


def test_as_the_kubelet_expands_it_the_url_is_the_password_the_settings_read(
    default: list[Object], tmp_path: Path
) -> None:
    password = password_of(default)
    for container in redis_clients(default).values():
        env = expanded(container, {f"{SECRET}/password": password})
        settings = load_settings(env={"HOME": str(tmp_path)} | env)
        url = settings.redis.url.get_secret_value()
        assert url == f"redis://:{password}@gw-gpuwatch-redis:6379/0"


def test_a_secret_of_ones_own_replaces_the_charts(helm: str) -> None:
    objects = render(
        helm, "--set", "redis.auth.existingSecret.name=mine",
        "--set", "redis.auth.existingSecret.key=pw",
    )  # fmt: skip
    assert secrets(objects) == {}
    container = redis_container(objects)
    assert secret_ref(container, "REDIS_PASSWORD") == {"name": "mine", "key": "pw"}
    assert option(container["args"], "--requirepass") == "$(REDIS_PASSWORD)"
    clients = redis_clients(objects)
    assert set(clients) == {"sink-redis", "test"}
    for client in clients.values():
        assert secret_ref(client, "REDIS_PASSWORD") == {"name": "mine", "key": "pw"}


def test_without_auth_the_embedded_redis_has_no_password_but_its_bound(helm: str) -> None:
    objects = render(helm, "--set", "redis.auth.enabled=false")
    assert secrets(objects) == {}
    container = redis_container(objects)
    assert "--requirepass" not in container["args"]
    assert "env" not in container
    assert option(container["args"], "--maxmemory") == "768mb"
    for client in redis_clients(objects).values():
        env = {e["name"]: e for e in client["env"]}
        assert "REDIS_PASSWORD" not in env
        assert env["GPUWATCH_REDIS_URL"]["value"] == "redis://gw-gpuwatch-redis:6379/0"


EXTERNAL = [
    "--set",
    "redis.embedded.enabled=false",
    "--set",
    "redis.url=rediss://cache.example:6380/2",
]


def test_an_external_redis_keeps_its_url_and_takes_a_password_from_a_secret(helm: str) -> None:
    plain = render(helm, *EXTERNAL)
    assert secrets(plain) == {}
    for client in redis_clients(plain).values():
        env = {e["name"]: e for e in client["env"]}
        assert "REDIS_PASSWORD" not in env
        assert env["GPUWATCH_REDIS_URL"]["value"] == "rediss://cache.example:6380/2"
    objects = render(helm, *EXTERNAL, "--set", "redis.auth.existingSecret.name=ext")
    assert secrets(objects) == {}
    clients = redis_clients(objects)
    assert set(clients) == {"sink-redis", "test"}
    for client in clients.values():
        assert secret_ref(client, "REDIS_PASSWORD") == {"name": "ext", "key": "password"}
        env = expanded(client, {"ext/password": "Pa55-word"})
        assert env["GPUWATCH_REDIS_URL"] == "rediss://:Pa55-word@cache.example:6380/2"


REFUSED = {
    "secret-without-auth": (
        ["--set", "redis.auth.enabled=false", "--set", "redis.auth.existingSecret.name=s"],
        "redis.auth.existingSecret needs redis.auth.enabled",
    ),
    "two-secrets": (
        [
            *EXTERNAL,
            "--set",
            "redis.existingSecret.name=u",
            "--set",
            "redis.auth.existingSecret.name=p",
        ],
        "redis.auth.existingSecret and redis.existingSecret: one or the other",
    ),
    "unix-url": (
        [
            "--set",
            "redis.embedded.enabled=false",
            "--set",
            "redis.url=unix:///run/redis.sock",
            "--set",
            "redis.auth.existingSecret.name=p",
        ],
        "for a unix:// URL put the whole URL in redis.existingSecret",
    ),
    "unknown-auth-key": (
        ["--set", "redis.auth.password=plain"],
        "additional properties 'password' not allowed",
    ),
}


@pytest.mark.parametrize(("setting", "message"), list(REFUSED.values()), ids=list(REFUSED))
def test_auth_values_that_cannot_work_are_refused(
    helm: str, setting: list[str], message: str
) -> None:
    done = template(helm, *setting)
    assert done.returncode == 1, done.stdout[:500]
    assert message in done.stderr


# --- run as the kubelet runs it -----------------------------------------------------------


@pytest.fixture
def rendered_redis(default: list[Object], tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """A redis-server of this test alone, started with the embedded Redis's rendered args
    (the kubelet's $(VAR) expansion done, --dir moved to tmp_path, a port of its own), and
    the container's expanded environment."""
    container = redis_container(default)
    env = expanded(container, {f"{SECRET}/password": password_of(default)})
    args = expand_args(container["args"], env)
    assert args[0] == "redis-server"
    args[args.index("--dir") + 1] = str(tmp_path)
    with redis_server(args[1:], password=env["REDIS_PASSWORD"]) as port:
        yield port, env


def redis_cli(port: int, *command: str, **env: str) -> str:
    binary = shutil.which("redis-cli")
    assert binary is not None
    done = run_command(
        [binary, "-p", str(port), *command], env={"PATH": "/usr/bin:/bin"} | env, timeout_s=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_rendered_redis_refuses_a_client_without_the_password_and_is_bounded(
    rendered_redis: tuple[int, dict[str, str]],
) -> None:
    port, env = rendered_redis
    anonymous = connect(f"redis://127.0.0.1:{port}/0", timeout_s=1, connect_timeout_s=1, retries=0)
    try:
        with pytest.raises(RedisError):
            anonymous.ping()
    finally:
        anonymous.close()
    # The readiness probe's command, as the pod runs it: ready with REDISCLI_AUTH alone.
    assert redis_cli(port, "ping", REDISCLI_AUTH=env["REDISCLI_AUTH"]) == "PONG"
    assert redis_cli(port, "ping").startswith("NOAUTH")  # what the probe's test rejects
    auth = {"REDISCLI_AUTH": env["REDISCLI_AUTH"]}
    assert redis_cli(port, "config", "get", "maxmemory", **auth).split() == [
        "maxmemory", str(768 << 20)
    ]  # fmt: skip
    assert redis_cli(port, "config", "get", "maxmemory-policy", **auth).split() == [
        "maxmemory-policy", "noeviction"
    ]  # fmt: skip


def test_the_readiness_probe_passes_only_with_the_password(
    default: list[Object], rendered_redis: tuple[int, dict[str, str]]
) -> None:
    port, env = rendered_redis
    command = redis_container(default)["readinessProbe"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"]
    script = command[2].replace("redis-cli", f"redis-cli -p {port}")
    base = {"PATH": "/usr/bin:/bin"}
    auth = {"REDISCLI_AUTH": env["REDISCLI_AUTH"]}
    with_auth = run_command(["sh", "-c", script], env=base | auth, timeout_s=30)
    without = run_command(["sh", "-c", script], env=base, timeout_s=30)
    assert (with_auth.returncode, without.returncode) == (0, 1)


# --- installed and upgraded on a real API server -----------------------------------------


def manifest_password(helm: str, kubeconfig: Path, release: str, revision: int) -> str:
    done = run_command(
        [helm, "get", "manifest", release, "-n", "gpuwatch", "--revision", str(revision),
         "--kubeconfig", str(kubeconfig)],
        timeout_s=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    objects: list[Any] = [d for d in yaml.safe_load_all(done.stdout) if d]
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret["metadata"]["name"] == f"{release}-gpuwatch-redis"
    password: str = secret["data"]["password"]
    return base64.b64decode(password).decode()


def test_an_upgrade_keeps_the_password_made_at_the_install(helm: str, kube_stack: Settings) -> None:
    """`helm install` then `helm upgrade` on the local stack's kube-apiserver (no pod runs:
    no kubelet), in the namespace the API-server tests share, as a release of its own."""
    kubeconfig = kube.admin_kubeconfig(kube_stack)
    release = f"gwt-{uuid.uuid4().hex[:8]}"
    base = [helm, "--kubeconfig", str(kubeconfig), "-n", "gpuwatch"]
    install = run_command([*base, "install", release, str(CHART), "--create-namespace"],
                          timeout_s=120)  # fmt: skip
    assert install.returncode == 0, install.stderr
    try:
        first = manifest_password(helm, kubeconfig, release, 1)
        upgrade = run_command([*base, "upgrade", release, str(CHART),
                               "--set", "logLevel=DEBUG"], timeout_s=120)  # fmt: skip
        assert upgrade.returncode == 0, upgrade.stderr
        assert manifest_password(helm, kubeconfig, release, 2) == first
        assert re.fullmatch(r"[A-Za-z0-9]{32}", first)
    finally:
        done = run_command([*base, "uninstall", release], timeout_s=120)
        assert done.returncode == 0, done.stderr
