"""`gpuwatch simulate`: flags, the scenario list, errors a user sees, the summary text."""

from __future__ import annotations

import pytest

from gpuwatch.cli.main import _overrides, build_parser, main
from gpuwatch.harness.run.simulate import format_summary, load, parse_epoch
from gpuwatch.harness.simulate.runner import SimulationSummary


def test_the_flags_reach_the_options() -> None:
    argv = ["simulate", "--scenario", "fleet", "--speed", "10", "--duration", "60"]
    argv += ["--until", "3600", "--nodes", "5", "--gpus-per-node", "4", "--seed", "3"]
    argv += ["--epoch", "2025-11-29T10:00:00Z", "--interval", "2"]
    args = build_parser().parse_args(argv)

    assert (args.scenario, args.speed, args.duration, args.until_s) == ("fleet", 10.0, 60.0, 3600.0)
    assert (args.sim_nodes, args.gpus_per_node, args.sim_seed) == (5, 4, 3)
    assert args.epoch == "2025-11-29T10:00:00Z"
    # --interval is the agents' sample interval setting; the others are not settings.
    assert _overrides(args) == {"agent.interval_s": 2.0}


def test_the_help_names_the_scenarios_and_the_speed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--help"])

    text = " ".join(capsys.readouterr().out.split())
    assert "small, fleet, incident, dra" in text
    assert "--speed 10 shows ten simulated minutes per real minute" in text


def test_list_prints_each_shipped_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--list"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["dra", "fleet", "incident", "small"]
    assert "320 GPUs" in lines[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--speed", "0"], "gpuwatch: --speed must be above 0, not 0"),
        (["--epoch", "yesterday"], "gpuwatch: --epoch: not epoch seconds nor an ISO 8601 time"),
        (["--epoch", "2025-11-29T10:00:00"], "gpuwatch: --epoch: give the time zone"),
        (["--scenario", "nope", "--no-topic-check"], "gpuwatch: no scenario named 'nope'"),
        (["--nodes", "0", "--no-topic-check"], "gpuwatch: --nodes must be 1 or more, not 0"),
    ],
)
def test_bad_options_are_refused_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 1

    assert capsys.readouterr().err.startswith(message)


def test_epochs_are_seconds_or_iso_times() -> None:
    assert parse_epoch("1764410400") == 1_764_410_400.0
    assert parse_epoch("2025-11-29T10:00:00Z") == 1_764_410_400.0
    assert parse_epoch("2025-11-29T11:00:00+01:00") == 1_764_410_400.0


def test_load_applies_the_overrides() -> None:
    scenario = load("small", nodes=2, gpus_per_node=1, seed=5)

    assert [(p.pool, p.count, p.gpus_per_node) for p in scenario.nodes] == [
        ("h100", 2, 1),
        ("l40s", 2, 1),
    ]
    assert scenario.seed == 5


def test_the_summary_says_what_was_published_and_where_pods_ended() -> None:
    summary = SimulationSummary(
        scenario="small",
        seed=7,
        speed=10.0,
        epoch_ms=1_764_410_400_000,
        end_ms=1_764_410_520_000,
        ticks=120,
        late_ticks=0,
        nodes=3,
        gpus=10,
        samples=360,
        pods={"research/a-0": "Running", "research/b-0": "Pending", "research/c-0": "Running"},
        sent={"nvml.samples": 360, "k8s.pods": 9, "k8s.nodes": 3},
        dropped={"nvml.samples": 2, "k8s.pods": 0, "k8s.nodes": 0},
        failed={"nvml.samples": 0, "k8s.pods": 0, "k8s.nodes": 0},
        wall_s=12.04,
        cpu_s=1.26,
        unschedulable={"research/b-0": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."},
    )

    assert format_summary(summary).splitlines() == [
        "scenario small (seed 7): 3 nodes, 10 GPUs, 120 s simulated in 12.0 s "
        "(speed 10, 120 ticks, 0 late), CPU 1.3 s",
        "published: nvml.samples 360 sent (2 dropped), k8s.pods 9 sent, k8s.nodes 3 sent",
        "pods: Pending 1, Running 2",
        "  research/a-0  Running",
        "  research/b-0  Pending  (0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)",
        "  research/c-0  Running",
    ]


def test_kube_says_what_the_real_server_does_to_the_times(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert build_parser().parse_args(["simulate", "--kube"]).kube is True
    assert build_parser().parse_args(["simulate"]).kube is False
    monkeypatch.setenv("COLUMNS", "2000")  # no line broken at a label's hyphen
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--help"])

    text = " ".join(capsys.readouterr().out.split())
    assert "labelled app.kubernetes.io/managed-by=gpuwatch-simulate" in text
    assert "stamps creation times with its wall clock" in text
