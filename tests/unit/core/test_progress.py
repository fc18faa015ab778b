"""What the terminal shows of a build: ninja's [n/N] lines as rich's progress bar with rate and
ETA, or a plain progress line every 30 s for CI logs, or every line as it is."""

from __future__ import annotations

import io
import re

import pytest

from torchbuild.core.progress import MODES, Progress

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(autouse=True)
def _a_capable_terminal(monkeypatch):
    """These tests read the frames a cursor-moving terminal gets. rich draws only the last frame
    for TERM=dumb or unknown, and sudo sets TERM=unknown where it was unset: .ci/run's `sudo bash
    .ci/run` in a GitHub runner (found by running ci.yml's integration row under act)."""
    monkeypatch.setenv("TERM", "xterm-256color")


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _frames(out: io.StringIO) -> list[str]:
    """What a terminal showed, frame by frame: colour codes dropped, split at each redraw."""
    return [f.strip() for f in re.split(r"\r|\n", _ANSI.sub("", out.getvalue())) if f.strip()]


def test_lines_mode_prints_periodic_progress_with_rate_and_eta():
    out, clock = io.StringIO(), _Clock()
    p = Progress(out, "lines", interval=30, clock=clock)
    p.write("-- Configuring done\n")
    for i in range(1, 101):
        clock.t += 1.0
        p.write(f"[{i}/100] Building CXX object f{i}.o\n")
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "-- Configuring done"
    progress = [ln for ln in lines if ln.startswith("progress: ")]
    assert len(progress) == 5, progress  # the first, every 30 s, the last
    assert progress[0] == "progress: 1/100 (1%) 0.00/s elapsed 0s ETA ?"
    assert progress[1] == "progress: 31/100 (31%) 1.00/s elapsed 30s ETA 1m09s"
    assert progress[-1] == "progress: 100/100 (100%) 1.00/s elapsed 1m39s ETA 0s"
    assert not any("Building CXX" in ln for ln in lines)  # ninja lines are in the log only
    assert "\x1b" not in out.getvalue()  # no terminal codes in a CI log


def test_lines_mode_starts_rate_and_eta_again_for_the_next_ninja_run():
    out, clock = io.StringIO(), _Clock()
    p = Progress(out, "lines", interval=30, clock=clock)
    for text in ("[1/4] a\n", "[4/4] b\n", "[1/10] c\n"):
        clock.t += 2
        p.write(text)
    p.finish()
    assert out.getvalue().splitlines()[-1] == "progress: 1/10 (10%) 0.00/s elapsed 0s ETA ?"


def test_the_bar_counts_ninja_steps_with_rate_and_eta_and_keeps_other_output():
    out, clock = io.StringIO(), _Clock()
    p = Progress(out, "bar", clock=clock)
    p.write("-- Configuring done\n")
    for i in range(1, 5):
        clock.t += 2
        p.write(f"[{i}/4] cc\n")
        if i == 2:
            p.write("warning: \x1b[1munused\x1b[0m variable [-Wunused-variable]\n")
    p.finish()
    frames = _frames(out)
    assert frames[0] == "-- Configuring done"
    assert "warning: unused variable [-Wunused-variable]" in frames  # whole, brackets kept, above the bar
    assert re.search(r"3/4\s+75% 0\.50/s elapsed 0:00:04 ETA 0:00:02$", frames[-3]), frames
    assert re.search(r"4/4\s+100% 0\.50/s elapsed 0:00:06 ETA 0:00:00$", frames[-1]), frames
    assert not any(f == "cc" or f.endswith("] cc") for f in frames)  # ninja's lines are in the log only
    assert _ANSI.sub("", out.getvalue()).endswith("\n") and p.done == p.total == 4  # the prompt starts below


def test_the_bar_starts_again_for_the_next_ninja_run():
    out, clock = io.StringIO(), _Clock()
    p = Progress(out, "bar", clock=clock)
    for text in ("[1/4] a\n", "[4/4] b\n", "[1/10] c\n"):
        clock.t += 2
        p.write(text)
    p.finish()
    assert re.search(r"1/10\s+10% \?/s elapsed 0:00:00 ETA -:--:--$", _frames(out)[-1])


def test_raw_mode_passes_everything_through_and_modes_are_listed():
    out = io.StringIO()
    p = Progress(out, "raw")
    p.write("[1/2] cc a.o\npartial")
    p.finish()
    assert out.getvalue() == "[1/2] cc a.o\npartial"
    assert MODES == ("auto", "bar", "lines", "raw")
    assert Progress(io.StringIO(), "auto").mode == "lines"  # not a terminal
