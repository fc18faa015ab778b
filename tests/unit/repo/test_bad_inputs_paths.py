"""Paths a shell leaves unexpanded (`~nobody-such/x`: no such user) or that hold a NUL byte, given
to every task's path option: a named PathError (exit 15) naming the path, never a traceback, and
nothing made in the working directory (issue 27, item 16's rule applied to every path option)."""

from __future__ import annotations

import subprocess
import sys

import pytest

NO_USER = "~nobody-such-user/x"

PATH_OPTIONS = [
    ("build", "--source"),
    ("build", "--out"),
    ("install", "--prefix"),
    ("install", "--out"),
    ("manifest.show", ""),
    ("companions", "--wheel"),
    ("verify", "--wheel"),
    ("develop", "--source"),
    ("host-check", "--state"),
    ("source", "--dest"),
    ("wheelhouse", "--wheel"),
    ("bench", "--venv"),
    ("comms", "--out"),
    ("doctor", "--cache-dir"),
]


@pytest.mark.parametrize(("task", "option"), PATH_OPTIONS, ids=[f"{t} {o}".strip() for t, o in PATH_OPTIONS])
def test_a_home_of_no_user_is_a_path_error_naming_it(tmp_path, task, option):
    args = [task, *([option] if option else []), NO_USER]
    if task == "host-check":
        args.append("--restore")
    if task == "wheelhouse":
        args.insert(1, str(tmp_path / "house"))
    if task == "install" and option == "--out":
        args.insert(1, str(tmp_path / "env"))
    if task == "build" and option == "--out":  # a source that exists, so --out is what is refused
        args += ["--source", str(tmp_path / "tree")]
    proc = subprocess.run(
        [sys.executable, "-m", "torchbuild", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 15, proc.stdout + proc.stderr
    assert "PathError" in proc.stderr and "nobody-such-user" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing is made in the working directory"
