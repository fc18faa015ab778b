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
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

WIDTH = 160
# Why a table is not always rich's: rich measures and renders each cell as a renderable of its own
# (Padding, Text.wrap, Segment lines), so a table's time grows with its cells. Measured here with
# rich 15.0 (2 cores, 2026-11-28) on the table of a diff of two 40k-member wheels (40,000 rows, 4
# columns): rich 12.9 s, _aligned 0.37 s for the same text; 10,000 rows 4.9 s against 0.15 s.
# rich has no switch for a table of one-line cells (no_wrap=True was no faster). So a table of
# more than FAST_ROWS rows whose cells each fit on one line is laid out by _aligned, to the text
# rich makes (tests/unit/runtime/test_bad_inputs_manifest.py compares the two on random tables);
# every other table, and every table up to FAST_ROWS rows, is rich's.
FAST_ROWS = 200

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

# Credentials in a URL: the password of user:password@ (any scheme), the whole userinfo of an
# http(s) or redis URL (a token written as the user: https://TOKEN@github.com; ssh's git@ is no
# secret), and the value of a query parameter named like one (?password=, &access_token=, ?sig=)
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^\s/@?#'\"]+)@")
_TOKEN_USER_SCHEMES = ("http", "https", "redis", "rediss")
_SECRET_PARAMETER = re.compile(
    r"([?&;][A-Za-z0-9_.-]*?(?:password|passwd|pwd|pass|token|secret|key|auth|sig|signature|credential)"
    r"[A-Za-z0-9_.-]*=)[^&;#\s'\"]*",
    re.IGNORECASE,
)
REDACTED = "***"


def redact(text: str) -> str:
    """text with the credentials of every URL in it replaced by ***: what torchbuild prints or
    writes (errors, config, logs, manifests) never repeats a password or token it was given."""

    def userinfo(m: re.Match[str]) -> str:
        scheme, info = m.group(1), m.group(2)
        user, colon, _ = info.partition(":")
        if colon:
            return f"{scheme}{user}:{REDACTED}@"
        if scheme[:-3].lower() in _TOKEN_USER_SCHEMES:
            return f"{scheme}{REDACTED}@"
        return m.group(0)

    return _SECRET_PARAMETER.sub(lambda m: m.group(1) + REDACTED, _USERINFO.sub(userinfo, text))


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
    listed = [list(row) for row in rows]
    if len(listed) > FAST_ROWS:
        text = _aligned(columns, listed, title, justify, header)
        if text is not None:
            return text
    t = Table(
        title=cell(title) if title is not None else None,
        box=box.SIMPLE_HEAD if header else None,
        show_header=header,
        pad_edge=False,
        title_justify="left",
    )
    for i, name in enumerate(columns):
        t.add_column(cell(name), justify=justify[i] if i < len(justify) else "left", overflow="fold")  # type: ignore[arg-type]
    for row in listed:
        t.add_row(*(cell(value) for value in row))
    return render(t)


def _aligned(
    columns: Sequence[str], rows: list[list[object]], title: str | None, justify: Sequence[str], header: bool
) -> str | None:
    """The text rich renders for this table when no cell or title wraps, laid out here in one
    pass; None where rich has to decide (a cell of several lines or with whitespace other than
    spaces, a centred column, a table wider than WIDTH, a title wider than the table)."""
    n = len(columns)
    aligns = [justify[i] if i < len(justify) else "left" for i in range(n)]
    if any(a not in ("left", "right") for a in aligns) or any(len(row) > n for row in rows) or title == "":
        return None
    body = [[printable(v) for v in row] + [""] * (n - len(row)) for row in rows]
    every = [[printable(c) for c in columns], *body] if header else body
    if any(not c.replace(" ", "x").isprintable() for row in every for c in row):
        return None  # a line break, a tab, or a space rich may wrap at (no-break, ideographic...)
    widths = [max(cell_len(row[i]) for row in every) for i in range(n)]
    gap = 3 if header else 2  # padding either side, and SIMPLE_HEAD's blank column rule
    inner = sum(widths) + gap * (n - 1)
    width = inner + (2 if header else 0)  # SIMPLE_HEAD's blank edges
    shown_title = None if title is None else printable(title)
    if shown_title is not None and (not shown_title.replace(" ", "x").isprintable() or cell_len(shown_title) > width):
        return None
    if min(widths) == 0 or width > WIDTH:
        return None

    def line(row: list[str]) -> str:
        cells = (
            c + " " * (w - cell_len(c)) if a == "left" else " " * (w - cell_len(c.rstrip())) + c.rstrip()
            for c, w, a in zip(row, widths, aligns)
        )
        return (" " if header else "") + (" " * gap).join(cells)

    lines = [] if shown_title is None else [shown_title]
    if header:
        lines += ["", line(every[0]), " " + "\u2500" * inner]
    lines += [line(row) for row in body]
    return "\n".join(text.rstrip() for text in lines).strip("\n")


def render(renderable: object) -> str:
    """Any rich renderable as plain text, trailing spaces stripped."""
    buf = io.StringIO()
    Console(file=buf, width=WIDTH, color_system=None, force_terminal=False, soft_wrap=False).print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n")
