"""A signal while the build probes its compiler's version (issue 41 item 15): the wrapper's
child was orphaned (`sleep` under a site's `cc` script kept running with PPID 1) and
cache_dir/tmp/<run> stayed, while the message said the processes were stopped and nothing
partial was left. Real processes: core.process.run_captured, and the reported case through
`invoke build --engine native` stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO

from torchbuild.core.process import run_captured


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, waiting for its reaper, does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.1)


def _wrapper(tmp_path: Path) -> tuple[Path, Path]:
    """A compiler wrapper whose --version starts a child (as a site's script runs gcc) that
    would outlive it; the file it writes the child's pid to."""
    pid_file = tmp_path / "child.pid"
    cc = tmp_path / "wrap-cc"
    cc.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then\n  sleep 300 & echo $! > {pid_file}\n  wait\nfi\nexec gcc "$@"\n'
    )
    cc.chmod(0o755)
    return cc, pid_file


def test_run_captured_stops_the_wrappers_child_at_its_deadline(tmp_path):
    cc, pid_file = _wrapper(tmp_path)
    started = time.monotonic()
    done = run_captured([str(cc), "--version"], timeout=1.0)
    assert done.returncode is None and time.monotonic() - started < 5
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not _alive(child), "the wrapper's child outlived the probe"


def test_run_captured_stops_the_wrappers_child_on_an_interrupt(tmp_path):
    cc, pid_file = _wrapper(tmp_path)
    main = threading.main_thread().ident
    assert main is not None

    def interrupt() -> None:
        _wait_for(pid_file, 10)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_captured([str(cc), "--version"], timeout=30)
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not _alive(child), "the wrapper's child outlived the interrupted probe"


def test_sigterm_during_the_compiler_probe_leaves_no_process_and_no_run_tmp(tmp_path):
    """The reported case, as a user runs it."""
    cc, pid_file = _wrapper(tmp_path)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    cache, out = tmp_path / "cache", tmp_path / "out"
    sets = [f"cache_dir={cache}", "build_venv=false", "patches=none", f"compilers.cc={cc}"]
    cmd = [sys.executable, "-m", "invoke", "--search-root", str(REPO), "build", "--engine", "native"]
    cmd += ["--source", str(tree), "--out", str(out), *(a for s in sets for a in ("--set", s))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(pid_file, 120)
        runs = os.listdir(cache / "tmp")
        assert len(runs) == 1  # the run's TMPDIR exists while it probes
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    child = int(pid_file.read_text())
    time.sleep(0.2)
    still = _alive(child)
    if still:
        os.kill(child, signal.SIGKILL)
    assert proc.returncode == 130, stdout[-2000:] + stderr
    assert "error: BuildInterrupted" in stderr and "nothing partial was left" in stderr
    assert not still, "the compiler wrapper's child outlived the build"
    # the run's TMPDIR is gone (and cache_dir/tmp with it, made by this run: issue 41 item 18)
    assert not (cache / "tmp").exists() or os.listdir(cache / "tmp") == [], "cache_dir/tmp/<run> was left behind"
