"""The one table style of the verbs (gpuwatch/tables.py): plain text a pipe reads."""

from __future__ import annotations

from gpuwatch.kafka import TopicRow, format_report
from gpuwatch.tables import plain, table, table_lines


def test_columns_are_two_spaces_apart_figures_right_and_no_trailing_blank() -> None:
    lines = table_lines(
        ["NAME", "N", "DETAIL"],
        [["a", "1", "x y"], ["bbbbbb", "2222", ""], [], ["c", "3", "z"]],
        right={1},
    )
    assert lines == [
        "NAME       N  DETAIL",
        "a          1  x y",
        "bbbbbb  2222",
        "",
        "c          3  z",
    ]


def test_a_cell_is_text_never_markup_or_an_emoji_code() -> None:
    text = plain(table(["POD", "SUMMARY"], [["[bold]ns/p[/bold]", ":fire: 95% [x]"]]))
    assert text == "POD                SUMMARY\n[bold]ns/p[/bold]  :fire: 95% [x]\n"


def test_plain_output_has_no_escape_however_wide() -> None:
    wide = "x" * 500
    text = plain(table(["A", "B"], [[wide, "1"]], right={1}))
    assert "\x1b" not in text
    assert text.splitlines()[1] == f"{wide}  1"


def test_the_topics_table_keeps_its_columns() -> None:
    rows = [
        TopicRow(name="gpuwatch.nvml.samples", partitions=12, outcome="created"),
        TopicRow(name="gpuwatch.alerts", partitions=None, outcome="missing", detail="not found"),
    ]
    assert format_report(rows).splitlines() == [
        "TOPIC                  PARTITIONS  STATUS",
        "gpuwatch.nvml.samples          12  created",
        "gpuwatch.alerts                 -  missing (not found)",
    ]
