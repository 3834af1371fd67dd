"""How the verbs print tables: one `rich` table style for `top`, `report`, `replay`,
`stack` and `topics`, rendered plain or styled.

A table is columns two spaces apart, without borders, text to the left and the `right`
columns (figures) to the right, header and cells alike. Rendered plain (`plain`) it is
text a pipe, `grep` and `awk` read: no escape, no box drawing, no trailing blank, no
wrapping however wide; on a terminal (`gpuwatch top`'s live view) the same table shows
its header in bold, its lines cut at the right edge as the plain ones would be. Cells
are `Text`, never markup: a pod or alert named `[x]` prints as is.
"""

from __future__ import annotations

import io
from collections.abc import Collection, Iterable, Sequence
from typing import Final

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["HEADER_STYLE", "WIDE", "plain", "plain_lines", "table", "table_lines"]

HEADER_STYLE: Final = "bold"
WIDE: Final = 100_000  # a plain rendering never wraps or cuts: the reader's pipe decides


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


def plain_lines(*renderables: RenderableType) -> list[str]:
    """The renderables as plain text lines: no style, no escape, right ends stripped."""
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


def plain(*renderables: RenderableType) -> str:
    """`plain_lines` joined, ending in a newline."""
    return "".join(f"{line}\n" for line in plain_lines(*renderables))


def table_lines(
    headers: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int] = ()
) -> list[str]:
    """`table` rendered plain, one string per line (header first)."""
    return plain_lines(table(headers, rows, right))
