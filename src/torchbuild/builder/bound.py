"""How close a build came to what its cores allow: the lower bound of its ninja part.

No schedule on J jobs can finish the build's steps sooner than the larger of
- the work: every step's time summed, over the J jobs (no job ever idle), and
- the longest dependency chain: the steps that must run one after another (code generation,
  then the units that include what it generated, then the library they link into, ...), each
  for the time ninja logged for it.
The report prints that bound, the ninja wall time over it, and the whole build's wall time over
it with the serial parts outside ninja (configure, packaging) named, so the gap can be read.

The chain comes from ninja's own graph (`ninja -t graph`, Graphviz text: the only form in which
ninja exports its whole graph; `-t query` answers one node at a time, `-t inputs` flattens the
order). No library reads ninja's graph: the parser below reads the dot lines ninja writes
(src/graphviz.cc), nothing else of the dot language.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torchbuild.core import console
from torchbuild.core.process import run_captured
from torchbuild.runtime.report import Step

GRAPH_TIMEOUT_S = 120
# `"0x55fd7c8d8d50" [label="lib.so"]`, `"0x..." [label="cc", shape=ellipse]`
_NODE = re.compile(r'^"(0x[0-9a-f]+)" \[label="((?:[^"\\]|\\.)*)"(, shape=ellipse)?\]$')
# `"0xa" -> "0xb"` with optional attributes
_ARROW = re.compile(r'^"(0x[0-9a-f]+)" -> "(0x[0-9a-f]+)"(?: \[(.*)\])?$')


def parse_graph(dot: str) -> dict[str, set[str]]:
    """ninja's graph as {file: the files its step waits for} (explicit, implicit and order-only
    inputs alike: each one orders the build). A step with several inputs or outputs is an
    ellipse node in ninja's picture; a one-in one-out step is an arrow between two files."""
    files: dict[str, str] = {}
    steps: set[str] = set()
    arrows: list[tuple[str, str]] = []
    for line in dot.splitlines():
        if m := _NODE.match(line):
            (steps.add(m[1]) if m[3] else files.__setitem__(m[1], m[2].replace('\\"', '"')))
        elif m := _ARROW.match(line):
            arrows.append((m[1], m[2]))
    inputs_of: dict[str, set[str]] = {}  # a step node -> its input files
    produced_by: dict[str, str] = {}  # an output file -> its step node
    deps: dict[str, set[str]] = {name: set() for name in files.values()}
    # ninja declares a node when it first visits it, and leaves some out (a second output of a
    # phony step): an undeclared node keeps its id as its name, so no time is lost along it
    for a, b in arrows:
        if b in steps:
            inputs_of.setdefault(b, set()).add(files.get(a, a))
        elif a in steps:
            produced_by[files.get(b, b)] = a
        else:
            deps.setdefault(files.get(b, b), set()).add(files.get(a, a))
    for out, step in produced_by.items():
        deps.setdefault(out, set()).update(inputs_of.get(step, set()))
    return deps


def ninja_graph(build_dir: Path, ninja: str = "ninja") -> str | None:
    """`ninja -C build_dir -t graph` (the default targets), or None where it cannot be had."""
    try:
        done = run_captured([ninja, "-C", str(build_dir), "-t", "graph"], timeout=GRAPH_TIMEOUT_S)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def longest_chain(deps: Mapping[str, Iterable[str]], seconds: Mapping[str, float]) -> tuple[float, list[str]]:
    """The dependency chain whose steps' times add up the most: (its seconds, its files first to
    last). A file's time is its step's (0 for sources and for what this log did not build)."""
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for node in deps:
        stack = [node]
        while stack:  # iterative depth-first: PyTorch's chains are deeper than Python's recursion
            top = stack[-1]
            if top in finish:
                stack.pop()
                continue
            pending = [d for d in deps.get(top, ()) if d not in finish and d in deps]
            if pending:
                stack.extend(pending)
                continue
            before = max(((finish[d], d) for d in deps.get(top, ()) if d in finish), default=(0.0, None))
            finish[top], via[top] = seconds.get(top, 0.0) + before[0], before[1]
            stack.pop()
    if not finish:
        return 0.0, []
    end = max(finish, key=lambda k: finish[k])
    chain: list[str] = []
    at: str | None = end
    while at is not None:
        if seconds.get(at, 0.0) > 0:
            chain.append(at)
        at = via[at]
    return finish[end], chain[::-1]


@dataclasses.dataclass(frozen=True)
class Bound:
    """The lower bound of the ninja part on `jobs` jobs, and what it is made of."""

    jobs: int
    work_seconds: float  # every step's time summed, over the jobs
    chain_seconds: float  # the longest dependency chain (0 where ninja's graph was not had)
    chain: tuple[str, ...]  # its steps' outputs, first to last

    @property
    def seconds(self) -> float:
        return max(self.work_seconds, self.chain_seconds)

    @property
    def limited_by(self) -> str:
        return "the dependency chain" if self.chain_seconds > self.work_seconds else "the work over the jobs"


def bound_of(steps: Sequence[Step], deps: Mapping[str, Iterable[str]] | None, jobs: int) -> Bound:
    seconds = {out: s.seconds for s in steps for out in s.outputs}
    chain_s, chain = longest_chain(deps, seconds) if deps else (0.0, [])
    work = sum(s.seconds for s in steps) / max(jobs, 1)
    return Bound(jobs=max(jobs, 1), work_seconds=work, chain_seconds=chain_s, chain=tuple(chain))


def render_bound(bound: Bound, ninja_wall: float, build_wall: float | None = None) -> str:
    """The lines of the report: the bound, ninja's wall over it, the whole build's over it."""
    if bound.seconds <= 0:
        return "lower bound: no step took measurable time\n"
    lines = [
        f"lower bound on {bound.jobs} job{'s' if bound.jobs > 1 else ''}: {bound.seconds:.1f} s, "
        f"limited by {bound.limited_by} (work over the jobs {bound.work_seconds:.1f} s, "
        f"longest dependency chain {bound.chain_seconds:.1f} s"
        + ("" if bound.chain else ": ninja's graph was not available")
        + ")",
        f"ninja wall time {ninja_wall:.1f} s = {ninja_wall / bound.seconds:.2f} x the bound",
    ]
    if build_wall:
        outside = max(build_wall - ninja_wall, 0.0)
        lines.append(
            f"build wall time {build_wall:.1f} s = {build_wall / bound.seconds:.2f} x the bound "
            f"({outside:.1f} s outside ninja: configure, code generation before it, packaging)"
        )
    if bound.chain:
        tail = bound.chain[-5:]
        lines.append("the chain ends: " + " -> ".join(tail))
    return "\n".join(lines) + "\n"


def not_this_run(ninja_wall: float, build_wall: float) -> str | None:
    """Why the steps read from the ninja log are not this run's alone, or None. Their timeline
    cannot be longer than the run that made them: when it is, the log holds steps of earlier
    runs too (a build resumed after a cut, or a log ninja recompacted, whose entries then lose
    their order) and wall / bound would compare this run's wall with all of their work."""
    if ninja_wall <= build_wall * 1.05 + 5:
        return None
    return (
        f"the ninja log's steps span {ninja_wall:.0f} s, longer than this run's {build_wall:.0f} s: they are "
        "not this run's alone (a resumed build, or a log ninja recompacted)"
    )


def render_across(bound: Bound, walls: Sequence[float], spans: Sequence[float]) -> str:
    """The report's lines for a build made in several runs (builder/runs.py): each run's wall and
    ninja time, and the whole build's over the bound of all its steps. What a cut costs shows as
    the runs' time outside ninja (each run's configure check, code generation, packaging) and the
    steps in flight at a cut, which ninja never logged and the next run compiled again."""
    if bound.seconds <= 0:
        return "lower bound: no step took measurable time\n"
    wall, ninja = sum(walls), sum(spans)
    rows = [
        (f"run {i}", f"{w:.0f} s", f"{s:.0f} s", f"{max(w - s, 0):.0f} s")
        for i, (w, s) in enumerate(zip(walls, spans, strict=True), 1)
    ]
    return (
        f"this build was made in {len(walls)} runs (a build cut off and run again):\n"
        + console.table(("run", "wall", "ninja", "outside ninja"), rows, justify=("left", "right", "right", "right"))
        + f"\nlower bound of all its steps on {bound.jobs} job{'s' if bound.jobs > 1 else ''}: {bound.seconds:.1f} s, "
        f"limited by {bound.limited_by} (work over the jobs {bound.work_seconds:.1f} s, "
        f"longest dependency chain {bound.chain_seconds:.1f} s)\n"
        f"ninja wall time over the runs {ninja:.1f} s = {ninja / bound.seconds:.2f} x the bound\n"
        f"build wall time over the runs {wall:.1f} s = {wall / bound.seconds:.2f} x the bound "
        f"({wall - ninja:.1f} s outside ninja)\n"
    )


def efficiency_record(bound: Bound, ninja_wall: float, build_wall: float, runs: int = 1) -> dict[str, Any]:
    """The manifest's report.efficiency (delivery.manifest.EfficiencyRecord's fields); a build
    made in several runs gives the sums of their walls."""
    return {
        "runs": runs,
        "jobs": bound.jobs,
        "bound_s": round(bound.seconds, 1),
        "work_s": round(bound.work_seconds, 1),
        "chain_s": round(bound.chain_seconds, 1),
        "limited_by": bound.limited_by,
        "ninja_wall_s": round(ninja_wall, 1),
        "build_wall_s": round(build_wall, 1),
    }


def render_heaviest(units: Sequence[Mapping[str, Any]]) -> str:
    """The report's table of the units with the highest peak memory (what the heavy pool plans from)."""
    if not units:
        return ""
    rows = [
        (f"{int(u['peak_rss_bytes']) / 2**20:.0f} MiB", f"{float(u['seconds']):.1f} s", str(u["file"])) for u in units
    ]
    return (
        "\n"
        + console.table(
            ("peak RSS", "seconds", "unit"),
            rows,
            title="units with the highest peak memory",
            justify=("right", "right", "left"),
        )
        + "\n"
    )
