"""builder/unitpeak.py: each real compile's peak memory and time, through ccache's prefix command
(only misses pass there), read back for the report's heaviest units and the heavy pool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchbuild.builder import unitpeak

# a stand-in compiler that holds about 200 MiB (touched, so resident) and exits as asked
HOG = "import sys; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); sys.exit(int(sys.argv[1]))"


def _wrap(record: Path, *command: str) -> subprocess.CompletedProcess[str]:
    env = unitpeak.launcher(str(record.parent / "bin"), str(record))
    assert env is not None
    return subprocess.run(
        [env["CCACHE_PREFIX"], *command],
        env={**os.environ, **env},
        cwd=record.parent,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_compile_is_recorded_with_its_peak_and_its_exit_kept(tmp_path: Path):
    record = tmp_path / "units.tsv"
    ok = _wrap(record, sys.executable, "-c", HOG, "0", "-c", "-o", "a.o", str(tmp_path / "a.cpp"))
    failed = _wrap(record, sys.executable, "-c", HOG, "3", "-o", "b.o", "b.cpp")
    assert (ok.returncode, failed.returncode) == (0, 3)
    units = unitpeak.read_record(str(record), str(tmp_path))
    assert set(units) == {"a.cpp", "b.cpp"}  # relative to the tree, however the compile named it
    assert all(peak >= 200 * 2**20 for peak, _ in units.values())


def test_a_signal_is_reported_as_a_shell_would_so_oom_kills_stay_137(tmp_path: Path):
    res = _wrap(tmp_path / "u.tsv", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert res.returncode == 137


def test_a_missing_compiler_is_127_and_one_line(tmp_path: Path):
    res = _wrap(tmp_path / "u.tsv", str(tmp_path / "no-such-cc"), "-c", "x.c")
    assert res.returncode == 127 and res.stderr.count("\n") == 1 and "cannot run" in res.stderr


def test_reading_keeps_each_units_largest_peak_and_skips_damage(tmp_path: Path):
    record = tmp_path / "u.tsv"
    record.write_text(
        f"1000\t1.5\t{tmp_path}/x/a.cpp\ta.o\n"
        f"3000\t2.5\t{tmp_path}/x/a.cpp\ta.o\n"  # compiled again (after an OOM kill): the larger peak
        "garbage line\n2000\tnan?\tb.cpp\tb.o\n"
        f"2000\t0.5\t{tmp_path}/c.cu\tc.o\n"
    )
    units = unitpeak.read_record(str(record), str(tmp_path))
    assert units == {"x/a.cpp": (3000 * 1024, 2.5), "c.cu": (2000 * 1024, 0.5)}
    top = unitpeak.heaviest(units, top=1)
    assert top == [{"file": "x/a.cpp", "peak_rss_bytes": 3000 * 1024, "seconds": 2.5}]
    assert unitpeak.read_record(str(tmp_path / "missing.tsv"), str(tmp_path)) == {}


def test_the_launcher_is_refused_where_ccache_would_split_its_path(tmp_path: Path):
    assert unitpeak.launcher(str(tmp_path / "with space"), str(tmp_path / "u.tsv")) is None
    env = unitpeak.launcher(str(tmp_path), str(tmp_path / "u.tsv"))
    assert env is not None and os.access(env["CCACHE_PREFIX"], os.X_OK)


def test_ccache_hands_only_its_misses_to_the_prefix(tmp_path: Path):
    """The real ccache: a miss compiles through the prefix (recorded), a hit does not."""
    if shutil.which("ccache") is None or shutil.which("cc") is None:
        pytest.fail("ccache and cc are needed (.ci/run installs them)")
    record = tmp_path / "build" / "units.tsv"
    record.parent.mkdir()
    (tmp_path / "a.c").write_text("int f(int x) { return x * 2; }\n")
    env = {
        **os.environ,
        "CCACHE_DIR": str(tmp_path / "ccache"),
        **(unitpeak.launcher(str(tmp_path / "bin"), str(record)) or {}),
    }
    env.pop("CCACHE_DISABLE", None)
    for obj in ("a1.o", "a2.o"):  # the second is a cache hit
        subprocess.run(["ccache", "cc", "-c", "../a.c", "-o", obj], cwd=record.parent, env=env, check=True)
    lines = record.read_text().splitlines()
    assert len(lines) == 1, lines
    assert unitpeak.read_record(str(record), str(tmp_path)).keys() == {"a.c"}
