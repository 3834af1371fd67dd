"""`gpuwatch replay` arguments: relative times after flags, and the refusals made before Kafka."""

from __future__ import annotations

import pytest

from gpuwatch.cli import build_parser, main


def test_relative_times_are_values_not_options() -> None:
    args = build_parser().parse_args(["replay", "--pod", "ml/a", "--from", "-2h", "--to", "-1h30m"])
    assert (args.time_from, args.time_to, args.pod) == ("-2h", "-1h30m", "ml/a")
    args = build_parser().parse_args(["replay", "--node", "n1", "--from", "-1.5d"])
    assert (args.time_from, args.time_to, args.replay_node) == ("-1.5d", "now", "n1")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--pod", "ml/a", "--from", "-1h", "--to", "-2h"], "empty range: --from"),
        (["--pod", "ml/a", "--from", "soon"], "cannot read the time 'soon'"),
        (["--pod", "train-0", "--from", "-1h"], "--pod wants NAMESPACE/NAME"),
        (["--from", "-1h"], "give one of --pod NS/NAME, --gpu UUID or --node NAME"),
        (["--rerun", "--from", "-1h"], "takes both --rerun and --to-prefix"),
        (["--to-prefix", "r.", "--from", "-1h"], "takes both --rerun and --to-prefix"),
        (["--rerun", "--to-prefix", "r.", "--pod", "ml/a", "--from", "-1h"], "every pod"),
        (["--pod", "ml/a", "--from", "-1h", "--margin", "-5"], "--margin must not be negative"),
    ],
)
def test_a_request_that_cannot_be_served_exits_1_before_reading(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", *argv]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert says in err


def test_the_cluster_narrows_the_subject() -> None:
    args = build_parser().parse_args(["replay", "--node", "n1", "--cluster", "eu", "--from", "-1h"])
    assert (args.replay_node, args.replay_cluster) == ("n1", "eu")
