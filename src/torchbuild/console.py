"""Tables and text for people, through rich: one place that decides how a table looks.

Tables are rendered to plain text (no colour codes) so the same string can go to a terminal,
a CI log and a log file alike.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

WIDTH = 160


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    title: str | None = None,
    justify: Sequence[str] = (),
    header: bool = True,
) -> str:
    """rows under columns as aligned plain text; justify names each column's alignment
    (left, right, center; default left)."""
    t = Table(
        title=title, box=box.SIMPLE_HEAD if header else None, show_header=header, pad_edge=False, title_justify="left"
    )
    for i, name in enumerate(columns):
        t.add_column(name, justify=justify[i] if i < len(justify) else "left", overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*(str(cell) for cell in row))
    return render(t)


def render(renderable: object) -> str:
    """Any rich renderable as plain text, trailing spaces stripped."""
    buf = io.StringIO()
    Console(file=buf, width=WIDTH, color_system=None, force_terminal=False, soft_wrap=False).print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n")
