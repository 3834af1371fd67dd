"""The counters of units of work in a pod's Prometheus text exposition.

prometheus_client's parser reads the text. It takes a counter family's name without
`_total` while its samples keep it, so a unit's metric matches any sample named the
metric with or without `_total` (`train_steps` and `train_steps_total` are one counter),
whatever the family's type (a summary's `_count` counts requests too). The series of a
metric are summed over their labels: vLLM labels its counters by model, and the pod's
work is all of them.

The exposition comes from a pod, so anything may be in it. Whatever the text, reading it
ends in `Counters` or `BadExposition`: not UTF-8, more samples than `max_series`, a line
longer than `MAX_LINE_CHARS`, text the parser refuses, or a counter of a unit that is
negative, NaN or infinite. Lines are checked before parsing: the parser's work grows with
the square of a line's length, so one line of megabytes would hold a scrape for minutes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MAX_LINE_CHARS", "PROCESS_START", "BadExposition", "Counters", "read_counters"]

MAX_LINE_CHARS: Final = 16_384
"""Longest line read. A sample line is a name, a few labels and a value: hundreds of
characters. With lines no longer, the worst 4 MiB keeps the parser a few seconds, not the
minutes that one line of megabytes would."""
PROCESS_START: Final = "process_start_time_seconds"
"""The standard gauge of when the process started (Unix seconds): a new value is a new
process, whose counters start again from zero."""


class BadExposition(ValueError):  # noqa: N818 - bad input, as MalformedObject
    """An exposition that cannot be read; `reason` is a short key for a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Counters:
    """What one exposition says of a pod's units."""

    values: Mapping[str, float]
    """Unit name -> its metric's value, summed over the metric's series."""
    missing: frozenset[str]
    """Units whose metric has no sample."""
    process_start: float | None
    """`process_start_time_seconds`, None when absent (or not a finite time)."""


def read_counters(text: bytes, wanted: Mapping[str, str], max_series: int) -> Counters:
    """The values of the `wanted` units (unit name -> metric name) in `text`; BadExposition
    when the text cannot be read (see the module's docstring)."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadExposition("not_utf8", f"not UTF-8 at byte {exc.start}") from exc
    _check_lines(decoded, max_series)
    units_of: dict[str, list[str]] = {}
    for unit, metric in wanted.items():
        base = metric.removesuffix("_total")
        for name in (base, f"{base}_total"):
            units_of.setdefault(name, []).append(unit)
    totals: dict[str, float] = {}
    starts: list[tuple[bool, float]] = []
    try:
        for family in text_string_to_metric_families(decoded):
            for sample in family.samples:
                if sample.name == PROCESS_START:
                    starts.append((not sample.labels, _float(sample.value)))
                for unit in units_of.get(sample.name, ()):
                    value = _float(sample.value)
                    if not math.isfinite(value) or value < 0:
                        raise BadExposition(
                            "bad_value", f"{sample.name} is {sample.value!r}, not a count"
                        )
                    totals[unit] = totals.get(unit, 0.0) + value
    except BadExposition:
        raise
    # The parser is a third party's, fed a stranger's text: any error it raises (ValueError
    # mostly, an IndexError or a TypeError on some malformed lines) means "not readable".
    except Exception as exc:
        raise BadExposition("unparsable", f"{type(exc).__name__}: {exc}"[:200]) from exc
    for unit, total in totals.items():
        if not math.isfinite(total):  # finite values whose sum overflows
            raise BadExposition("bad_value", f"unit {unit} sums to {total!r}")
    return Counters(
        values=totals,
        missing=frozenset(wanted.keys() - totals.keys()),
        process_start=_process_start(starts),
    )


def _check_lines(text: str, max_series: int) -> None:
    """Every line short enough and at most `max_series` samples (the text format has one
    sample per line that is neither blank nor a comment), before the parser sees them."""
    samples = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if len(line) > MAX_LINE_CHARS:
            raise BadExposition(
                "line_too_long", f"line {number} is longer than {MAX_LINE_CHARS} characters"
            )
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            samples += 1
            if samples > max_series:
                raise BadExposition("too_many_series", f"more than {max_series} samples")


def _float(value: float) -> float:
    """The parser gives an int where the text has one, of any size."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _process_start(starts: list[tuple[bool, float]]) -> float | None:
    """The unlabelled sample, else the first (a multi-process exporter may label several)."""
    if not starts:
        return None
    _, value = next((s for s in starts if s[0]), starts[0])
    return value if math.isfinite(value) and value >= 0 else None
