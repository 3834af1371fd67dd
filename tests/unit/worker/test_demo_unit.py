"""The demo's pure parts: where simulated time starts, the children's environment, the
processes it starts for one or several simulated clusters."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.cli import build_parser
from gpuwatch.harness.run import demo
from gpuwatch.harness.run.demo import DemoOptions, clock_skew_s, demo_env, epoch_for, where_to_look
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


@pytest.mark.parametrize(
    ("speed", "duration", "kube", "skew"),
    [
        (1.0, None, False, None),  # live: event time is wall time
        (1.0, None, True, None),
        (10.0, 60.0, False, None),  # starts 540 s in the past, meets the clock at the end
        (10.0, None, False, 86_400),  # ahead without end after its hour: the most there is
        (10.0, 60.0, True, 840),  # starts now, 540 s ahead at the end, plus the usual 300 s
        (60.0, 3_600.0, True, 86_400),  # 59 hours ahead at the end: a day, the most
    ],
)
def test_the_demos_worker_takes_data_as_far_ahead_as_simulated_time_runs(
    speed: float, duration: float | None, kube: bool, skew: int | None
) -> None:
    options = DemoOptions(speed=speed, duration_s=duration, kube=kube)
    assert clock_skew_s(options, 300) == skew
    assert clock_skew_s(options, 86_400) is None  # the settings' covers it already


def test_the_demos_clock_skew_is_set_for_the_children_unless_the_user_set_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUWATCH_MAX_CLOCK_SKEW_S", raising=False)
    fast = DemoOptions(speed=10.0, duration_s=60.0, kube=True)
    assert demo_env(Settings(), fast)["GPUWATCH_MAX_CLOCK_SKEW_S"] == "840"
    behind = DemoOptions(speed=10.0, duration_s=60.0)  # never ahead of the clock
    assert "GPUWATCH_MAX_CLOCK_SKEW_S" not in demo_env(Settings(), behind)
    monkeypatch.setenv("GPUWATCH_MAX_CLOCK_SKEW_S", "600")
    assert demo_env(Settings(), fast)["GPUWATCH_MAX_CLOCK_SKEW_S"] == "600"


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


def test_each_cluster_of_the_demo_is_a_simulation_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spawned: list[tuple[str, list[str]]] = []

    def spawn(name: str, argv: Sequence[str], env: dict[str, str], logs: Path) -> Any:
        spawned.append((name, list(argv)))
        return None

    monkeypatch.setattr(demo, "_spawn", spawn)
    monkeypatch.setattr(demo, "stop", lambda running: None)
    options = demo.DemoOptions(clusters=("train", "infer"))
    with demo.children(Settings(), options, tmp_path, lambda message: None):
        pass
    sims = {name: argv for name, argv in spawned if name.startswith("simulate")}
    assert sorted(sims) == ["simulate-infer", "simulate-train"]
    assert sims["simulate-train"][-2:] == ["--cluster", "train"]
    assert sims["simulate-infer"][-3:] == ["--cluster", "infer", "--no-metrics"]
    assert [name for name, _ in spawned][:3] == ["worker", "sink", "metrics"]

    spawned.clear()
    with demo.children(Settings(), demo.DemoOptions(), tmp_path, lambda message: None):
        pass
    assert [name for name, argv in spawned if "--cluster" not in argv] == [
        "worker",
        "sink",
        "metrics",
        "simulate",
    ]


def test_the_demos_clusters_are_checked_names() -> None:
    args = build_parser().parse_args(["demo", "--clusters", "train, infer"])
    assert args.clusters == ("train", "infer")
    for bad in ("a,a", "a,b c", "a,"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["demo", "--clusters", bad])


def test_with_kube_the_demo_says_how_to_watch_the_pods_with_kubectl(tmp_path: Path) -> None:
    settings = Settings.model_validate({"stack": {"state_dir": str(tmp_path), "kube_port": 16999}})

    text = where_to_look(settings, Path("/tmp/logs"), kube=True)

    config = tmp_path / "kube-apiserver" / "kubeconfig"
    assert f"kubectl --kubeconfig {config} get pods -A -w" in text
    assert "https://127.0.0.1:16999" in text
    assert "kubectl" not in where_to_look(settings, Path("/tmp/logs"))


def test_with_kube_the_simulator_writes_to_the_stacks_api_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spawned: dict[str, list[str]] = {}

    def spawn(name: str, argv: Sequence[str], env: dict[str, str], logs: Path) -> Any:
        spawned[name] = list(argv)

    monkeypatch.setattr(demo, "_spawn", spawn)
    monkeypatch.setattr(demo, "stop", lambda running: None)
    options = DemoOptions(kube=True, speed=10.0, duration_s=60.0)
    with demo.children(Settings(), options, tmp_path, lambda message: None):
        pass
    assert spawned["simulate"][-1] == "--kube"
    assert "--kube" not in spawned["worker"]
    # Event time starts when the simulator does, as the server's creation times do.
    assert "--epoch" not in spawned["simulate"]


def test_kube_takes_one_simulated_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwatch.cli.main import main

    assert main(["demo", "--kube", "--clusters", "a,b"]) == 1
    assert "--kube takes one simulated cluster" in capsys.readouterr().err
