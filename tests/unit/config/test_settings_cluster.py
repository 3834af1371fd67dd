"""The cluster setting: default, settings file, GPUWATCH_CLUSTER and --cluster in that order,
checked by the rule of the messages' own `cluster` field."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import gpuwatch.run.agent
import gpuwatch.run.watcher
from gpuwatch.cli.main import main
from gpuwatch.config import SettingsError, load_settings
from schemas.fields import DEFAULT_CLUSTER, Cluster
from schemas.settings import ClusterSettings, Settings

HOME = {"HOME": "/home/someone"}


def settings_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(f"cluster:\n  name: {name!r}\n", encoding="utf-8")
    return path


def test_the_default_is_the_default_cluster() -> None:
    assert load_settings(env=HOME).cluster.name == DEFAULT_CLUSTER == "default"


def test_file_then_environment_then_flag(tmp_path: Path) -> None:
    path = settings_file(tmp_path, "from-file")
    env = {**HOME, "GPUWATCH_CLUSTER": "from-env"}

    assert load_settings(env=HOME, config_file=path).cluster.name == "from-file"
    assert load_settings(env=env, config_file=path).cluster.name == "from-env"
    flag = {"cluster.name": "from-flag"}
    assert load_settings(env=env, config_file=path, overrides=flag).cluster.name == "from-flag"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("eu west", "is not a cluster name"),
        ("-eu", "is not a cluster name"),
        ("eu/west", "is not a cluster name"),
        ("x" * 64, "length <= 63"),
        ("", "empty"),
    ],
)
def test_a_bad_name_from_the_environment_is_refused_naming_the_variable(
    name: str, why: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(env={**HOME, "GPUWATCH_CLUSTER": name})

    message = str(refused.value)
    assert f"GPUWATCH_CLUSTER={name!r}" in message
    assert why in message


def test_a_bad_name_in_the_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = settings_file(tmp_path, "eu west")

    with pytest.raises(SettingsError, match=r"gpuwatch\.yaml: cluster\.name: .*not a cluster"):
        load_settings(env=HOME, config_file=path)


@pytest.mark.parametrize(
    "name",
    ["default", "eu-west-1", "prod.gpu_a", "A", "9", "x" * 63, "x" * 64, "a-", ".a", "a b", "é"],
)
def test_the_setting_takes_exactly_the_names_a_message_takes(name: str) -> None:
    try:
        msgspec.convert(name, Cluster)
    except msgspec.ValidationError:
        in_messages = False
    else:
        in_messages = True
    try:
        ClusterSettings(name=name)
    except ValueError:
        in_settings = False
    else:
        in_settings = True

    assert in_settings == in_messages


@pytest.mark.parametrize(
    ("verb", "module"),
    [("node-agent", gpuwatch.run.agent), ("k8s-watcher", gpuwatch.run.watcher)],
)
def test_each_producers_flag_overrides_the_environment(
    verb: str, module: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Settings] = []

    def run(settings: Settings, _options: object) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(module, "run", run)
    monkeypatch.setenv("GPUWATCH_CLUSTER", "from-env")

    assert main([verb]) == 0
    assert main([verb, "--cluster", "eu-west"]) == 0

    assert [s.cluster.name for s in seen] == ["from-env", "eu-west"]


@pytest.mark.parametrize("verb", ["node-agent", "k8s-watcher", "simulate"])
def test_a_bad_flag_is_refused_before_anything_runs(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([verb, "--cluster", "a/b"])

    assert exit_info.value.code == 2
    assert "argument --cluster: 'a/b' is not a cluster name" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["node-agent", "k8s-watcher", "simulate"])
def test_the_help_names_the_flag_and_the_variable(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([verb, "--help"])

    text = " ".join(capsys.readouterr().out.split())
    assert "--cluster NAME" in text
    assert "env: GPUWATCH_CLUSTER, default: default" in text


def test_rules_of_a_cluster_from_the_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(
        "rules:\n  idle_util_pct: 4\n  clusters:\n    dev:\n      idle_util_pct: 12\n"
        "      stall_after_s: 900\n",
        encoding="utf-8",
    )
    rules = load_settings(env=HOME, config_file=path).rules
    assert (rules.of("dev").idle_util_pct, rules.of("dev").stall_after_s) == (12, 900)
    # What dev leaves out, and any cluster not named, take the worker's thresholds.
    assert rules.of("dev").queued_alert_after_s == rules.queued_alert_after_s == 600
    assert rules.of("prod") is rules
    assert rules.of("prod").idle_util_pct == 4

    env = {**HOME, "GPUWATCH_CLUSTER_RULES": '{"eu-west": {"idle_alert_after_s": 300}}'}
    rules = load_settings(env=env, config_file=path).rules
    assert set(rules.clusters) == {"eu-west"}
    assert rules.of("eu-west").idle_alert_after_s == 300
    assert rules.of("eu-west").idle_util_pct == 4
    assert rules.of("dev") is rules


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ('{"eu west": {}}', "is not a cluster name"),
        ('{"dev": {"idle_util_pct": 150}}', "less than or equal to 100"),
        ('{"dev": {"idle_pct": 5}}', "at dev.idle_pct: unknown setting"),
        ('{"dev": ', "expected a JSON object of clusters"),
    ],
)
def test_bad_rules_of_a_cluster_are_refused_naming_the_variable(value: str, why: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(env={**HOME, "GPUWATCH_CLUSTER_RULES": value})
    message = str(refused.value)
    assert "GPUWATCH_CLUSTER_RULES" in message
    assert why in message
