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
