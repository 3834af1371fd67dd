"""Settings: defaults, YAML file, environment and flags, and errors that name their source."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.config import SettingsError, load_settings
from schemas.prices import BUILTIN_PRICES
from schemas.settings import ENV_VARS, Settings

HOME = {"HOME": "/home/someone"}


def test_defaults_are_the_documented_ones() -> None:
    settings = load_settings(env=HOME)
    assert settings.kafka.bootstrap == "127.0.0.1:9092"
    assert settings.kafka.topic_prefix == "gpuwatch."
    assert settings.kafka.app_id == "gpuwatch"
    assert settings.redis.url.get_secret_value() == "redis://127.0.0.1:6379/0"
    assert settings.metrics.port == 9480
    assert settings.windows.window_s == 60
    assert settings.windows.allowed_lateness_s == 10
    assert settings.rules.idle_util_pct == 5
    assert settings.rules.stall_after_s == 300
    assert settings.rules.queued_alert_after_s == 600
    assert settings.cost.prices == BUILTIN_PRICES
    assert settings.stack.state_dir == Path("/home/someone/.local/state/gpuwatch")
    assert settings.stack.cache_dir == Path("/home/someone/.cache/gpuwatch")


def test_xdg_directories_move_state_and_cache() -> None:
    env = {**HOME, "XDG_STATE_HOME": "/s", "XDG_CACHE_HOME": "/c"}
    settings = load_settings(env=env)
    assert settings.stack.state_dir == Path("/s/gpuwatch")
    assert settings.stack.cache_dir == Path("/c/gpuwatch")


@pytest.mark.parametrize(
    ("var", "raw", "group", "field", "value"),
    [
        ("GPUWATCH_KAFKA_BOOTSTRAP", "k1:9092,k2:9093", "kafka", "bootstrap", "k1:9092,k2:9093"),
        ("GPUWATCH_TOPIC_PREFIX", "replay1.", "kafka", "topic_prefix", "replay1."),
        ("GPUWATCH_APP_ID", "gw-prod", "kafka", "app_id", "gw-prod"),
        ("GPUWATCH_METRICS_PORT", "9999", "metrics", "port", 9999),
        ("GPUWATCH_WINDOW_S", "30", "windows", "window_s", 30),
        ("GPUWATCH_ALLOWED_LATENESS_S", "0", "windows", "allowed_lateness_s", 0),
        ("GPUWATCH_IDLE_UTIL_PCT", "2.5", "rules", "idle_util_pct", 2.5),
        ("GPUWATCH_STALL_AFTER_S", "120", "rules", "stall_after_s", 120),
        ("GPUWATCH_QUEUED_ALERT_AFTER_S", "900", "rules", "queued_alert_after_s", 900),
    ],
)
def test_each_documented_variable_sets_its_field(
    var: str, raw: str, group: str, field: str, value: object
) -> None:
    settings = load_settings(env={**HOME, var: raw})
    assert getattr(getattr(settings, group), field) == value


def test_every_variable_maps_to_a_real_field() -> None:
    for var, (group, field) in ENV_VARS.items():
        assert var.startswith("GPUWATCH_")
        group_model = Settings.model_fields[group].annotation
        assert group_model is not None
        assert field in group_model.model_fields, var  # type: ignore[union-attr]


def test_redis_url_is_secret_and_settable() -> None:
    settings = load_settings(env={**HOME, "GPUWATCH_REDIS_URL": "rediss://:pw@cache:6380/2"})
    assert settings.redis.url.get_secret_value() == "rediss://:pw@cache:6380/2"
    assert "pw" not in repr(settings)


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("GPUWATCH_WINDOW_S", "abc"),
        ("GPUWATCH_WINDOW_S", "0"),
        ("GPUWATCH_METRICS_PORT", "70000"),
        ("GPUWATCH_KAFKA_BOOTSTRAP", "no-port"),
        ("GPUWATCH_IDLE_UTIL_PCT", "101"),
        ("GPUWATCH_TOPIC_PREFIX", "bad prefix"),
        ("GPUWATCH_KAFKA_SECURITY_PROTOCOL", "TLS"),
    ],
)
def test_a_bad_value_names_the_variable(var: str, raw: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env={**HOME, var: raw})
    assert f"{var}={raw!r}" in str(caught.value)


def test_a_bad_secret_is_named_but_not_echoed() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env={**HOME, "GPUWATCH_REDIS_URL": "http://user:hunter2@x"})
    assert "GPUWATCH_REDIS_URL" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_yaml_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(
        "kafka:\n  bootstrap: file:9092\n  app_id: from-file\nwindows:\n  window_s: 15\n",
        encoding="utf-8",
    )
    env = {**HOME, "GPUWATCH_CONFIG": str(config), "GPUWATCH_APP_ID": "from-env"}
    settings = load_settings(env=env, overrides={"kafka.bootstrap": "flag:9092"})
    assert settings.kafka.bootstrap == "flag:9092"
    assert settings.kafka.app_id == "from-env"
    assert settings.windows.window_s == 15


def test_yaml_errors_name_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("windows:\n  window_s: soon\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"c\.yaml: windows\.window_s"):
        load_settings(env=HOME, config_file=config)
    config.write_text("windows:\n  widnow_s: 5\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"widnow_s.*unknown setting"):
        load_settings(env=HOME, config_file=config)
    config.write_text("kafak:\n  bootstrap: x:1\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="unknown settings group 'kafak'"):
        load_settings(env=HOME, config_file=config)
    config.write_text("kafka: [1, 2\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(env=HOME, config_file=config)
    with pytest.raises(SettingsError, match="cannot read the settings file"):
        load_settings(env=HOME, config_file=tmp_path / "absent.yaml")


def test_flag_errors_name_the_flag() -> None:
    with pytest.raises(SettingsError, match="--kafka-partitions"):
        load_settings(env=HOME, overrides={"kafka.partitions": 0})


def test_price_file_replaces_the_builtin_table(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "default_usd_per_gpu_hour: 1.0\n"
        "models: {H100: 2.5, 'H100 NVL': 3.0}\n"
        "overrides:\n"
        "  - {label: karpenter.sh/capacity-type, value: spot, models: {H100: 1.2}}\n",
        encoding="utf-8",
    )
    table = load_settings(env={**HOME, "GPUWATCH_PRICES": str(prices)}).cost.prices
    assert table.usd_per_gpu_hour("NVIDIA H100 80GB HBM3", {}) == 2.5
    assert table.usd_per_gpu_hour("NVIDIA H100 NVL", {}) == 3.0  # the longest pattern wins
    spot = {"karpenter.sh/capacity-type": "spot"}
    assert table.usd_per_gpu_hour("nvidia h100 80gb hbm3", spot) == 1.2
    assert table.usd_per_gpu_hour("NVIDIA L40S", spot) == 1.0
    assert table.usd_per_gpu_hour(None, {}) == 1.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("models: {H100: -1}\n", "greater than or equal to 0"),
        ("modles: {}\n", "Extra inputs are not permitted"),
    ],
)
def test_a_bad_price_file_names_the_variable(tmp_path: Path, content: str, message: str) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(content, encoding="utf-8")
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings(env={**HOME, "GPUWATCH_PRICES": str(prices)})
    assert "GPUWATCH_PRICES" in str(caught.value)


def test_builtin_prices_match_real_model_names() -> None:
    # Model names as NVML reports them (recorded nvidia-smi -q output).
    assert BUILTIN_PRICES.usd_per_gpu_hour("NVIDIA H100 80GB HBM3", {}) == 4.0
    assert BUILTIN_PRICES.usd_per_gpu_hour("NVIDIA H200", {}) == 5.0
    assert BUILTIN_PRICES.usd_per_gpu_hour("NVIDIA L40S", {}) == 1.8
    assert BUILTIN_PRICES.usd_per_gpu_hour("NVIDIA L4", {}) == 0.8
    assert BUILTIN_PRICES.usd_per_gpu_hour("Some Future GPU", {}) == 2.0


def test_kafka_client_options_carry_sasl_without_logging_it() -> None:
    env = {
        **HOME,
        "GPUWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "GPUWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "GPUWATCH_KAFKA_SASL_USERNAME": "gpuwatch",
        "GPUWATCH_KAFKA_SASL_PASSWORD": "s3cret",
    }
    settings = load_settings(env=env)
    options = settings.kafka.client_options()
    assert options["sasl_plain_password"] == "s3cret"
    assert options["security_protocol"] == "SASL_SSL"
    assert options["bootstrap_servers"] == ["127.0.0.1:9092"]
    assert "s3cret" not in repr(settings)
