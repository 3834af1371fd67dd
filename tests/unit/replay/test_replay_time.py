"""`gpuwatch replay` times: every accepted form of --from/--to, the refusals, the printing."""

from __future__ import annotations

import pytest

from gpuwatch.timerange import format_duration, format_time, parse_time

NOW = 1_764_412_800_000  # 2025-11-29 10:40:00 UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("NOW", NOW),
        ("-2h", NOW - 7_200_000),
        ("-30m", NOW - 1_800_000),
        ("-90s", NOW - 90_000),
        ("-1h30m", NOW - 5_400_000),
        ("now-1d", NOW - 86_400_000),
        ("-1.5h", NOW - 5_400_000),
        ("-250ms", NOW - 250),
        ("1764412345", 1_764_412_345_000),  # epoch seconds
        ("1764412345.5", 1_764_412_345_500),
        ("1764412345123", 1_764_412_345_123),  # epoch milliseconds
        ("2025-11-29T02:10:00Z", 1_764_382_200_000),
        ("2025-11-29 02:10:00+00:00", 1_764_382_200_000),
        ("2025-11-29T03:10:00+01:00", 1_764_382_200_000),
        ("2025-11-29T02:10:00.250Z", 1_764_382_200_250),
    ],
)
def test_every_form_of_a_time_gives_its_epoch_milliseconds(text: str, expected: int) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2025-11-29T02:10:00", "time zone"),
        ("yesterday", "cannot read the time"),
        ("-2x", "cannot read the time"),
        ("+2h", "cannot read the time"),
        ("", "cannot read the time"),
    ],
)
def test_a_time_that_cannot_be_read_says_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_time(text, NOW)


def test_times_print_in_utc_with_milliseconds_only_when_there_are_some() -> None:
    assert format_time(1_764_382_200_000) == "2025-11-29 02:10:00"
    assert format_time(1_764_382_200_250) == "2025-11-29 02:10:00.250"
    assert format_time(1_764_382_200_000, date=False) == "02:10:00"


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (-5_000, "0s"),  # clocks go backwards: clamped
        (500, "0.5s"),
        (12_000, "12s"),
        (270_000, "4m30s"),
        (7_500_000, "2h05m"),
        (90_000_000, "1d01h"),
    ],
)
def test_durations_print_their_two_largest_units(ms: int, text: str) -> None:
    assert format_duration(ms) == text
