"""What the terminal sees of a build: ninja's `[n/N]` lines as a progress bar with rate and ETA
on a terminal, as a plain line every so often in CI; and the out-of-memory evidence a failed
compile step leaves in its output."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TextIO

NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]\s")
MODES = ("auto", "bar", "lines", "raw")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """Turns ninja's `[n/N] ...` lines into progress output; passes every other line on.

    bar: one line redrawn in place (a terminal); lines: `progress: n/N ...` every `interval`
    seconds and at the end (CI logs); raw: every line as it is. The log file always gets
    everything; this only decides what `out` shows.
    """

    def __init__(
        self, out: TextIO, mode: str, interval: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if mode == "auto":
            mode = "bar" if getattr(out, "isatty", lambda: False)() else "lines"
        self.out, self.mode, self.interval, self.clock = out, mode, interval, clock
        self.done = self.total = self.start_done = 0
        self.start = self.last_print = 0.0
        self.bar_shown = False
        self.pending = ""

    def write(self, text: str) -> None:
        if self.mode == "raw":
            self.out.write(text)
            return
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.line(line)

    def line(self, line: str) -> None:
        m = NINJA_RE.match(line)
        if not m:
            self._clear_bar()
            self.out.write(line + "\n")
            if self.mode == "bar" and self.total:
                self._draw_bar()
            return
        done, total = int(m.group(1)), int(m.group(2))
        now = self.clock()
        if total != self.total or done < self.done:  # a new ninja run (a retry, the next step)
            self.start, self.last_print, self.start_done = now, 0.0, done
        self.done, self.total = done, total
        if self.mode == "bar":
            self._draw_bar()
        elif done == total or now - self.last_print >= self.interval or self.last_print == 0.0:
            self.out.write(f"progress: {self.status()}\n")
            self.last_print = now

    def status(self) -> str:
        elapsed = self.clock() - self.start
        rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        pct = 100 * self.done / self.total if self.total else 0.0
        return (
            f"{self.done}/{self.total} ({pct:.0f}%) {rate:.2f}/s "
            f"elapsed {_duration(elapsed)} ETA {_duration(eta) if rate > 0 else '?'}"
        )

    def _draw_bar(self) -> None:
        width = 30
        filled = int(width * self.done / self.total) if self.total else 0
        self.out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.status()}\x1b[K")
        self.bar_shown = True
        self.out.flush()

    def _clear_bar(self) -> None:
        if self.bar_shown:
            self.out.write("\r\x1b[K")
            self.bar_shown = False

    def finish(self) -> None:
        if self.pending:
            self.line(self.pending)
            self.pending = ""
        if self.bar_shown:
            self.out.write("\n")
            self.bar_shown = False
        self.out.flush()
