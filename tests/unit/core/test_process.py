"""core.process.stop_group: the group's leftovers get SIGTERM, then SIGKILL after the grace; a
group that holds only zombies nobody reaps (orphans in a container whose PID 1 reaps nothing:
act's job container) counts as gone, so an interrupted build says why before Slurm's KillWait
SIGKILLs it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchbuild.core import process

PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def subreaper():
    """This process adopts orphans (as PID 1 would) and, like `tail -f /dev/null`, reaps none
    of them until the test ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) refused")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def test_a_group_of_unreaped_zombies_is_gone_without_waiting_the_grace(subreaper):
    # the leader's background child is orphaned when SIGTERM ends the leader; killed too, it
    # stays a zombie of this process, still found by kill(2)
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    time.sleep(0.5)
    started = time.monotonic()
    process.stop_group(proc.pid, grace=30.0, leader=proc)
    assert time.monotonic() - started < 10, "waited for zombies"
    assert proc.wait(timeout=5) == -signal.SIGTERM
    os.killpg(proc.pid, 0)  # the zombie is still there: only this process could reap it


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace():
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", ignore], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"1\n"  # its handler is set
    process.stop_group(proc.pid, grace=0.5, leader=proc)
    assert proc.wait(timeout=5) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
    proc.stdout.close()


def test_a_group_member_still_running_is_not_taken_for_a_zombie():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert not process._only_zombies(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not process._only_zombies(proc.pid)  # reaped: none of the group is left to show


def test_nice_prefix_carries_the_callers_priority_into_a_container_step():
    """`nice -n 19 invoke build --in-container`: the engine's daemon starts the step, so the
    docker backend prefixes its command with the caller's niceness (none at priority 0)."""
    code = "from torchbuild.core.process import nice_prefix; print(nice_prefix())"
    normal = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    low = subprocess.run(["nice", "-n", "19", sys.executable, "-c", code], capture_output=True, text=True, check=True)
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the suite itself may run under nice
    assert normal.stdout.strip() == ("[]" if own == 0 else f"['nice', '-n', '{own}', '--']")
    assert low.stdout.strip() == "['nice', '-n', '19', '--']"


def test_run_captured_merged_keeps_the_order_the_command_wrote_in():
    code = "import sys; print('out 1', flush=True); print('err', file=sys.stderr, flush=True); print('out 2')"
    done = process.run_captured([sys.executable, "-c", code], merged=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "out 1\nerr\nout 2\n", "")


def test_checked_raises_what_subprocess_run_check_true_raises():
    """The calls that had check=True keep their errors (verify's fresh venv, the lock's dpkg-query)."""
    assert process.run_captured([sys.executable, "-c", "print('x')"]).checked() == "x\n"
    failed = process.run_captured([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(subprocess.CalledProcessError) as exc:
        failed.checked()
    assert exc.value.returncode == 3 and exc.value.cmd[0] == sys.executable
    late = process.run_captured([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        late.checked()
    assert late.returncode is None and expired.value.timeout == 0.5


def test_a_query_past_its_deadline_is_stopped_with_its_children(tmp_path, monkeypatch):
    """hostcheck's commands go through run_captured: a child the command started (a wrapper's)
    is stopped with it at the deadline, where subprocess.run killed the command alone."""
    from torchbuild.hostcheck import host as hostcheck

    pidfile = tmp_path / "child.pid"
    script = tmp_path / "slow"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\nwait\n")
    script.chmod(0o755)
    monkeypatch.setattr(hostcheck, "COMMAND_TIMEOUT", 1)
    assert hostcheck.run_command([str(script)]).returncode == 124
    stat = Path(f"/proc/{int(pidfile.read_text())}/stat")
    deadline = time.monotonic() + 5
    while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (
        not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    )  # gone, or dead awaiting its reaper


SHOW = "import os, sys; print(os.getpgrp(), os.getsid(0)); print(*sorted(map(int, os.listdir('/proc/self/fd'))))"


def test_spawn_starts_a_group_of_its_own_and_passes_the_held_fds_only_when_asked(monkeypatch):
    """spawn (run_streamed's, run_captured's and batch/rounds' start): a new session and group;
    the locks in HELD_FDS go to the child only with held=True."""
    r, w = os.pipe()
    held_fd = os.dup2(r, 250, inheritable=False)  # far above what the child opens itself
    try:
        monkeypatch.setattr(process, "HELD_FDS", {held_fd})
        for held in (False, True):
            proc = process.spawn([sys.executable, "-c", SHOW], text=True, held=held)
            out, _ = proc.communicate(timeout=30)
            ids, fds = out.splitlines()
            assert ids.split() == [str(proc.pid)] * 2
            assert (held_fd in map(int, fds.split())) is held
    finally:
        os.close(held_fd)
        os.close(r)
        os.close(w)


def test_run_attached_stays_in_this_process_group_as_subprocess_run_did():
    """run_attached (git's credential prompt, codegen's wrapper): the command is in torchbuild's
    own session and group, and captures only when asked."""
    done = process.run_attached([sys.executable, "-c", SHOW], capture=True)
    assert done.returncode == 0
    assert done.stdout.splitlines()[0].split() == [str(os.getpgrp()), str(os.getsid(0))]
    assert process.run_attached([sys.executable, "-c", "import sys; sys.exit(3)"]).returncode == 3
