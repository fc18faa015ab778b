"""builder/bound.py: the lower bound of a build's ninja part on its jobs (the work over the jobs,
or the longest dependency chain from ninja's own graph), and the report's lines about it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torchbuild.builder.bound import bound_of, longest_chain, ninja_graph, not_this_run, parse_graph, render_bound
from torchbuild.runtime import manifest
from torchbuild.runtime.report import Step, write_report

# a code generator with two outputs, a unit that includes one, another that does not, a library
# linking both (order-only on the second output), and the phony default
BUILD_NINJA = """rule cc
  command = touch $out
rule multi
  command = touch $out
build gen.h gen2.h: multi gen.py
build a.o: cc a.c | gen.h
build b.o: cc b.c
build lib.so: cc a.o b.o || gen2.h
build all: phony lib.so
default all
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if shutil.which("ninja") is None:
        pytest.fail("ninja is not installed (.ci/run installs ninja-build)")
    (tmp_path / "build.ninja").write_text(BUILD_NINJA)
    for f in ("gen.py", "a.c", "b.c"):
        (tmp_path / f).touch()
    return tmp_path


def test_ninja_graph_read_back_as_each_file_and_what_it_waits_for(tree: Path):
    dot = ninja_graph(tree)
    assert dot is not None
    deps = parse_graph(dot)
    assert deps["a.o"] == {"a.c", "gen.h"}
    assert deps["b.o"] == {"b.c"}
    assert deps["lib.so"] == {"a.o", "b.o", "gen2.h"}  # the order-only input orders it too
    assert deps["gen.h"] == deps["gen2.h"] == {"gen.py"}
    assert deps["all"] == {"lib.so"}


def test_no_graph_where_ninja_cannot_read_the_tree(tmp_path: Path):
    assert ninja_graph(tmp_path) is None  # no build.ninja
    assert ninja_graph(tmp_path, ninja=str(tmp_path / "no-ninja")) is None


def test_the_longest_chain_is_generator_then_unit_then_link(tree: Path):
    deps = parse_graph(ninja_graph(tree) or "")
    # b.o alone is longer than a.o, but gen.h before a.o makes that chain the longest
    seconds = {"gen.h": 4.0, "gen2.h": 4.0, "a.o": 3.0, "b.o": 5.0, "lib.so": 2.0}
    total, chain = longest_chain(deps, seconds)
    assert (total, chain) == (9.0, ["gen.h", "a.o", "lib.so"])


def _steps(*rows: tuple[tuple[str, ...], int, int]) -> list[Step]:
    return [Step(outs, start, end) for outs, start, end in rows]


def test_the_bound_is_the_larger_of_the_work_over_the_jobs_and_the_chain(tree: Path):
    deps = parse_graph(ninja_graph(tree) or "")
    steps = _steps(
        (("gen.h", "gen2.h"), 0, 4000), (("b.o",), 0, 5000), (("a.o",), 4000, 7000), (("lib.so",), 7000, 9000)
    )
    two = bound_of(steps, deps, jobs=2)
    assert (two.work_seconds, two.chain_seconds, two.seconds) == (7.0, 9.0, 9.0)
    assert two.limited_by == "the dependency chain"
    one = bound_of(steps, deps, jobs=1)  # 14 s of work on one job cannot take less than 14 s
    assert (one.seconds, one.limited_by) == (14.0, "the work over the jobs")
    text = render_bound(two, ninja_wall=9.9, build_wall=19.8)
    assert "lower bound on 2 jobs: 9.0 s, limited by the dependency chain" in text
    assert "ninja wall time 9.9 s = 1.10 x the bound" in text
    assert "build wall time 19.8 s = 2.20 x the bound (9.9 s outside ninja" in text
    assert "the chain ends: gen.h -> a.o -> lib.so" in text


def test_without_the_graph_the_bound_is_the_work_and_says_so():
    b = bound_of(_steps((("a.o",), 0, 4000), (("b.o",), 0, 4000)), None, jobs=2)
    assert (b.seconds, b.chain) == (4.0, ())
    assert "ninja's graph was not available" in render_bound(b, 4.0)


def test_the_report_carries_the_bound_and_the_manifest_its_record(tmp_path: Path):
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n0\t4000\t0\ta.o\tx1\n0\t4000\t0\tb.o\tx2\n4000\t5000\t0\tlib.so\tx3\n")
    files = write_report(
        log,
        tmp_path,
        "report",
        appendix=lambda summary, steps: render_bound(bound_of(steps, None, 2), summary.wall_seconds),
    )
    text = files.text.read_text()
    assert "lower bound on 2 jobs: 4.5 s" in text and "ninja wall time 5.0 s = 1.11 x the bound" in text
    rec = manifest.ReportRecord(
        text="report.txt",
        efficiency=manifest.EfficiencyRecord(
            jobs=2,
            bound_s=4.5,
            work_s=4.5,
            chain_s=0.0,
            limited_by="the work over the jobs",
            ninja_wall_s=5.0,
            build_wall_s=9.0,
        ),
    )
    assert rec.efficiency is not None and rec.efficiency.ratio == 2.0


def test_graph_labels_with_escaped_quotes_and_no_time_for_sources():
    dot = '"0x1" [label="src/a \\"b\\".cpp"]\n"0x2" [label="a.o"]\n"0x1" -> "0x2" [label=" cc"]\n'
    deps = parse_graph(dot)
    assert deps["a.o"] == {'src/a "b".cpp'}
    assert longest_chain(deps, {"a.o": 1.5}) == (1.5, ["a.o"])


def test_deep_chains_need_no_recursion():
    n = 5000  # deeper than Python's recursion limit
    deps = {f"f{i}": ({f"f{i - 1}"} if i else set()) for i in range(n)}
    total, chain = longest_chain(deps, {f"f{i}": 1.0 for i in range(n)})
    assert total == n and len(chain) == n and chain[0] == "f0"


def test_nodes_ninja_leaves_undeclared_are_kept_by_their_id():
    """ninja's graph of a CMake tree (minitorch with MINITORCH_SLOW_UNITS) has a phony step whose
    second output is never declared: the graph still reads, the chain still runs through it."""
    dot = "\n".join(
        [
            '"0x1" [label="slow/unit_1.done"]',
            '"0x2" [label="phony", shape=ellipse]',
            '"0x2" -> "0x3"',
            '"0x2" -> "0x4"',
            '"0x1" -> "0x2" [arrowhead=none]',
            '"0x3" [label="CMakeFiles/slow_units"]',
            '"0x4" -> "0x5" [label=" phony"]',
            '"0x5" [label="all"]',
        ]
    )
    deps = parse_graph(dot)
    assert deps["CMakeFiles/slow_units"] == {"slow/unit_1.done"} and deps["0x4"] == {"slow/unit_1.done"}
    assert longest_chain(deps, {"slow/unit_1.done": 8.0}) == (8.0, ["slow/unit_1.done"])


@pytest.mark.parametrize(
    ("ninja_wall", "build_wall", "mixed"),
    [
        (4800.0, 5047.6, False),  # the steps fit in the run that made them
        (5100.0, 5047.6, False),  # ninja's clock and the run's agree within 5 %
        # the real Debian build's last runs after cuts: the log held every run's steps, in the
        # order ninja's recompaction left them (614,065 s of timeline for a 5,048 s run; 174 s)
        (614065.5, 5047.6, True),
        (16686.0, 174.6, True),
    ],
)
def test_a_log_with_earlier_runs_steps_gives_no_efficiency(ninja_wall, build_wall, mixed):
    why = not_this_run(ninja_wall, build_wall)
    assert (why is not None) == mixed
    if mixed:
        assert f"{ninja_wall:.0f} s" in why and "resumed build" in why
