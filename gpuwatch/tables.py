"""How the verbs print tables: one `rich` table style for `top`, `report`, `replay`,
`stack` and `topics`, rendered plain or styled.

A table is columns two spaces apart, without borders, text to the left and the `right`
columns (figures) to the right, header and cells alike. Rendered plain (`plain`) it is
text a pipe, `grep` and `awk` read: no escape, no box drawing, no trailing blank, no
wrapping however wide; on a terminal (`gpuwatch top`'s live view) the same table shows
its header in bold, its lines cut at the right edge as the plain ones would be. Cells
are `Text`, never markup: a pod or alert named `[x]` prints as is.

Two renderers, one output. On a terminal rich draws the table (`table`, or a `Grid`
cast to one): styles, lines cut to the screen. Plain (pipes, `top --once`, tests),
`table_lines` and `plain` lay a `Grid` out themselves: each column as wide as its widest
cell by `rich.cells.cell_len` (a wide or combining character counts as rich counts it),
cells padded with `str` operations, rich's own rules kept (a right-aligned cell loses its
trailing blanks, the last column is a cell wide at least, a column of no width shows
nothing): the same bytes as rich's plain rendering (`rich_lines`), which the tests check
on generated tables. Why: rich spends about 0.06 ms a cell (a `Text`, a measurement and
segments each). Plain `top` text of 3,000 pods and 3,000 GPUs took 3.4-4.4 s with rich
and takes 47-82 ms without, as the hand-written renderer before it (43-73 ms in the same
runs); a 4,000-row `report` 2.3-3.5 s, now 40-64 ms (best of 3, two cores, load average
4). A table with a cell that is not printable (a control character, tab, line break,
separator or format character: `str.isprintable`), which rich strips, expands, splits or
measures its own way, or wider than `WIDE`, is left to rich.
"""

from __future__ import annotations

import io
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = [
    "HEADER_STYLE",
    "WIDE",
    "Grid",
    "grid",
    "plain",
    "plain_lines",
    "rich_lines",
    "table",
    "table_lines",
]

HEADER_STYLE: Final = "bold"
WIDE: Final = 100_000  # a plain rendering never wraps or cuts: the reader's pipe decides
_GAP: Final = "  "  # between two columns


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int] = ()
) -> Table:
    """A borderless table, columns two spaces apart, the `right` columns right-aligned; an
    empty row prints as a blank line (a group's gap). A cell never wraps: a view narrower
    than the table cuts its lines at the right edge instead."""
    out = Table(
        box=None,
        padding=(0, 2, 0, 0),
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
        header_style=HEADER_STYLE,
    )
    for i, header in enumerate(headers):
        out.add_column(Text(header), justify="right" if i in right else "left", no_wrap=True)
    for row in rows:
        out.add_row(*(Text(cell) for cell in row))
    return out


@dataclass(frozen=True, slots=True)
class Grid:
    """A `table`'s cells kept as strings: laid out by `plain` without rich, drawn by rich
    (as `table`) on a terminal."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: frozenset[int]

    def __rich__(self) -> Table:
        return table(self.headers, self.rows, self.right)

    def lines(self) -> list[str] | None:
        """The table as plain lines, header first; None where only rich knows (see the
        module's docstring)."""
        width = max([len(self.headers), *map(len, self.rows)])
        text = "".join([*self.headers, *map("".join, self.rows)])
        if not width or not text.isprintable():
            return None
        measure = len if text.isascii() else cell_len  # printable ASCII: one cell a character
        cells = [[*row, *[""] * (width - len(row))] for row in (self.headers, *self.rows)]
        columns: list[list[str]] = []
        total = len(_GAP) * (width - 1)
        for i, column in enumerate(zip(*cells, strict=True)):
            sizes = [measure(cell) for cell in column]
            size = max(sizes) if i < width - 1 else max(1, *sizes)  # rich's last is 1 at least
            total += size
            if not size:  # rich draws nothing of a column no cell is wide enough to show
                columns.append([""] * len(column))
            elif i in self.right:  # rich drops a right-aligned cell's trailing blanks
                shown = [cell.rstrip() for cell in column]
                columns.append([" " * (size - measure(cell)) + cell for cell in shown])
            else:
                padded = zip(column, sizes, strict=True)
                columns.append([cell + " " * (size - n) for cell, n in padded])
        if total > WIDE:
            return None
        return [_GAP.join(line).rstrip() for line in zip(*columns, strict=True)]


def grid(
    headers: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int] = ()
) -> Grid:
    """`table`'s cells, for `plain` to lay out fast (and rich to draw on a terminal)."""
    return Grid(
        tuple(headers),
        tuple(tuple(cells) for cells in rows),
        frozenset(i for i in range(len(headers)) if i in right),
    )


def rich_lines(*renderables: RenderableType) -> list[str]:
    """The renderables as rich renders them plain: no style, no escape, right ends
    stripped."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=WIDE,
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        force_interactive=False,
        no_color=True,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=False,
        legacy_windows=False,
    )
    for renderable in renderables:
        console.print(renderable, no_wrap=True, overflow="ignore", crop=False)
    return [line.rstrip() for line in buffer.getvalue().split("\n")[:-1]]


def _fast_lines(renderable: object) -> list[str] | None:
    """`rich_lines` of a `Grid`, a one-line `Text` or a `Group` of them (through
    `__rich__`), without rich; None for anything else."""
    while not isinstance(renderable, Grid) and hasattr(renderable, "__rich__"):
        renderable = renderable.__rich__()
    if isinstance(renderable, Grid):
        return renderable.lines()
    if isinstance(renderable, Text):
        text = renderable.plain
        left = renderable.justify in (None, "default", "left")
        if left and renderable.end == "\n" and text.isprintable() and cell_len(text) <= WIDE:
            return [text.rstrip()]
        return None
    if isinstance(renderable, Group):
        out: list[str] = []
        for part in renderable.renderables:
            out += plain_lines(part)
        return out
    return None


def plain_lines(*renderables: RenderableType) -> list[str]:
    """`rich_lines` of the renderables, laid out without rich where it can (`Grid`, one-line
    `Text`, `Group`s of them): the same lines without rich's cost per cell."""
    out: list[str] = []
    for renderable in renderables:
        fast = _fast_lines(renderable)
        out += rich_lines(renderable) if fast is None else fast
    return out


def plain(*renderables: RenderableType) -> str:
    """`plain_lines` joined, ending in a newline."""
    return "".join(f"{line}\n" for line in plain_lines(*renderables))


def table_lines(
    headers: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int] = ()
) -> list[str]:
    """`table` rendered plain, one string per line (header first), laid out without rich
    (`Grid`)."""
    return plain_lines(grid(headers, rows, right))
