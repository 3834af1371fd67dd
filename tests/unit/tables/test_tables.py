"""The one table style of the verbs (gpuwatch/tables.py): plain text a pipe reads."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Group
from rich.text import Text

from gpuwatch.kafka import TopicRow, format_report
from gpuwatch.tables import Grid, grid, plain, plain_lines, rich_lines, table, table_lines
from gpuwatch.top.text import frame, render_text
from gpuwatch.top.view import AlertRow, GpuRow, Header, PodRow, Query, Snapshot

NOW = 1_764_412_800_000  # 2025-11-29 10:40:00 UTC


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


# -- the plain layout is rich's, byte for byte ------------------------------------------------

# Cells a pod, team or alert may carry: ASCII with spaces, CJK and full-width characters (two
# cells each), combining marks and a variation selector (none), and long runs of either.
_MARKS = ["\u0301", "\u0308", "e\u0301", "❤\ufe0f"]
_CHARS = st.sampled_from([*"abcXYZ019-/.:[]%$()", " ", " ", *"日本語中文한\uff58", *_MARKS])
_CELLS = st.one_of(
    st.just(""),
    st.sampled_from(["\u0301", " ", "日"]),  # a column of nothing but zero-width marks
    st.lists(_CHARS, max_size=8).map("".join),
    st.lists(_CHARS, min_size=40, max_size=200).map("".join),
)
# What rich treats in ways of its own (stripped, expanded, split, measured apart): left to it.
_ODD = st.sampled_from(["\t", "\n", "\r", "\x1b", "\x07", "\xa0", "\u2028", "\u200d", "\u3000"])


@st.composite
def _tables(draw: st.DrawFn, cells: st.SearchStrategy[str] = _CELLS) -> tuple[Any, ...]:
    headers = draw(st.lists(cells, max_size=5))
    width = len(headers) + 1  # a row longer than the header adds a column, as rich does
    rows = draw(st.lists(st.lists(cells, max_size=width), max_size=6))
    right = draw(st.sets(st.integers(0, width), max_size=width))
    return headers, rows, right


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tables())
@example(([], [], set()))  # no column: one blank line
@example((["\u0301"], [], set()))  # the last column is a cell wide at least, in rich
@example((["b", "\u0301", "c"], [], set()))  # a column of no width shows nothing
@example((["a ", "b "], [["x", "y "]], {0, 1}))  # a right cell loses its trailing blank
def test_the_plain_layout_is_richs_plain_rendering(drawn: tuple[Any, ...]) -> None:
    headers, rows, right = drawn
    assert table_lines(headers, rows, right) == plain_lines(table(headers, rows, right))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tables(st.one_of(_CELLS, st.tuples(_CELLS, _ODD, _CELLS).map("".join))))
def test_a_cell_rich_treats_its_own_way_is_left_to_rich(drawn: tuple[Any, ...]) -> None:
    headers, rows, right = drawn
    assert table_lines(headers, rows, right) == plain_lines(table(headers, rows, right))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_CELLS.map(Text), _tables().map(lambda t: grid(*t))), max_size=5))
def test_a_frame_of_lines_and_tables_prints_as_rich_prints_it(parts: list[Text | Grid]) -> None:
    """What `gpuwatch top --once` prints: lines and tables in a `Group`."""
    assert plain_lines(Group(*parts)) == rich_lines(Group(*parts))


def test_wide_and_combining_characters_count_as_rich_counts_them() -> None:
    rows = [["日本/\uff58", "1"], ["e\u0301e\u0301", "22"], []]
    lines = table_lines(["POD", "N"], rows, right={1})
    assert lines == ["POD       N", "日本/\uff58   1", "e\u0301e\u0301       22", ""]


def test_top_text_is_the_frame_rich_renders_plain() -> None:
    """`gpuwatch top --once` lays its tables out without rich and prints what rich would:
    two clusters (a CLUSTER column), a CJK pod, a combining mark, an alert, a note."""
    pods = (
        PodRow("u1", "ml", "训练-0", "running", NOW - 60_000, gpus=("GPU-1",), cluster="east"),
        PodRow("u2", "ml", "cafe\u0301 ", "stalled", NOW, "Idle", share=0.5, cluster="west"),
    )
    gpus = (GpuRow("GPU-1", "node-a", "H100", 97.0, 1 << 30, 80 << 30, ("u1",), cluster="east"),)
    alert = AlertRow("f", "GpuIdle", "warning", NOW - 600_000, "idle  [x]", "pod", "u2")
    snapshot = Snapshot(
        pods=pods,
        gpus=gpus,
        alerts=(alert,),
        pod_names={p.uid: p.name for p in pods},
        state_counts={"running": 1, "stalled": 1},
        gpus_total=1,
    )
    shown = frame(snapshot, Query(), Header("redis://r:6379/0", "gpuwatch"), NOW)
    text = render_text(snapshot, Query(), Header("redis://r:6379/0", "gpuwatch"), NOW)
    assert "训练-0" in text
    assert text == "".join(f"{line}\n" for line in rich_lines(shown))
