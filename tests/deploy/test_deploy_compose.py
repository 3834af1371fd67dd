"""docker-compose.yml, checked offline: there is no Docker engine here.

The installed docker client has no compose plugin (`docker compose version` fails), so
`docker compose config` cannot run; the file is validated against the Compose
Specification's JSON schema (the copy vendored by check-jsonschema) and then by meaning:
references resolve, images are pinned, ports stay on 127.0.0.1, the gpuwatch containers
are locked down, their commands parse and their settings load with gpuwatch's own code,
and Prometheus, Alertmanager and Grafana get configuration files that their own checkers
accept. Where the plugin exists, `docker compose config` runs as well.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import run_command

from gpuwatch.cli import build_parser
from gpuwatch.config import load_settings
from schemas.settings import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")
GPUWATCH = {
    "topics", "worker", "sink-redis", "sink-metrics", "node-agent-sim", "simulate", "node-agent",
    "k8s-watcher",
}  # fmt: skip
ONE_SHOT = {"topics", "simulate"}

Service = dict[str, Any]


def load() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return spec


def services() -> dict[str, Service]:
    found: dict[str, Service] = load()["services"]
    return found


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's `${NAME}` and `${NAME:-default}`, innermost first, with `env` (default: {})."""
    env = env or {}
    pattern = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^${}]*))?\}")
    while True:
        replaced = pattern.sub(lambda m: env.get(m.group(1)) or m.group(2) or "", text)
        if replaced == text:
            return text
        text = replaced


def schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    return run_command(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)], timeout_s=60
    )


def test_the_file_validates_against_the_compose_specification() -> None:
    done = schema_check(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validation done" in done.stdout


def test_the_schema_check_rejects_a_misspelt_key(tmp_path: Path) -> None:
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(
        COMPOSE.read_text(encoding="utf-8").replace("    image: redis:", "    imagee: redis:"),
        encoding="utf-8",
    )
    done = schema_check(bad)
    assert done.returncode == 1
    assert "'imagee' does not match" in done.stdout


def test_docker_compose_config_where_the_plugin_exists() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client")
    probe = run_command([docker, "compose", "version"], timeout_s=30)
    if probe.returncode != 0:
        pytest.skip("the docker client has no compose plugin")
    done = run_command(
        [docker, "compose", "-f", str(COMPOSE), "--profile", "*", "config", "--quiet"], timeout_s=60
    )
    assert done.returncode == 0, done.stderr


def test_the_services_and_profiles() -> None:
    found = {name: tuple(s.get("profiles", ())) for name, s in services().items()}
    assert found == {
        "kafka": (), "redis": (), "topics": (), "worker": (), "sink-redis": (),
        "sink-metrics": (), "prometheus": (), "alertmanager": (), "grafana": (),
        "node-agent-sim": ("sim",),
        "simulate": ("simulate",), "node-agent": ("gpu",), "k8s-watcher": ("k8s",),
    }  # fmt: skip


def test_references_resolve_and_start_in_order() -> None:
    spec = load()
    named = set(spec["volumes"])
    for name, service in spec["services"].items():
        for dependency, how in service.get("depends_on", {}).items():
            assert dependency in spec["services"], (name, dependency)
            target = spec["services"][dependency]
            if how["condition"] == "service_healthy":
                assert "healthcheck" in target, (name, dependency)
            else:
                assert how["condition"] == "service_completed_successfully"
                assert dependency in ONE_SHOT
        for volume in service.get("volumes", []):
            source = interpolate(volume, {"HOME": "/home/u"}).split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), (name, source)
            elif not source.startswith("/"):
                assert source in named, (name, source)
    order = {n: set(s.get("depends_on", {})) for n, s in spec["services"].items()}
    assert order["topics"] == {"kafka"}
    assert order["worker"] == {"topics"}  # no Redis: the sink writes it
    assert order["sink-redis"] == {"topics", "redis"}
    assert order["sink-metrics"] == {"topics"}  # Kafka only
    for producer in ("node-agent-sim", "simulate", "node-agent", "k8s-watcher"):
        assert order[producer] == {"topics"}


def test_images_are_pinned_and_ports_stay_on_loopback() -> None:
    for name, service in services().items():
        image = interpolate(service["image"])
        repository, _, tag = image.rpartition(":")
        assert repository, (name, image)
        assert re.fullmatch(r"v?\d+(\.\d+)+(-alpine)?", tag), (name, image)
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    assert interpolate(services()["worker"]["image"]) == "gpuwatch:0.1.0"


def test_long_running_services_have_health_checks() -> None:
    for name, service in services().items():
        if name not in ONE_SHOT:
            assert service["healthcheck"]["test"], name
            assert service["restart"] == "unless-stopped", name
        else:
            assert service["restart"] == "no", name


def test_gpuwatch_containers_are_locked_down_and_built_from_the_dockerfile() -> None:
    for name in GPUWATCH:
        service = services()[name]
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "cap_add" not in service, name
        assert "privileged" not in service, name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert service["tmpfs"] == ["/tmp:size=256m"], name
        assert service["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        assert "user" not in service or name == "k8s-watcher"  # the image's uid 10001
        assert "ports" not in service, name  # scraped inside the compose network
    assert interpolate(services()["k8s-watcher"]["user"]) == "10001"
    assert (ROOT / "Dockerfile").is_file()


def test_commands_parse_with_the_gpuwatch_command_line() -> None:
    verbs = {}
    for name in GPUWATCH:
        args = build_parser().parse_args(services()[name]["command"])
        verbs[name] = (args.verb, getattr(args, "action", None) or getattr(args, "backend", None))
    assert verbs == {
        "topics": ("topics", "create"),
        "worker": ("worker", None),
        "sink-redis": ("sink", "redis"),
        "sink-metrics": ("sink", "metrics"),
        "node-agent-sim": ("node-agent", "sim"),
        "node-agent": ("node-agent", "nvml"),
        "simulate": ("simulate", None),
        "k8s-watcher": ("k8s-watcher", None),
    }


def test_settings_are_known_and_load(tmp_path: Path) -> None:
    for name in GPUWATCH:
        env = {k: interpolate(str(v)) for k, v in services()[name]["environment"].items()}
        assert set(env) <= set(ENV_VARS), (name, set(env) - set(ENV_VARS))
        settings = load_settings(env={"HOME": str(tmp_path)} | env)
        assert settings.kafka.bootstrap == "kafka:19092"
        assert settings.metrics.bind == "0.0.0.0"
        redis = settings.redis.url.get_secret_value()
        assert (redis == "redis://redis:6379/0") is (name == "sink-redis"), name
    node = load_settings(env={"HOME": "/tmp"} | {
        k: interpolate(str(v)) for k, v in services()["node-agent"]["environment"].items()
    })  # fmt: skip
    assert node.agent.node_name == "workstation"


def test_kafka_advertises_one_address_to_containers_and_one_to_the_host() -> None:
    kafka = services()["kafka"]["environment"]
    advertised = dict(item.split("://") for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert advertised == {"INTERNAL": "kafka:19092", "HOST": "127.0.0.1:9092"}
    assert services()["kafka"]["ports"] == ["127.0.0.1:9092:9092"]
    bootstrap = services()["worker"]["environment"]["GPUWATCH_KAFKA_BOOTSTRAP"]
    assert bootstrap == advertised["INTERNAL"]


def mounted(service: str, path_in_container: str) -> Path:
    """The repository file or folder a service mounts at (or above) a container path."""
    for volume in services()[service]["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("./") and (
            path_in_container == target or path_in_container.startswith(target + "/")
        ):
            return ROOT / source / path_in_container[len(target) :].lstrip("/")
    raise AssertionError(f"{service} mounts nothing at {path_in_container}")


def test_prometheus_gets_a_config_promtool_accepts_with_the_jobs_of_the_local_stack() -> None:
    command = services()["prometheus"]["command"]
    flag = next(c for c in command if c.startswith("--config.file="))
    config_path = mounted("prometheus", flag.split("=", 1)[1])
    done = run_command(["promtool", "check", "config", str(config_path)], timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    local = yaml.safe_load((config_path.parent / "prometheus.yml").read_text(encoding="utf-8"))
    assert [j["job_name"] for j in config["scrape_configs"]] == [
        j["job_name"] for j in local["scrape_configs"]
    ]
    assert config["rule_files"] == local["rule_files"]
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["alertmanager:9093"]


def test_prometheus_finds_each_gpuwatch_service_on_its_metrics_port() -> None:
    config = yaml.safe_load(mounted("prometheus", "/etc/prometheus/gpuwatch").joinpath(
        "prometheus-compose.yml").read_text(encoding="utf-8"))  # fmt: skip
    sd = {
        job["job_name"]: (job["dns_sd_configs"][0]["names"], job["dns_sd_configs"][0]["port"])
        for job in config["scrape_configs"]
        if "dns_sd_configs" in job
    }
    port_var = {
        "worker": "GPUWATCH_METRICS_PORT",
        "sink-redis": "GPUWATCH_SINK_METRICS_PORT",
        "sink-metrics": "GPUWATCH_SINK_EXPORTER_PORT",
        "node-agent-sim": "GPUWATCH_AGENT_METRICS_PORT",
        "node-agent": "GPUWATCH_AGENT_METRICS_PORT",
        "k8s-watcher": "GPUWATCH_WATCHER_METRICS_PORT",
    }
    found = {}
    for name, var in port_var.items():
        service = services()[name]
        aliases = service.get("networks", {}).get("default", {}).get("aliases", [])
        port = int(service["environment"][var])
        assert str(port) in " ".join(service["healthcheck"]["test"])
        for job, (names, sd_port) in sd.items():
            if {name, *aliases} & set(names):
                assert sd_port == port, (name, job)
                found[name] = job
    assert found == {
        "worker": "gpuwatch-worker",
        "sink-redis": "gpuwatch-sink",
        "sink-metrics": "gpuwatch-sink-metrics",
        "node-agent-sim": "gpuwatch-node-agent",
        "node-agent": "gpuwatch-node-agent",
        "k8s-watcher": "gpuwatch-k8s-watcher",
    }


def test_alertmanager_gets_a_config_amtool_accepts() -> None:
    command = services()["alertmanager"]["command"]
    flag = next(c for c in command if c.startswith("--config.file="))
    done = run_command(
        ["amtool", "check-config", str(mounted("alertmanager", flag.split("=", 1)[1]))],
        timeout_s=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_provisions_the_dashboards_it_mounts() -> None:
    env = services()["grafana"]["environment"]
    home = mounted("grafana", env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home.is_file()
    provider_dir = mounted("grafana", "/etc/grafana/provisioning/dashboards")
    (provider,) = yaml.safe_load((provider_dir / "gpuwatch.yml").read_text("utf-8"))["providers"]
    boards = mounted("grafana", provider["options"]["path"])
    assert sorted(p.name for p in boards.glob("*.json")) == [
        "gpuwatch-alerts.json", "gpuwatch-fleet.json", "gpuwatch-pipeline.json",
        "gpuwatch-pod.json", "gpuwatch-queue.json",
    ]  # fmt: skip
    sources = mounted("grafana", "/etc/grafana/provisioning/datasources")
    (source,) = yaml.safe_load((sources / "prometheus.yml").read_text("utf-8"))["datasources"]
    assert source["url"] == "http://prometheus:9090"
    assert "prometheus" in services()
