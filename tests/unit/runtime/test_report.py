"""The build report from ninja's .ninja_log: steps counted per edge, runs, the text summary, the
Chrome trace, the matplotlib picture (or the notice without it), and the file names."""

from __future__ import annotations

import json
import os
import random
import struct
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from torchbuild.core.errors import PathError
from torchbuild.runtime.report import Step, lanes, mark, read_ninja_log, source_dir, summarize, write_report


def _log(path: Path, *entries: tuple[int, int, str, str], version: int = 5, append: bool = False) -> Path:
    """entries: (start_ms, end_ms, output, hash), written as ninja does (mtime in the 3rd field)."""
    lines = [f"{s}\t{e}\t{1700000000000000000 + e}\t{out}\t{h}\n" for s, e, out, h in entries]
    with path.open("a" if append else "w") as f:
        f.write(("" if append else f"# ninja log v{version}\n") + "".join(lines))
    return path


CODEGEN = [(0, 42_000, f"aten/src/ATen/RegisterCPU_{i}.cpp", "5f3a9c") for i in range(3)]


@pytest.mark.parametrize("version", [5, 6, 7])
def test_an_edge_with_three_outputs_is_one_step_counted_once(tmp_path, version):
    log = _log(tmp_path / ".ninja_log", *CODEGEN, (42_000, 43_000, "lib/libc10.so", "77"), version=version)
    files = write_report(log, tmp_path, "report")
    assert files.summary.steps == 2
    assert files.summary.total_seconds == pytest.approx(43.0)  # 42 s once, not 3 x 42 s
    assert files.summary.wall_seconds == pytest.approx(43.0)
    assert "2 steps (0 compiles) in 1 ninja run; wall time 43.0 s, 43.0 s of compile time" in files.text.read_text()
    (codegen,) = (s for s in read_ninja_log(log) if len(s.outputs) == 3)
    assert codegen.name == "aten/src/ATen/RegisterCPU_0.cpp (+2 more outputs)"


NINJA_LOG = [
    (0, 1500, "c10/CMakeFiles/c10.dir/core/TensorImpl.cpp.o", "abc"),
    (0, 9000, "caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/cpu/int4mm_kernel.cpp.DEFAULT.cpp.o", "def"),
    (100, 9100, "caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/Foo.cpp.o", "ghi"),
    (9100, 9200, "lib/libc10.so", "jkl"),
]


def test_a_rebuilt_output_counts_once_with_its_latest_time(tmp_path):
    log = _log(tmp_path / ".ninja_log", *NINJA_LOG)
    _log(log, (0, 500, "c10/CMakeFiles/c10.dir/core/TensorImpl.cpp.o", "abc"), append=True)  # ninja ran again
    steps = read_ninja_log(log)
    assert len(steps) == 4
    rep = summarize(steps)
    assert rep.compile_steps == 3 and rep.runs == 2
    assert rep.slowest[0].output.endswith("int4mm_kernel.cpp.DEFAULT.cpp.o") and rep.slowest[0].seconds == 9.0
    assert rep.per_dir[0] == ("aten/src/ATen/native/cpu", 9.0, 1)
    assert ("c10/core", 0.5, 1) in rep.per_dir
    assert source_dir("caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/Foo.cpp.o") == "aten/src/ATen/native"


def test_runs_after_a_restart_follow_each_other_on_the_timeline(tmp_path):
    """A build resumed after an OOM kill: ninja's clock starts again at 0 in the second run."""
    log = _log(tmp_path / ".ninja_log", (0, 60_000, "a.cpp.o", "1"), (0, 80_000, "b.cpp.o", "2"))
    _log(log, (0, 30_000, "c.cpp.o", "3"), (30_000, 40_000, "libtorch.so", "4"), append=True)
    files = write_report(log, tmp_path, "report")
    assert files.summary.runs == 2 and files.summary.wall_seconds == pytest.approx(120.0)
    events = {e["name"]: e for e in json.loads(files.trace.read_text())["traceEvents"] if e["ph"] == "X"}
    assert events["c.cpp.o"]["ts"] == 80_000_000 and events["libtorch.so"]["ts"] == 110_000_000
    assert "in 2 ninja runs; wall time 2 min 00 s" in files.text.read_text()


def test_since_a_mark_only_the_steps_of_this_build_count(tmp_path):
    log = _log(tmp_path / ".ninja_log", *NINJA_LOG)
    before = mark(log)
    assert write_report(log, tmp_path, "warm", since=before).summary.steps == 0  # nothing rebuilt
    assert "no ninja steps recorded" in (tmp_path / "warm.txt").read_text()
    _log(log, (0, 500, "c10/CMakeFiles/c10.dir/core/TensorImpl.cpp.o", "abc"), append=True)
    (step,) = read_ninja_log(log, since=before)
    assert step.output.endswith("TensorImpl.cpp.o") and step.seconds == 0.5
    # ninja recompacted the log (a new file; CMake's regeneration does, on every build of a
    # scikit-build-core tree): the entries the mark saw are kept as they were, not this build's
    compacted = _log(tmp_path / "recompact", *NINJA_LOG[1:], NINJA_LOG[0], (0, 700, "lib/new.so", "n"))
    os.replace(compacted, log)
    assert [s.output for s in read_ninja_log(log, since=before)] == ["lib/new.so"]
    assert mark(tmp_path / "absent") is None


@pytest.mark.parametrize(
    "stem", ["report-debian-pytorch-2.6-20250101T120000", "report-cuda12.4-a1b2", "report-v1.2.3", "report-x.tar"]
)
def test_a_dotted_profile_name_keeps_its_dots_in_the_file_names(tmp_path, stem):
    files = write_report(_log(tmp_path / ".ninja_log", *NINJA_LOG), tmp_path, stem)
    assert files.text == tmp_path / f"{stem}.txt" and files.text.is_file()
    assert files.trace == tmp_path / f"{stem}.trace.json" and files.trace.is_file()
    assert files.png == tmp_path / f"{stem}.png" and files.png.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".ninja_log", *(f"{stem}{x}" for x in (".txt", ".trace.json", ".png"))]
    )


def _busy_log(path: Path, units: int = 400, jobs: int = 8) -> Path:
    """A parallel build as ninja logs it: `jobs` compiles at a time, finished in end order."""
    rnd = random.Random(11)
    free_at, entries = [0] * jobs, []
    for i in range(units):
        lane = min(range(jobs), key=free_at.__getitem__)
        start = free_at[lane] + rnd.randint(0, 5)
        free_at[lane] = start + rnd.randint(200, 20_000)
        entries.append(
            (start, free_at[lane], f"caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/U{i}.cpp.o", f"{i:x}")
        )
    entries += [(0, 5_000, f"gen/Register_{k}.cpp", "c0de") for k in range(5)]  # one edge, 5 outputs
    return _log(path, *sorted(entries, key=lambda e: e[1]))


def test_the_trace_is_chrome_json_with_one_event_per_edge_and_no_overlap_per_lane(tmp_path):
    files = write_report(_busy_log(tmp_path / ".ninja_log"), tmp_path, "report")
    events = [e for e in json.loads(files.trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == files.summary.steps == 401
    assert sum(e["name"].startswith("gen/Register_0.cpp, gen/Register_1.cpp") for e in events) == 1
    by_tid: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        assert {"name", "ts", "dur", "pid", "tid"} <= e.keys() and e["dur"] >= 0
        by_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    assert len(by_tid) == files.summary.max_jobs <= 9  # 8 jobs, plus the codegen edge at the start


def test_lanes_are_as_few_as_the_jobs_running_at_once():
    steps = [Step(("a",), 0, 10), Step(("b",), 0, 5), Step(("c",), 5, 12), Step(("d",), 10, 11), Step(("e",), 12, 13)]
    assert lanes(steps) == [1, 0, 0, 1, 0]  # two at once at most; a lane is reused once free


def test_the_text_lists_the_slowest_unit_first_in_a_table(tmp_path):
    text = write_report(_log(tmp_path / ".ninja_log", *NINJA_LOG), tmp_path, "report").text.read_text()
    rows = text.split("slowest translation units")[1].splitlines()
    assert rows[2].split()[0] == "seconds" and set(rows[3].strip()) == {"─"}
    assert rows[4].split() == ["9.0", NINJA_LOG[1][2]]
    assert "aten/src/ATen/native/cpu" in text.split("compile time per source directory")[1]


def test_the_picture_is_a_png_drawn_by_matplotlib(tmp_path):
    files = write_report(_busy_log(tmp_path / ".ninja_log"), tmp_path, "report")
    assert files.png is not None and files.notice is None
    data = files.png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    width, height = struct.unpack(">II", data[16:24])
    assert width == 1400 and height > 800


def test_without_matplotlib_the_report_says_how_to_get_the_picture(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    files = write_report(_log(tmp_path / ".ninja_log", *NINJA_LOG), tmp_path, "report")
    assert files.png is None and not (tmp_path / "report.png").exists()
    assert files.notice is not None and "pip install 'torchbuild[report]'" in files.notice
    assert files.text.is_file() and files.trace.is_file()


@pytest.mark.parametrize(
    "content", ["", "# ninja log v4\n1\t2\t3\ta.o\tff\n", "# ninja log v8\n", "[1/2] not a ninja log\n"]
)
def test_a_log_it_cannot_read_is_a_named_error_and_writes_nothing(tmp_path, content):
    log = tmp_path / ".ninja_log"
    log.write_text(content)
    with pytest.raises(PathError, match="is not a ninja log this report reads"):
        write_report(log, tmp_path, "report")
    assert [p.name for p in tmp_path.iterdir()] == [".ninja_log"]


def test_an_unwritable_destination_is_a_named_error_and_leaves_nothing(tmp_path):
    log = _log(tmp_path / ".ninja_log", *NINJA_LOG)
    (tmp_path / "logs").write_text("a file where the directory should be")
    with pytest.raises(PathError, match="writing the build report"):
        write_report(log, tmp_path / "logs", "report")
    with pytest.raises(PathError, match="does not exist"):
        write_report(tmp_path / "missing", tmp_path, "report")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ninja_log", "logs"]
