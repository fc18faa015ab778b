"""Directories torchbuild makes, and the ones a failed task leaves empty.

A task that fails should leave the file system as it found it: `invoke submit` refused by the
scheduler left ./out, out/logs and out/.torchbuild/jobs/<key> behind, empty; a failed install
the parents it had made for --prefix. `make_dirs` is mkdir -p that records each directory it
created; `removing_made_dirs` (around every task: tasks/common.handles_errors) removes those
that are empty when the task fails, deepest first. Only empty ones: rmdir(2) refuses anything
else, so nothing the run (or anyone) wrote there is lost, and a directory shared with another
run that put a file in it meanwhile stays.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from pathlib import Path

# the directories make_dirs created inside the innermost removing_made_dirs, in creation order
_MADE: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("torchbuild_made_dirs", default=None)


def make_dirs(path: str | os.PathLike[str]) -> Path:
    """Path(path).mkdir(parents=True, exist_ok=True), recording each directory it created (for
    removing_made_dirs); OSError as mkdir raises it. Returns the path."""
    p = Path(path)
    missing: list[Path] = []
    d = p.absolute()
    while not os.path.lexists(d) and d != d.parent:
        missing.append(d)
        d = d.parent
    try:
        p.mkdir(parents=True, exist_ok=True)
    finally:
        made = _MADE.get()
        if made is not None:
            made.extend(m for m in reversed(missing) if m.is_dir() and not m.is_symlink())
    return p


def remove_empty(dirs: list[Path]) -> None:
    """rmdir each of dirs that is empty, deepest (last made) first; the others stay."""
    for d in reversed(dirs):
        with contextlib.suppress(OSError):
            d.rmdir()


@contextlib.contextmanager
def removing_made_dirs() -> Iterator[None]:
    """On any failure inside (an exception, Ctrl-C), the directories make_dirs created inside
    that are empty then are removed; on success they stay (and count for an enclosing block)."""
    outer = _MADE.get()
    made: list[Path] = []
    token = _MADE.set(made)
    try:
        yield
    except BaseException:
        remove_empty(made)
        raise
    finally:
        _MADE.reset(token)
    if outer is not None:
        outer.extend(made)
