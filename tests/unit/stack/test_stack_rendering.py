"""The configuration files and command lines the local stack renders."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuwatch.harness.stack import kafka, prometheus, redis
from gpuwatch.harness.stack.service import ServiceStatus, StackPaths, format_table
from schemas.settings import Settings

REPO = Path(__file__).resolve().parents[3]


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_server_properties_is_one_kraft_node_on_loopback(tmp_path: Path) -> None:
    props = _properties(
        kafka.render_server_properties(port=19092, controller_port=19093, data_dir=tmp_path / "d")
    )
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert props["log.dirs"] == str(tmp_path / "d")
    assert props["auto.create.topics.enable"] == "false"
    assert props["num.partitions"] == "1"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key


def test_log4j2_writes_to_stdout_and_quiets_config_dumps() -> None:
    props = {k.strip(): v.strip() for k, v in _properties(kafka.render_log4j2()).items()}
    assert props["appender.stdout.type"] == "Console"
    assert props["appender.stdout.target"] == "SYSTEM_OUT"
    assert props["rootLogger.appenderRef.stdout.ref"] == props["appender.stdout.name"]
    assert props["logger.config.name"] == "org.apache.kafka.common.config.AbstractConfig"
    assert props["logger.config.level"] == "WARN"


def test_pom_names_the_kafka_version_and_log4j_binding() -> None:
    pom = kafka.render_pom("4.1.1")
    assert "<artifactId>kafka_2.13</artifactId>\n      <version>4.1.1</version>" in pom
    assert "<artifactId>log4j-slf4j-impl</artifactId>" in pom
    assert "<packaging>pom</packaging>" in pom


def test_cluster_id_is_16_random_bytes_base64url() -> None:
    first, second = kafka.new_cluster_id(), kafka.new_cluster_id()
    assert len(first) == 22
    assert "=" not in first
    assert len(base64.urlsafe_b64decode(first + "==")) == 16
    assert first != second


def test_redis_conf_binds_loopback_with_protected_mode(tmp_path: Path) -> None:
    lines = redis.render_redis_conf(port=16379, data_dir=tmp_path).splitlines()
    assert "bind 127.0.0.1" in lines
    assert "port 16379" in lines
    assert "protected-mode yes" in lines
    assert "daemonize no" in lines
    assert f'dir "{tmp_path}"' in lines
    assert "appendonly no" in lines


def test_prometheus_command_runs_the_config_in_place(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "prometheus.yml"
    argv = prometheus.command(
        binary="/usr/bin/prometheus", config=config, data_dir=tmp_path / "data", port=19090
    )
    assert argv[0] == "/usr/bin/prometheus"
    assert f"--config.file={config}" in argv
    assert f"--storage.tsdb.path={tmp_path / 'data'}" in argv
    assert "--web.listen-address=127.0.0.1:19090" in argv
    assert "--web.enable-lifecycle" in argv


def test_a_moved_prometheus_scrapes_itself_at_its_port_with_the_same_rules() -> None:
    source = REPO / "deploy" / "prometheus" / "prometheus.yml"
    original = yaml.safe_load(source.read_text())
    config = yaml.safe_load(prometheus.moved(source, 19090))
    assert config["rule_files"] == [str(source.parent / r) for r in original["rule_files"]]
    assert all(Path(rule).is_file() for rule in config["rule_files"])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["prometheus"]["static_configs"][0]["targets"] == ["127.0.0.1:19090"]
    others = {j["job_name"]: j for j in original["scrape_configs"] if j["job_name"] != "prometheus"}
    assert {name: job for name, job in jobs.items() if name != "prometheus"} == others
    assert config["global"] == original["global"]


def test_default_prometheus_config_is_the_checkouts() -> None:
    assert prometheus.default_config() == REPO / "deploy" / "prometheus" / "prometheus.yml"


def test_deploy_prometheus_config_scrapes_gpuwatch_jobs() -> None:
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == "5s"
    assert config["rule_files"] == ["gpuwatch-rules.yml"]
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]
    }
    assert targets == {
        "gpuwatch-worker": ["127.0.0.1:9480"],
        "gpuwatch-sink": ["127.0.0.1:9483"],
        "gpuwatch-sink-metrics": ["127.0.0.1:9484"],
        "gpuwatch-node-agent": ["127.0.0.1:9481"],
        "gpuwatch-k8s-watcher": ["127.0.0.1:9482"],
        "prometheus": ["127.0.0.1:9090"],
    }
    assert (REPO / "deploy/prometheus/gpuwatch-rules.yml").is_file()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_deploy_config() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(REPO / "deploy/prometheus/prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_format_table_aligns_columns(tmp_path: Path) -> None:
    table = format_table(
        [
            ServiceStatus("kafka", "up", 9092, 4242, tmp_path / "kafka.log", "answering"),
            ServiceStatus("redis", "external", 6379, None, None, "not started by gpuwatch"),
        ]
    )
    header, first, second = table.splitlines()
    assert header.split() == ["SERVICE", "STATE", "ADDRESS", "PID", "DETAIL", "LOG"]
    assert first.split()[:4] == ["kafka", "up", "127.0.0.1:9092", "4242"]
    assert first.endswith(str(tmp_path / "kafka.log"))
    assert second.split()[:4] == ["redis", "external", "127.0.0.1:6379", "-"]
    assert header.index("STATE") == first.index("up") == second.index("external")


def test_the_format_command_keeps_a_dash_led_cluster_id_in_one_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # base64url ids start with "-" one time in 64; `-t -abc` made kafka-storage fail.
    monkeypatch.setattr(kafka, "new_cluster_id", lambda: "-Xh2bQ0AAAAAAAAAAAAAAA")
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    settings = Settings().model_copy(
        update={"stack": Settings().stack.model_copy(update={"state_dir": tmp_path})}
    )
    service = kafka.KafkaService(
        settings, StackPaths.of(tmp_path), which=lambda name: f"/usr/bin/{name}"
    )
    service._format(tmp_path, lambda _: None)
    assert "--cluster-id=-Xh2bQ0AAAAAAAAAAAAAAA" in calls[0]
