"""`gpuwatch report` arguments, and records that do not decode: counted and skipped."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from report_records import DAY, T0, attribution, gpu_window

from gpuwatch.cli import build_parser, main
from gpuwatch.replay.read import Hit, PartitionPlan, Plan
from gpuwatch.report import read
from gpuwatch.report.aggregate import Aggregator
from gpuwatch.timerange import TimeRange
from schemas import ATTRIBUTION, GPU_WINDOWS
from schemas.settings import Settings


def test_defaults_and_relative_times() -> None:
    args = build_parser().parse_args(["report", "--from", "-30d"])
    assert (args.time_from, args.time_to) == ("-30d", "now")
    assert (args.report_by, args.report_step, args.report_format) == ("team", None, "table")
    assert (args.top, args.plot) == (None, None)
    args = build_parser().parse_args(
        ["report", "--from", "-7d", "--to", "-1h30m", "--step", "1h", "--by", "gpu", "--top", "3"]
    )
    assert (args.time_to, args.report_step, args.report_by, args.top) == ("-1h30m", "1h", "gpu", 3)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--from", "-1d", "--step", "2h"], "argument --step: invalid choice: '2h'"),
        (["--from", "-1d", "--by", "owner"], "argument --by: invalid choice: 'owner'"),
        (["--from", "-1d", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["--from", "-1d", "--top", "0"], "argument --top: must be 1 or more, not 0"),
        (["--from", "-1d", "--top", "many"], "argument --top: not a whole number: 'many'"),
        (["--from", "soon"], "argument --from: cannot read the time 'soon'"),
        (["--from", "-1d", "--to", "2025-12-01T00:00:00"], "give the time zone"),
        ([], "the following arguments are required: --from"),
    ],
)
def test_bad_flags_are_argparse_errors(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["report", *argv])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_range_that_ends_before_it_starts_exits_1_before_reading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["report", "--from", "-1h", "--to", "-2h"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "report: empty range: --from" in err


class _Reader:
    """Kafka as the report's reader sees it: one plan, hits per topic; a record without a
    `ts` is scanned but never handed over (as `RangeReader` does)."""

    def __init__(self, hits: dict[str, list[Hit]], scanned: dict[str, int]) -> None:
        self.hits, self.scanned = hits, scanned

    def __call__(self, *args: Any, **kwargs: Any) -> _Reader:
        return self

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def plan(self, topics: Sequence[str], span: TimeRange) -> Plan:
        parts = [PartitionPlan(t, 0, 0, 0, 10) for t in topics]
        return Plan(parts, [], scanned=dict(self.scanned))

    def read(
        self, plan: Plan, topics: Sequence[str], span: TimeRange, margin: int
    ) -> Iterator[Hit]:
        for topic in topics:
            yield from self.hits.get(topic, [])


def test_records_that_do_not_decode_are_counted_and_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings()
    prefix = settings.kafka.topic_prefix
    attr, win = ATTRIBUTION.full_name(prefix), GPU_WINDOWS.full_name(prefix)

    def hit(topic: str, value: bytes) -> Hit:
        return Hit(topic, 0, b"k", value, T0 + 60_000)

    good = [
        hit(attr, ATTRIBUTION.encode(attribution())),
        hit(win, GPU_WINDOWS.encode(gpu_window())),
    ]
    bad = [
        hit(attr, b'{"schema": "gpuwatch.attribution/v1", "ts": 1}'),  # fields missing
        hit(attr, b"\xff\xfe not json"),
        hit(win, b'{"schema": "gpuwatch.alert/v1", "ts": 1}'),  # another topic's value
    ]
    hits: dict[str, list[Hit]] = {}
    for h in good + bad:
        hits.setdefault(h.topic, []).append(h)
    # Each topic scanned one record more than it handed over: a value with no `ts`.
    scanned = {attr: len(hits[attr]) + 1, win: len(hits[win]) + 1}
    monkeypatch.setattr(read, "RangeReader", _Reader(hits, scanned))
    agg = Aggregator(TimeRange(T0, T0 + DAY))
    read.read_period(settings, agg, margin_ms=0)
    assert agg.counts.undecodable == 5
    assert (agg.counts.pod_windows, agg.counts.gpu_windows) == (1, 1)
    (total,) = agg.report().totals
    assert total.cost_usd == pytest.approx(4 / 60)
