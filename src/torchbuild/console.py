"""Tables and text for people, through rich: one place that decides how a table looks.

Tables are rendered to plain text (no colour codes) so the same string can go to a terminal,
a CI log and a log file alike. Every cell is shown as the text it is (`printable`): no rich markup
(`[red]`, `[/bar]`) or emoji codes are interpreted, and no terminal escape sequence or control
character in a value reaches the terminal.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

WIDTH = 160

# ECMA-48 escape sequences, 7- and 8-bit: control strings (OSC, DCS, SOS, PM, APC) up to their
# terminator (BEL or ST), CSI sequences (colours, cursor moves, clearing the screen), and the
# two-character escapes (ESC c resets the terminal)
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|\x1b[ -/]*[0-~]?",
    re.DOTALL,
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # not \t, \n


def printable(value: object) -> str:
    """str(value) safe to show on a terminal: escape sequences removed, and any control
    character but newline and tab (carriage return, BEL, backspace, DEL...) written as its
    escape (\\r, \\x07), so what is shown is what the value holds."""
    text = _ESCAPE_SEQUENCE.sub("", str(value))
    return _CONTROL.sub(lambda m: "\\r" if m.group() == "\r" else f"\\x{ord(m.group()):02x}", text)


def cell(value: object) -> Text:
    """value as a table cell: `printable` text that rich shows as is (markup and emoji codes
    such as `[red]`, `[/bar]` or `:smile:` are not interpreted)."""
    return Text(printable(value))


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
        title=cell(title) if title is not None else None,
        box=box.SIMPLE_HEAD if header else None,
        show_header=header,
        pad_edge=False,
        title_justify="left",
    )
    for i, name in enumerate(columns):
        t.add_column(cell(name), justify=justify[i] if i < len(justify) else "left", overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*(cell(value) for value in row))
    return render(t)


def render(renderable: object) -> str:
    """Any rich renderable as plain text, trailing spaces stripped."""
    buf = io.StringIO()
    Console(file=buf, width=WIDTH, color_system=None, force_terminal=False, soft_wrap=False).print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n")
