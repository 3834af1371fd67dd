"""The demo's pure parts: where simulated time starts, the children's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.run.demo import DemoOptions, demo_env, epoch_for, where_to_look
from schemas.settings import Settings

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("speed", "duration", "start"),
    [
        (1.0, None, NOW),  # live: event time is wall time
        (1.0, 60.0, NOW),
        (10.0, 60.0, NOW - 540.0),  # ten simulated minutes end now
        (5.0, None, NOW - 4 * 3600.0),  # no end: meets the wall clock after an hour
    ],
)
def test_simulated_time_meets_the_wall_clock_at_the_end(
    speed: float, duration: float | None, start: float
) -> None:
    options = DemoOptions(speed=speed, duration_s=duration)
    assert epoch_for(options, NOW) == start
    horizon = duration if duration is not None else 3600.0
    if speed > 1:  # event time after `horizon` wall seconds equals the wall clock then
        assert start + speed * horizon == NOW + horizon


def test_the_users_rules_win_over_the_demos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWATCH_STALL_AFTER_S", "600")
    monkeypatch.delenv("GPUWATCH_QUEUED_ALERT_AFTER_S", raising=False)
    env = demo_env(Settings())
    assert env["GPUWATCH_STALL_AFTER_S"] == "600"
    assert env["GPUWATCH_QUEUED_ALERT_AFTER_S"] == "180"
    assert env["GPUWATCH_TOPIC_PREFIX"] == "gpuwatch."


def test_where_to_look_names_prometheus_queries_and_hides_the_redis_password() -> None:
    settings = Settings.model_validate({"redis": {"url": "redis://:hunter2@10.0.0.5:6379/0"}})
    text = where_to_look(settings, Path("/tmp/logs"))
    assert "http://127.0.0.1:9090/alerts" in text
    assert "gpuwatch_waste_usd_total" in text
    assert "hunter2" not in text
    assert "redis://:***@10.0.0.5:6379/0" in text
