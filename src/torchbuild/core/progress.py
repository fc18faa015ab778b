"""What the terminal sees of a build: ninja's `[n/N]` lines as a progress bar with rate and ETA
on a terminal, as a plain line every so often in CI; and the out-of-memory evidence a failed
compile step leaves in its output."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

from torchbuild.core.dirs import make_dirs
from torchbuild.core.errors import os_fault

NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]\s")
MODES = ("auto", "bar", "lines", "raw")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class _Rate(ProgressColumn):
    """Steps per second over the last 30 s (rich's estimate), as the ETA uses it."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:.2f}/s" if task.speed else "?/s", style="progress.data.speed")


class _Bar:
    """rich's progress bar for ninja's steps, drawn below the other output, redrawn on each
    `[n/N]` line (at most 10 times a second: ccache hits come by the hundred)."""

    def __init__(self, out: TextIO, clock: Callable[[], float]) -> None:
        # a terminal is forced: inside a container `out` is a pipe that a terminal reads at the end
        self.console = Console(file=out, force_terminal=True, soft_wrap=True, highlight=False)
        self.clock = clock
        self.rich = RichProgress(
            TextColumn("ninja"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            _Rate(),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
            get_time=clock,
        )
        self.task: TaskID | None = None
        self.last_draw = float("-inf")

    def update(self, done: int, total: int, new_run: bool) -> None:
        if self.task is None:
            self.rich.start()
            self.task = self.rich.add_task("ninja", total=total, completed=done)
        elif new_run:  # a retry or the next ninja: rate and ETA start again
            self.rich.reset(self.task, total=total, completed=done)
        else:
            self.rich.update(self.task, completed=done)
        now = self.clock()
        if done == total or now - self.last_draw >= 0.1:
            self.rich.refresh()
            self.last_draw = now

    def line(self, text: str) -> None:
        """A line of other output, printed above the bar as it is (its colours kept)."""
        self.console.print(Text.from_ansi(text), highlight=False)

    def finish(self) -> None:
        if self.task is not None:
            self.rich.stop()


class Progress:
    """Turns ninja's `[n/N] ...` lines into progress output; passes every other line on.

    bar: rich's progress bar with rate and ETA (a terminal); lines: `progress: n/N ...` every
    `interval` seconds and at the end (CI logs); raw: every line as it is. The log file always
    gets everything; this only decides what `out` shows.
    """

    def __init__(
        self, out: TextIO, mode: str, interval: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if mode == "auto":
            mode = "bar" if getattr(out, "isatty", lambda: False)() else "lines"
        self.out, self.mode, self.interval, self.clock = out, mode, interval, clock
        self.done = self.total = self.start_done = 0
        self.start = self.last_print = 0.0
        self.bar = _Bar(out, clock) if mode == "bar" else None
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
            if self.bar is not None:
                self.bar.line(line)
            else:
                self.out.write(line + "\n")
            return
        done, total = int(m.group(1)), int(m.group(2))
        now = self.clock()
        new_run = total != self.total or done < self.done  # a new ninja run (a retry, the next step)
        if new_run:
            self.start, self.last_print, self.start_done = now, 0.0, done
        self.done, self.total = done, total
        if self.bar is not None:
            self.bar.update(done, total, new_run)
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

    def finish(self) -> None:
        if self.pending:
            self.line(self.pending)
            self.pending = ""
        if self.bar is not None:
            self.bar.finish()
        self.out.flush()


class Tee:
    """Write to the terminal (or container log stream) and the log file at once."""

    def __init__(self, log: Path, out: TextIO, progress: str = "raw") -> None:
        make_dirs(log.parent)
        self.file = log.open("a", buffering=1)
        self.out = out
        self.progress = Progress(out, progress)

    def write(self, text: str) -> None:
        try:
            self.file.write(text)
        except OSError as exc:  # a full disk shows first here, while the build writes its log
            raise os_fault(exc, self.file.name, "writing the build log") from exc
        self.progress.write(text)
        self.out.flush()

    def line(self, text: str = "") -> None:
        self.write(text + "\n")

    def flush(self) -> None:
        self.out.flush()

    @property
    def path(self) -> Path:
        return Path(self.file.name)

    def close(self) -> None:
        self.progress.finish()
        with contextlib.suppress(OSError):  # a full disk was already reported by write()
            self.file.close()
