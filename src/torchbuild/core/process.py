"""Child processes of torchbuild: one way to start them, stream their output and stop them.

Every command runs in a process group of its own (a new session), so that stopping it stops
everything it started: setup.py, cmake, ninja and the compilers under pip, or Apptainer's
helpers. On any way out (normal exit, an exception, Ctrl-C, SIGTERM turned into
KeyboardInterrupt by `interrupts_unwind`), a group that is still there gets SIGTERM, then
SIGKILL after a grace period. `run_streamed` hands each line on as it comes; `run_captured`
returns the output, with a deadline where one is given (QUERY_TIMEOUT for a tool asked a
question); stdin is /dev/null for both.

`spawn` is the one place a child is started in a group of its own: both of them use it, and
batch/rounds.run_round, whose relay thread and walltime stopper need the process while it runs.
`run_attached` runs a command the way subprocess.run does, in torchbuild's own session and
process group, for the two that must stay there: source/fetch._git (git may ask for a URL's
credentials on the terminal, which a process in a new session has no more) and
builder/codegen.run (the wrapper CMake and ninja run in torchgen's place: the real command must
have the wrapper's own stdin, stdout, stderr and process group, as if run directly).

The subprocess calls left outside this module, and why each is not one of these:
- verify/probe.py (3): a script run by another interpreter (a fresh venv's), where torchbuild
  is not importable: the standard library only.
- verify/upstream_tests._run_bounded (1): at its bound PyTorch's pytest gets SIGINT, so it
  reports what ran, before SIGKILL; here a group gets SIGTERM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

GRACE_S = 10.0

# descriptors every streamed command inherits: the locks a build holds on its tree and its
# partial wheel (builder/runs.py, runtime/compile_job.py). A torchbuild killed outright leaves pip,
# ninja and the compilers running in their own session; holding the locks too, they keep the
# next run out of the tree until they are done, instead of two ninjas writing the same objects.
HELD_FDS: set[int] = set()


@dataclasses.dataclass(frozen=True)
class Finished:
    returncode: int  # negative: killed by that signal
    seconds: float
    peak_rss: int  # bytes, of the largest process the command ran (compilers included)


def nice_prefix() -> list[str]:
    """`nice -n N --` when this process runs below the normal priority, else nothing.

    A step in a container is started by the engine's daemon, not by this process, so it would
    lose the priority a user gave the build (`nice -n 19 invoke build --in-container` on a
    login node or beside other work): the backends prefix the step's command with this."""
    level = os.getpriority(os.PRIO_PROCESS, 0)
    return ["nice", "-n", str(level), "--"] if level > 0 else []


@contextlib.contextmanager
def interrupts_unwind() -> Iterator[None]:
    """SIGINT and SIGTERM (Ctrl-C, a batch system ending the job) unwind as KeyboardInterrupt,
    so cleanup runs. SIGINT is set explicitly: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then never raises for it."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _only_zombies(pgid: int) -> bool:
    """Whether every process left in the group has exited and waits to be reaped by a parent
    that is not us (kill(2) still finds a zombie). In a container whose PID 1 reaps nothing (a
    CI job container's `tail -f /dev/null`), orphans stay zombies for good. False where /proc
    cannot tell (not readable, or showing none of the group: another PID namespace's)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    zombies = 0
    for pid in filter(str.isdigit, entries):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read(4096).rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if len(fields) > 2 and int(fields[2]) == pgid:
            if fields[0] != b"Z":
                return False
            zombies += 1
    return zombies > 0


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return _only_zombies(pgid)


def stop_group(pgid: int, grace: float = GRACE_S, leader: subprocess.Popen[Any] | None = None) -> None:
    """SIGTERM to the process group, then SIGKILL to whatever is left after `grace` seconds.
    The leader (our child) is reaped as it exits, and a group that holds only zombies is gone:
    a batch system that signals every process of the job at once SIGKILLs us after its own
    grace (Slurm's KillWait), before we say why, if we wait on processes that already exited."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()
            if _group_gone(pgid):
                return
            time.sleep(0.1)


def spawn(
    cmd: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    merged: bool = True,
    text: bool = False,
    stdin: int | None = subprocess.DEVNULL,
    held: bool = False,
) -> subprocess.Popen[Any]:
    """Start cmd in a process group of its own (a new session), its stdout a pipe and its stderr
    merged into it (merged) or a pipe of its own; text: decoded, undecodable bytes replaced;
    stdin /dev/null unless another is given (None: this process's); held: it inherits the
    descriptors in HELD_FDS. The one place a child gets a group of its own: the caller stops the
    group (stop_group) on every way out. OSError when it cannot start."""
    return subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=text,
        errors="replace" if text else None,
        start_new_session=True,
        pass_fds=tuple(sorted(HELD_FDS)) if held else (),
    )


def run_streamed(
    cmd: Sequence[str],
    *,
    on_line: Callable[[str], None],
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Finished:
    """Run cmd with stdout and stderr merged, each line handed to on_line as it comes; the
    command and everything it starts are stopped on any way out of this function."""
    start = time.monotonic()
    proc = spawn(cmd, cwd=cwd, env=env, held=True)
    assert proc.stdout is not None
    status = None
    try:
        for raw in proc.stdout:
            on_line(raw.decode(errors="replace"))
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        # the leader is reaped (or still running, on an exception): stop the rest of its group
        stop_group(proc.pid, grace=0.0 if status is not None else GRACE_S, leader=None if status is not None else proc)
        if status is None:
            proc.wait()
        proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Finished(proc.returncode, time.monotonic() - start, usage.ru_maxrss * 1024)


QUERY_TIMEOUT = 120.0  # seconds for a tool asked a question (ldd, a `python -c`, a scheduler's query)


@dataclasses.dataclass(frozen=True)
class Captured:
    returncode: int | None  # None: stopped at its deadline; negative: killed by that signal
    stdout: str
    stderr: str
    args: tuple[str, ...] = ()
    timeout: float | None = None

    def checked(self) -> str:
        """stdout, or the error subprocess.run(check=True) raises: CalledProcessError for a
        non-zero exit, TimeoutExpired for a command stopped at its deadline."""
        if self.returncode is None:
            raise subprocess.TimeoutExpired(list(self.args), self.timeout or 0.0, self.stdout, self.stderr)
        if self.returncode != 0:
            raise subprocess.CalledProcessError(self.returncode, list(self.args), self.stdout, self.stderr)
        return self.stdout


def run_captured(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    merged: bool = False,
) -> Captured:
    """Run cmd with stdout and stderr captured as text (merged: stderr into stdout, in the order
    written), in a process group of its own; on every way out (its deadline, an exception,
    Ctrl-C or SIGTERM as KeyboardInterrupt) the group is stopped, so a wrapper's child (a site's
    `cc` script running gcc, ccache running the compiler) is never left behind. Undecodable
    bytes are replaced. OSError when it cannot start."""
    argv = tuple(cmd)
    proc = spawn(argv, cwd=cwd, env=env, merged=merged, text=True)
    stopped = False  # the group was stopped and the process reaped
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc.pid, grace=0.0, leader=proc)
        stopped = True
        out, err = _leftover_output(proc)
        return Captured(None, out, err, argv, timeout)
    except BaseException:  # Ctrl-C, SIGTERM (interrupts_unwind), or any error while waiting
        stop_group(proc.pid, grace=GRACE_S, leader=proc)
        stopped = True
        _leftover_output(proc)
        raise
    finally:
        if not stopped:  # the leader exited: stop whatever it left running in its group
            stop_group(proc.pid, grace=0.0)
    return Captured(proc.returncode, out or "", err or "", argv, timeout)


def run_attached(
    cmd: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess[str]:
    """subprocess.run(cmd, check=False): in torchbuild's own session and process group, with its
    stdin, and its stdout and stderr unless capture (then captured as text: stdout and stderr
    are None without it); on an exception (Ctrl-C included) the command alone is killed. For
    the commands that must not get a group of their own (see the module's docstring)."""
    return subprocess.run(
        list(cmd), cwd=cwd, env=dict(env) if env is not None else None, capture_output=capture, text=True, check=False
    )


def _leftover_output(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """What a stopped process wrote, waiting at most a few seconds (a process that left the
    group and holds the pipes open must not hold us too); the process is reaped."""
    try:
        out, err = proc.communicate(timeout=2.0)
    except subprocess.TimeoutExpired:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        out, err = "", ""
    proc.wait()
    return out or "", err or ""
