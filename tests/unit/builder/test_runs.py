"""builder/runs.py and the whole-build figures of a build made in several runs: each run notes its
start and end in the tree, the report places the ninja log's steps in the runs by their origin
(their output's time less their end), and gives the whole build's wall over its lower bound."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from torchbuild.builder import runs
from torchbuild.builder.bound import bound_of, efficiency_record, render_across
from torchbuild.runtime import manifest
from torchbuild.runtime.report import read_across_runs

T0 = 1_795_864_000.0  # a start, seconds since the epoch


def test_each_run_notes_its_start_and_end_and_a_cut_run_ends_at_its_logs_last_write(tmp_path: Path):
    build = tmp_path / "build"
    log1, log2 = tmp_path / "run1.log", tmp_path / "run2.log"
    log1.write_text("cut\n")
    os.utime(log1, (T0 + 300, T0 + 300))
    runs.begin(build, "r1", log1, now=T0)  # cut: it never ends
    runs.begin(build, "r2", log2, now=T0 + 1000)
    done = runs.end(build, "r2", now=T0 + 1600)
    assert [r.run_id for r in done] == ["r1", "r2"]
    assert [r.wall for r in done] == [300.0, 600.0]
    assert runs.read_runs(build) == done
    # a log gone and no end: the wall is unknown, not made up
    log1.unlink()
    assert runs.read_runs(build)[0].wall is None


@pytest.mark.parametrize("text", ["not json", '{"runs": [{"start": "x"}]}', '{"other": 1}', "[]"])
def test_a_record_torchbuild_did_not_write_is_no_runs(tmp_path: Path, text: str):
    (tmp_path / runs.RUNS_FILE).write_text(text)
    assert runs.read_runs(tmp_path) == []


def _line(origin: float, start_ms: int, end_ms: int, out: str, h: str) -> str:
    mtime_ns = int((origin + end_ms / 1000) * 1e9)
    return f"{start_ms}\t{end_ms}\t{mtime_ns}\t{out}\t{h}"


def _two_run_log(path: Path, shuffle: bool) -> None:
    """Run 1 (at T0): a generator with two outputs, a.o; cut while b.o was compiling. Run 2
    (at T0+1000): b.o again from its start, then the link. A recompacted log has lost the order."""
    lines = [
        _line(T0 + 10, 0, 2000, "gen.h", "g"),
        _line(T0 + 10, 0, 2000, "gen2.h", "g"),
        _line(T0 + 10, 2000, 6000, "a.o", "a"),
        _line(T0 + 1010, 0, 5000, "b.o", "b"),
        _line(T0 + 1010, 5000, 7000, "lib.so", "l"),
    ]
    if shuffle:
        random.Random(4).shuffle(lines)
    path.write_text("# ninja log v6\n" + "\n".join(lines) + "\n")


@pytest.mark.parametrize("recompacted", [False, True])
def test_the_steps_are_placed_in_the_runs_that_made_them_in_any_order(tmp_path: Path, recompacted: bool):
    log = tmp_path / ".ninja_log"
    _two_run_log(log, recompacted)
    across = read_across_runs(log, [T0, T0 + 1000], [T0 + 100, T0 + 1100])
    assert across.unplaced == 0
    assert across.spans == [6.0, 7.0]  # ninja's wall in each run
    assert sorted(s.outputs for s in across.steps) == [("a.o",), ("b.o",), ("gen.h", "gen2.h"), ("lib.so",)]
    assert sum(s.seconds for s in across.steps) == 13.0  # the two-output step counted once


def test_steps_made_before_the_record_began_give_no_whole_build_figure(tmp_path: Path):
    log = tmp_path / ".ninja_log"
    _two_run_log(log, False)
    # the record knows only the second run: the first run's three lines were made before it
    assert read_across_runs(log, [T0 + 1000], [T0 + 1100]).unplaced == 3


def test_a_restat_output_keeps_its_old_time_and_is_neither_a_span_nor_a_missing_run(tmp_path: Path):
    log = tmp_path / ".ninja_log"
    # the generator ran again in run 2 at 30 s but wrote the same file: its time is run 1's
    log.write_text(
        "# ninja log v6\n"
        + "\n".join([_line(T0 + 10, 0, 2000, "a.o", "a"), f"30000\t31000\t{int((T0 + 12) * 1e9)}\tgen.h\tg"])
        + "\n"
    )
    across = read_across_runs(log, [T0, T0 + 1000], [T0 + 100, T0 + 1100])
    assert across.unplaced == 0 and across.spans == [2.0, 0.0]


def test_a_step_whose_end_ninja_took_long_after_its_object_was_written_stays_in_its_run(tmp_path: Path):
    """The real build under load: ccache stored a big object for two minutes after the compiler
    wrote it, so the object's time less the step's end fell before the run's start (run 4 of the
    Debian build: 1,980 s into its ninja, written 1,859 s after the run began)."""
    log = tmp_path / ".ninja_log"
    run4 = T0 + 1000
    written = run4 + 1859.0
    log.write_text(f"# ninja log v6\n1851516\t1980070\t{int(written * 1e9)}\tSymmetricMemory.cpp.o\th\n")
    across = read_across_runs(log, [T0, run4], [None, None])
    assert across.spans == [0.0, 1980.07] and across.unplaced == 0


def test_a_run_started_within_a_second_of_the_cut_runs_last_write_gets_none_of_its_steps(tmp_path: Path):
    """The cut-and-run-again test's flake (CI of stop 48): run 1's ninja began at T0+5, its slow step
    ran from 0.2 s to 3.2 s and was its last write (T0+8.2); run 2 began 0.3 s later. The step is
    run 1's: its ninja started before T0+8.0, when run 2 had not begun."""
    log = tmp_path / ".ninja_log"
    log.write_text(
        "# ninja log v5\n"
        + "\n".join([_line(T0 + 5, 0, 100, "a.o", "a"), _line(T0 + 5, 200, 3200, "slow_1", "s")])
        + "\n"
        + "\n".join([_line(T0 + 9, 0, 3000, "slow_2", "t"), _line(T0 + 9, 3000, 3100, "lib.so", "l")])
        + "\n"
    )
    across = read_across_runs(log, [T0, T0 + 8.5], [None, T0 + 13])
    assert across.spans == [3.2, 3.1] and across.unplaced == 0


def test_the_report_gives_each_run_and_the_whole_builds_wall_over_its_bound(tmp_path: Path):
    log = tmp_path / ".ninja_log"
    _two_run_log(log, True)
    across = read_across_runs(log, [T0, T0 + 1000], [T0 + 100, T0 + 1100])
    b = bound_of(across.steps, None, jobs=2)
    text = render_across(b, [100.0, 20.0], across.spans)
    assert "made in 2 runs" in text
    assert "run 1" in text and "run 2" in text
    # 13 s of work over 2 jobs; the runs' walls 120 s
    assert "lower bound of all its steps on 2 jobs: 6.5 s" in text
    assert "build wall time over the runs 120.0 s = 18.46 x the bound" in text
    rec = manifest.EfficiencyRecord(**efficiency_record(b, sum(across.spans), 120.0, runs=2))
    assert rec.runs == 2 and rec.ninja_wall_s == 13.0 and round(rec.ratio, 2) == 18.46


def test_a_partial_directory_of_a_run_killed_outright_is_removed_by_the_next_live_ones_kept(tmp_path: Path):
    """A wheel's partial directory is held by the process making it: the next run removes those
    whose maker is gone (a SIGKILL leaves them) and keeps a live run's."""
    import subprocess
    import sys

    from torchbuild.runtime.compile_job import partial_dir, release_partial

    make = (
        "import sys, time; from pathlib import Path; from torchbuild.runtime.compile_job import partial_dir;"
        "p = partial_dir(Path(sys.argv[1]), sys.argv[2], 'the wheel'); (p / 'half.whl').write_bytes(b'x');"
        "print(p, flush=True); time.sleep(float(sys.argv[3]))"
    )
    live = subprocess.Popen(
        [sys.executable, "-c", make, str(tmp_path), "live", "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        live_dir = Path(live.stdout.readline().strip())  # type: ignore[union-attr]
        # a run that ended without removing its partial (as a SIGKILL leaves it), beside the live one
        gone = subprocess.run([sys.executable, "-c", make, str(tmp_path), "dead", "0"], capture_output=True, text=True)
        dead_dir = Path(gone.stdout.strip())
        assert dead_dir.is_dir() and live_dir.is_dir()
        seen: list[str] = []
        mine = partial_dir(tmp_path, "next", "the wheel", seen.append)
        assert not dead_dir.exists() and live_dir.is_dir() and mine.is_dir()
        assert seen == [f"torchbuild: removed {dead_dir.name}, left in {tmp_path} by a run that was cut off"]
        release_partial(mine)
        assert not mine.exists()
    finally:
        live.kill()
        live.wait()
    # something not torchbuild's under a similar name is never touched
    (tmp_path / ".partial-x-other").mkdir()
    partial_dir(tmp_path, "again", "the wheel")
    assert (tmp_path / ".partial-x-other").is_dir()


def test_a_tree_held_by_another_process_is_tree_busy_naming_it(tmp_path: Path):
    import subprocess
    import sys

    from torchbuild.core.errors import TreeBusy

    hold = "import sys, time; from pathlib import Path; from torchbuild.builder import runs; runs.hold_tree(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        with pytest.raises(TreeBusy, match=rf"another build is running in {tmp_path}: process {other.pid} \(python"):
            runs.hold_tree(tmp_path)
    finally:
        other.kill()
        other.wait()
    fd = runs.hold_tree(tmp_path)  # its holder gone, the tree is free
    assert fd is not None
    runs.release_tree(fd)
    assert list(tmp_path.iterdir()) == []  # nothing was written into the tree
