"""The build report from ninja's `.ninja_log`: what took the time, and where to look first.

Three files from one log: a text summary (steps, wall time, compile time, the slowest
translation units, the time per source directory), a Chrome trace (trace-event JSON, as
ninjatracing writes it: one complete event per ninja edge, one thread lane per concurrent job;
it opens in https://ui.perfetto.dev and chrome://tracing), and a PNG picture drawn with
matplotlib when the optional extra `report` is installed.

How the log is read (ninjatracing's rules, https://github.com/nico/ninjatracing):
- an edge with several outputs is listed once per output, every line with the same start,
  end and command hash: the lines of one edge are one step, its time counted once;
- a ninja run's lines come in the order its edges finished; an end time smaller than the one
  before starts a new run (ninja restarted: a resumed build, a rebuild). ninjatracing shows only
  the last run by default; here every run of the log counts (a build resumed after an
  out-of-memory kill is one build in several runs), laid end to end on the trace's timeline;
- an output listed again later was built again: its latest line supersedes the earlier ones.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from torchbuild.core import console
from torchbuild.core.errors import PathError, named_os_errors
from torchbuild.core.safeio import MiB, read_bytes

SUPPORTED_VERSIONS = (5, 6, 7)
# a .ninja_log gains ~100 bytes a compile and ninja recompacts it: a full PyTorch build's is ~2 MiB
NINJA_LOG_LIMIT = 256 * MiB
INSTALL_HINT = "pip install 'torchbuild[report]'"
_HEADER = re.compile(r"# ninja log v(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class Step:
    """One ninja edge: all its outputs, its run, and its times in ms on the report's timeline."""

    outputs: tuple[str, ...]
    start_ms: int
    end_ms: int
    run: int = 0

    @property
    def output(self) -> str:
        """The output that names the step: its object file if it has one, else its first."""
        return next((o for o in self.outputs if is_compile(o)), self.outputs[0])

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000

    @property
    def name(self) -> str:
        more = len(self.outputs) - 1
        return self.output + (f" (+{more} more outputs)" if more else "")


@dataclasses.dataclass(frozen=True)
class _Line:
    run: int
    start: int
    end: int
    output: str
    cmdhash: str
    mtime_ns: int = 0  # the output's modification time as ninja recorded it (0: v5 logs may hold 0)

    def origins(self) -> tuple[float, float]:
        """When (seconds since the epoch) the ninja run that made this line can have started: its
        output was written after the step started (`start` ms after that ninja's start) and before
        ninja took its end, which on a loaded machine comes late, after the compiler wrapper has
        stored the object in ccache (the real build's came up to 2 minutes after the write). It
        survives ninja's recompaction, which loses the lines' order."""
        written = self.mtime_ns / 1e9
        return written - self.end / 1000, written - self.start / 1000


@dataclasses.dataclass(frozen=True)
class LogMark:
    """Where a `.ninja_log` ended before a build: the report then covers only what came after."""

    file_id: tuple[int, int]  # (st_dev, st_ino): ninja rewrites the file under a new inode when it recompacts
    lines: int
    # the entry lines then: a recompacted log (CMake's regeneration runs `ninja -t recompact`, and a
    # scikit-build-core tree regenerates on every build) keeps them as they were, so what is not
    # among them is this build's
    entries: frozenset[str] = frozenset()


def mark(ninja_log: Path) -> LogMark | None:
    """The log's end now (None if there is no log yet): pass it to write_report after the build."""
    with named_os_errors(ninja_log, "reading the ninja log"):
        if not ninja_log.is_file():
            return None
        st = ninja_log.stat()
    raw = read_bytes(ninja_log, NINJA_LOG_LIMIT, "reading the ninja log")
    entries = frozenset(raw.decode(errors="replace").split("\n")[1:])
    return LogMark((st.st_dev, st.st_ino), raw.count(b"\n"), entries)


def _log_lines(path: Path, since: LogMark | None = None) -> list[str]:
    """The entry lines of the log (after `since` if the file is still the one marked)."""
    with named_os_errors(path, "reading the ninja log"):
        st = path.stat()
    text = read_bytes(path, NINJA_LOG_LIMIT, "reading the ninja log").decode(errors="replace")
    lines = text.split("\n")
    m = _HEADER.match(lines[0]) if lines else None
    if not m or int(m.group(1)) not in SUPPORTED_VERSIONS:
        found = repr(lines[0][:40]) if lines else "an empty file"
        raise PathError(
            f"{path} is not a ninja log this report reads (header {found}; "
            f"expected '# ninja log v5' to 'v{SUPPORTED_VERSIONS[-1]}')",
            hint="the build itself is unaffected; update torchbuild to read this ninja's log format",
        )
    if since is None:
        return lines[1:]
    if since.file_id == (st.st_dev, st.st_ino) and since.lines <= len(lines):
        return lines[since.lines :]
    return [ln for ln in lines[1:] if ln not in since.entries]  # recompacted: the entries it did not have


def _parse(lines: Iterable[str]) -> list[_Line]:
    """Entry lines (start, end, mtime, output, hash) with the ninja run each belongs to."""
    out: list[_Line] = []
    run, last_end = 0, 0
    for line in lines:
        parts = line.split("\t")
        if line.startswith("#") or len(parts) != 5 or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        start, end = int(parts[0]), int(parts[1])
        if end < last_end:
            run += 1
        last_end = end
        mtime = int(parts[2]) if parts[2].isdigit() else 0
        out.append(_Line(run, start, end, parts[3], parts[4], mtime))
    return out


def _latest(lines: list[_Line]) -> list[_Line]:
    """Each output's last line: an output built again supersedes its earlier builds."""
    last = {ln.output: i for i, ln in enumerate(lines)}
    return [ln for i, ln in enumerate(lines) if last[ln.output] == i]


def _run_offsets(lines: list[_Line], shown: set[int]) -> dict[int, int]:
    """Where each shown run starts on the timeline: the shown runs one after the other."""
    span: dict[int, int] = defaultdict(int)
    for ln in lines:
        span[ln.run] = max(span[ln.run], ln.end)
    offsets, at = {}, 0
    for run in sorted(shown):
        offsets[run] = at
        at += span[run]
    return offsets


def read_ninja_log(path: Path, since: LogMark | None = None) -> list[Step]:
    """The steps (edges) of a `.ninja_log`, v5 to v7, in the order they finished; with `since`,
    only those ninja logged after that mark (if ninja recompacted the log since: those it lacked)."""
    lines = _parse(_log_lines(path, since))
    kept = _latest(lines)
    offsets = _run_offsets(lines, {ln.run for ln in kept})
    edges: dict[tuple[int, int, int, str], list[str]] = {}
    for ln in kept:
        edges.setdefault((ln.run, ln.start, ln.end, ln.cmdhash), []).append(ln.output)
    return [
        Step(tuple(outs), offsets[run] + start, offsets[run] + end, run) for (run, start, end, _), outs in edges.items()
    ]


@dataclasses.dataclass(frozen=True)
class RunSteps:
    """A whole build's steps across the runs that made it (builder/runs.py's records)."""

    steps: list[Step]  # every output's latest step (times from its own run's ninja start)
    spans: list[float]  # per recorded run, ninja's wall time in it (s; 0 for a run that compiled nothing)
    last_write: list[float | None]  # per recorded run, when ninja last logged a step of it (s since the epoch)
    unplaced: int  # latest lines no recorded run started (made before the record began)


# seconds of slack for the clocks: a file's time comes from the kernel's coarse clock, up to a tick
# (<= 10 ms) behind time.time(). No more: the next run can start well within a second of a cut
# run's last write (a resubmitted job, a test), and a wider slack gave the cut run's steps to it.
# A start recorded late is what would need more, and none is: a backfilled record's starts
# (benchmarks/real_wheel.py) are floored to whole seconds, so early.
_SLACK_S = 0.05


def read_across_runs(path: Path, starts: Sequence[float], ends: Sequence[float | None]) -> RunSteps:
    """The whole log's latest steps, each placed in the recorded run (start, recorded end or None
    for a run that was cut: seconds since the epoch) during which its ninja started: the last run
    that started before the line's output was written and before the step started (Line.origins),
    if that run had not ended before the earliest the step can have started. A line whose output
    ninja did not rewrite (a restat step: code generation that made the same file) keeps the time
    its file was written, so its origins fall before its run: it is left out of the spans, and
    counted as unplaced only where the file was written before the first recorded run (a run the
    record misses)."""
    kept = _latest(_parse(_log_lines(path)))
    spans = [0.0] * len(starts)
    last_write: list[float | None] = [None] * len(starts)
    unplaced = 0
    for ln in kept:
        written = ln.mtime_ns / 1e9
        earliest, latest = ln.origins()
        at = next((i for i in reversed(range(len(starts))) if starts[i] - _SLACK_S <= min(latest, written)), None)
        end = ends[at] if at is not None else None
        if at is not None and (end is None or earliest <= end + _SLACK_S):
            spans[at] = max(spans[at], ln.end / 1000)
            last_write[at] = max(last_write[at] or 0.0, written)
        elif not starts or not ln.mtime_ns or written < starts[0] - _SLACK_S:
            unplaced += 1
    # one edge's lines share start, end and command hash (not the run number: a recompacted log
    # has lost the order it is read from)
    edges: dict[tuple[int, int, str], list[str]] = {}
    for ln in kept:
        edges.setdefault((ln.start, ln.end, ln.cmdhash), []).append(ln.output)
    steps = [Step(tuple(outs), start, end) for (start, end, _), outs in edges.items()]
    return RunSteps(steps, spans, last_write, unplaced)


def outputs_of(path: Path) -> list[str]:
    """Every output line of a `.ninja_log` in order (an output listed twice was built twice)."""
    return [ln.output for ln in _parse(_log_lines(path))]


_OBJ_DIR = re.compile(r"(^|/)CMakeFiles/[^/]+\.dir/")


def source_dir(output: str) -> str:
    """caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/Foo.cpp.o -> aten/src/ATen/native"""
    rel = _OBJ_DIR.sub("/", output).lstrip("/")
    parts: list[str] = []
    for part in rel.split("/")[:-1]:
        if part == "__":
            if parts:
                parts.pop()
        elif part:
            parts.append(part)
    return "/".join(parts) or "."


def source_path(output: str) -> str:
    """caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/Foo.cpp.o -> aten/src/ATen/native/Foo.cpp.o"""
    d = source_dir(output)
    name = output.rsplit("/", 1)[-1]
    return name if d == "." else f"{d}/{name}"


def is_compile(output: str) -> bool:
    return output.endswith((".o", ".obj"))


def lanes(steps: Sequence[Step]) -> list[int]:
    """A thread lane per step (same order) such that the steps of one lane never overlap, in
    as few lanes as the build had jobs running at once (ninjatracing's reconstruction)."""
    order = sorted(range(len(steps)), key=lambda i: (steps[i].start_ms, steps[i].end_ms))
    busy: list[tuple[int, int]] = []  # (free from, lane)
    free: list[int] = []
    lane_of = [0] * len(steps)
    for i in order:
        while busy and busy[0][0] <= steps[i].start_ms:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else len(busy) + len(free)
        heapq.heappush(busy, (steps[i].end_ms, lane))
        lane_of[i] = lane
    return lane_of


@dataclasses.dataclass(frozen=True)
class Report:
    steps: int
    compile_steps: int
    runs: int
    wall_seconds: float
    total_seconds: float
    max_jobs: int
    slowest: list[Step]
    per_dir: list[tuple[str, float, int]]  # directory, seconds, units


def summarize(steps: Sequence[Step], top: int = 15) -> Report:
    compiles = [s for s in steps if is_compile(s.output)]
    per: dict[str, list[float]] = defaultdict(list)
    for s in compiles:
        per[source_dir(s.output)].append(s.seconds)
    per_dir = sorted(((d, sum(v), len(v)) for d, v in per.items()), key=lambda x: -x[1])
    return Report(
        steps=len(steps),
        compile_steps=len(compiles),
        runs=len({s.run for s in steps}),
        wall_seconds=max((s.end_ms for s in steps), default=0) / 1000,
        total_seconds=sum(s.seconds for s in steps),
        max_jobs=max(lanes(steps), default=-1) + 1,
        slowest=sorted(compiles, key=lambda s: -s.seconds)[:top],
        per_dir=per_dir[:top],
    )


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{seconds:.1f} s"


def render_text(report: Report, source: str = ".ninja_log") -> str:
    if not report.steps:
        return f"{source}: no ninja steps recorded (ninja had nothing to rebuild)\n"
    head = (
        f"{source}: {report.steps} steps ({report.compile_steps} compiles) in {report.runs} ninja "
        f"run{'s' if report.runs > 1 else ''}; "
        f"wall time {_duration(report.wall_seconds)}, {report.total_seconds:.1f} s of compile time "
        f"summed over jobs, up to {report.max_jobs} at once"
    )
    slowest = console.table(
        ("seconds", "translation unit"),
        ((f"{s.seconds:.1f}", s.name) for s in report.slowest),
        title="slowest translation units",
        justify=("right", "left"),
    )
    per_dir = console.table(
        ("seconds", "units", "source directory"),
        ((f"{secs:.1f}", n, d) for d, secs, n in report.per_dir),
        title="compile time per source directory",
        justify=("right", "right", "left"),
    )
    return f"{head}\n\n{slowest}\n\n{per_dir}\n"


def trace_events(steps: Sequence[Step], pid: int = 1) -> list[dict[str, Any]]:
    """Chrome trace events: one complete ("X") event per step, times in microseconds."""
    return [
        {
            "name": ", ".join(s.outputs),
            "cat": "compile" if is_compile(s.output) else "other",
            "ph": "X",
            "ts": s.start_ms * 1000,
            "dur": (s.end_ms - s.start_ms) * 1000,
            "pid": pid,
            "tid": lane,
            "args": {"run": s.run},
        }
        for s, lane in zip(steps, lanes(steps))
    ]


def render_trace(steps: Sequence[Step], title: str) -> str:
    meta = {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": title}}
    return json.dumps({"traceEvents": [meta, *trace_events(steps)], "displayTimeUnit": "ms"})


# --------------------------------------------------------------------------- picture


def _short(label: str, chars: int = 60) -> str:
    return label if len(label) <= chars else "…" + label[-(chars - 1) :]


def _timeline(ax: Any, steps: Sequence[Step], slow: set[Step]) -> None:
    """Each job lane as a row, each step a bar on it: gaps show when the build ran few jobs."""
    rows: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for s, lane in zip(steps, lanes(steps)):
        kind = "slowest" if s in slow else ("compile" if is_compile(s.output) else "other")
        rows[(lane, kind)].append((s.start_ms / 60000, max(s.end_ms - s.start_ms, 1) / 60000))
    colors = {"compile": "#3465a4", "other": "#babdb6", "slowest": "#ce5c00"}
    for (lane, kind), bars in rows.items():
        ax.broken_barh(bars, (lane + 0.1, 0.8), facecolors=colors[kind], edgecolor="white", linewidth=0.3)
    for kind, color in colors.items():
        ax.bar(0, 0, color=color, label={"other": "link and other steps", "slowest": "slowest units"}.get(kind, kind))
    starts: dict[int, int] = {}
    for s in steps:
        starts[s.run] = min(starts.get(s.run, s.start_ms), s.start_ms)
    for n, (_, at) in enumerate(sorted(starts.items())[1:]):  # ninja restarted: a resumed build
        label = "ninja restarted" if n == 0 else None
        ax.axvline(at / 60000, color="#cc0000", linestyle="--", linewidth=1, label=label)
    ax.legend(loc="lower right", bbox_to_anchor=(1, 1), ncol=4, fontsize=8, frameon=False)
    ax.set_xlabel("minutes since the first ninja run started")
    ax.set_ylabel("job lane")
    ax.set_ylim(0, max(lanes(steps), default=0) + 1)
    ax.set_xlim(0, max((s.end_ms for s in steps), default=1) / 60000)


def _bars(ax: Any, title: str, rows: list[tuple[str, float]], color: str) -> None:
    labels = [_short(label) for label, _ in rows][::-1]
    values = [v for _, v in rows][::-1]
    ax.barh(range(len(rows)), values, color=color)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_title(title, loc="left", fontsize=10)
    ax.set_xlabel("seconds")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.1f}", va="center", fontsize=7)
    ax.margins(x=0.12)


def render_png(steps: Sequence[Step], report: Report, path: Path, title: str) -> bool:
    """Draw the picture to path; False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401 - imported here: the extra `report` is optional
    except ImportError:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_bars = len(report.slowest) + len(report.per_dir)
    fig = Figure(figsize=(14, 5 + 0.22 * n_bars + 2), layout="constrained")
    FigureCanvasAgg(fig)
    top, middle, bottom = fig.subplots(
        3, 1, height_ratios=[5, max(len(report.slowest), 1) * 0.22 + 1, max(len(report.per_dir), 1) * 0.22 + 1]
    )
    fig.suptitle(
        f"{title}: {report.steps} steps, wall time {_duration(report.wall_seconds)}, "
        f"{report.total_seconds:.0f} s of compile time, up to {report.max_jobs} jobs at once",
        fontsize=11,
    )
    _timeline(top, steps, set(report.slowest))
    _bars(middle, "slowest translation units", [(source_path(s.output), s.seconds) for s in report.slowest], "#ce5c00")
    _bars(bottom, "compile time per source directory", [(d, secs) for d, secs, _ in report.per_dir], "#3465a4")
    fig.savefig(path, format="png", dpi=100)
    return True


# --------------------------------------------------------------------------- files


@dataclasses.dataclass(frozen=True)
class ReportFiles:
    text: Path
    trace: Path
    png: Path | None  # None when matplotlib is not installed (see notice)
    summary: Report
    notice: str | None  # one line for the user when the picture was not drawn


def write_report(
    ninja_log: Path,
    dest_dir: Path,
    stem: str,
    since: LogMark | None = None,
    appendix: Callable[[Report, list[Step]], str] | None = None,
) -> ReportFiles:
    """dest_dir/<stem>.txt, <stem>.trace.json and (with matplotlib) <stem>.png from ninja_log:
    what ninja logged after `since` (from mark() before the build), or the whole log.
    appendix: more text for the summary, from the summary and the steps (the bound, builder/bound.py).

    The stem is used as it is (dots included). The files appear together or not at all:
    PathError or InsufficientSpace (named) if the log cannot be read or dest_dir written.
    """
    steps = read_ninja_log(ninja_log, since)
    summary = summarize(steps)
    final = {
        kind: dest_dir / f"{stem}{ext}" for kind, ext in (("text", ".txt"), ("trace", ".trace.json"), ("png", ".png"))
    }
    with (
        named_os_errors(dest_dir, "writing the build report"),
        tempfile.TemporaryDirectory(prefix=".report-", dir=dest_dir) as tmp,
    ):
        staged = {kind: Path(tmp) / path.name for kind, path in final.items()}
        more = appendix(summary, steps) if appendix is not None and summary.steps else ""
        staged["text"].write_text(render_text(summary, str(ninja_log)) + (f"\n{more}" if more else ""))
        staged["trace"].write_text(render_trace(steps, f"ninja: {ninja_log}"))
        drawn = render_png(steps, summary, staged["png"], stem)
        for kind, path in staged.items():
            if path.exists():
                os.replace(path, final[kind])
    notice = None if drawn else f"no report picture: matplotlib is not installed ({INSTALL_HINT})"
    return ReportFiles(final["text"], final["trace"], final["png"] if drawn else None, summary, notice)
