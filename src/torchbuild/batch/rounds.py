"""A build carried across allocations by itself: a job that stops before its walltime and goes on
in the next allocation, round after round, until the wheel is built and verified.

The batch script runs `python -m torchbuild.batch.rounds STATE -- BUILD ARGV` (Scheduler.render,
with the profile's job_rounds > 0). This supervisor
- counts the round (STATE: a JSON file beside the kept job script, written by `invoke submit`
  from runtime/scheduler.py's new_state) and refuses a round past the profile's job_rounds
  (RoundsExhausted);
- runs the build in a process group of its own and relays its output to the job log, counting
  the ninja steps it finishes;
- stops it cleanly job_round_warning_s before the walltime: at Slurm's warning signal
  (`#SBATCH --signal=B:USR1@N`, which the script's trap hands over as SIGUSR1), or at its own
  timer for schedulers without one (PBS: its walltime is known, the job started when this did);
  the build ends with BuildInterrupted and leaves its tree for the next round;
- records the round (its ninja steps, its seconds, how it ended) in STATE and in the job log,
  then continues the job in a new allocation: Slurm `scontrol requeue` (the same job id, so
  dependent jobs still wait for it, and the same log with --open-mode=append), PBS `qsub` of the
  kept script (a new job id: qrerun needs an operator). A scheduler that refuses is
  SubmissionRefused in the job log, never a silent stop;
- stops with NoProgress where a round finished no ninja step (a unit longer than the round, or
  a round spent in configure: the walltime is too short), instead of requeueing forever;
- after the last round, writes the rounds into the wheel's manifest (`rounds`).
A build that fails for another reason, or a job cancelled (SIGTERM from scancel or the hard
limit), ends the job with the build's exit code and no new round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from torchbuild.core.atomic import atomic_write_text
from torchbuild.core.errors import ManifestError, NoProgress, RoundsExhausted, SubmissionRefused, TorchbuildError
from torchbuild.core.process import run_captured, spawn, stop_group
from torchbuild.core.safeio import KiB, read_bytes

STATE_LIMIT = 256 * KiB
# ninja's status line: "[finished/total] description" (NINJA_STATUS's default)
_NINJA_STATUS = re.compile(r"^\s*\[(\d+)/(\d+)\]")
_MANIFEST_LINE = re.compile(r"^manifest: (.+\.json)\s*$")
JOB_ID_VARIABLES = {"slurm": "SLURM_JOB_ID", "pbs": "PBS_JOBID"}


@dataclasses.dataclass
class Round:
    """One allocation's part of the build."""

    round: int
    job: str
    started: str
    seconds: float
    ninja_steps: int  # the steps ninja finished in this round
    ended: str  # finished | limit | failed | cancelled


def read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_bytes(path, STATE_LIMIT, "reading the job's rounds"))
    except ValueError:
        raise ManifestError(f"{path} is not the job's rounds record (not JSON)") from None
    if not isinstance(data, dict) or not isinstance(data.get("rounds"), list):
        raise ManifestError(f"{path} is not the job's rounds record")
    return data


class _Relay:
    """The build's output copied to the job log as it comes, its ninja steps counted."""

    def __init__(self, proc: subprocess.Popen[str], out: TextIO) -> None:
        self.proc, self.out = proc, out
        self.steps = 0  # ninja prints [finished/total] as each step finishes when its output is no terminal
        self.manifest = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.write(line)
            self.out.flush()
            if m := _NINJA_STATUS.match(line):
                self.steps = max(self.steps, int(m[1]))
            elif m := _MANIFEST_LINE.match(line):
                self.manifest = m[1]


def slurm_time_left(job: str) -> float | None:
    """Seconds the Slurm job has left (`squeue -o %L`: [[D-]HH:]MM:SS), None where unknown."""
    try:
        done = run_captured(["squeue", "-h", "-j", job, "-o", "%L"], timeout=30)
    except OSError:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", done.stdout.strip()) if done.returncode == 0 else None
    if not m:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


class _Stopper:
    """Stops the build's group cleanly, once, warning_s before the limit: at the own timer, or at
    SIGUSR1 (the script's trap, from Slurm's --signal). Slurm sends its warning up to a minute
    early (its periodic check), so a warning with more time left than that re-arms the timer
    for what Slurm says is left (squeue %L) instead. SIGTERM (scancel, the hard limit): stop it
    and end the job."""

    def __init__(
        self,
        proc: subprocess.Popen[str],
        deadline_s: float,
        warning_s: int,
        ask_left: Callable[[], float | None],
        out: TextIO,
    ) -> None:
        self.proc, self.why, self.warning_s, self.ask_left, self.out = proc, "", warning_s, ask_left, out
        self.timer: threading.Timer | None = None
        signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=self.warned, daemon=True).start())
        signal.signal(signal.SIGTERM, lambda *_: self.stop("cancelled"))
        self.arm(deadline_s)

    def arm(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = threading.Timer(max(seconds, 0.0), self.stop, ("limit",))
        self.timer.daemon = True
        self.timer.start()

    def warned(self) -> None:
        left = self.ask_left()
        if left is not None and left > self.warning_s + 5:
            print(
                f"torchbuild: the scheduler's warning came with {left:.0f} s left: stopping {self.warning_s} s before the end",
                file=self.out,
                flush=True,
            )
            self.arm(left - self.warning_s)
        else:
            self.stop("limit")

    def stop(self, why: str) -> None:
        if self.why:
            return
        self.why = why
        threading.Thread(target=stop_group, args=(self.proc.pid,), daemon=True).start()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def run_round(state_path: Path, command: Sequence[str], out: TextIO = sys.stdout) -> int:
    """One round: the build until it finishes, fails or is stopped for the limit; then the next
    round's submission. Returns the job's exit code."""
    state = read_state(state_path)
    number = len(state["rounds"]) + 1
    limit = int(state["max_rounds"])
    if number > limit:
        raise RoundsExhausted(
            f"the build did not finish in {limit} rounds (job_rounds); each round's progress is above",
            hint="raise job_rounds or walltime (--set job_rounds=N), or look at why the rounds were slow",
        )
    job = os.environ.get(JOB_ID_VARIABLES.get(str(state["scheduler"]), ""), "?")
    warning, walltime = int(state["warning_s"]), int(state["walltime_s"])
    print(
        f"torchbuild: round {number} of at most {limit} (job {job}): the build stops {warning} s before the "
        f"{walltime} s walltime and goes on in the next allocation",
        file=out,
        flush=True,
    )
    started, t0 = _now(), time.monotonic()
    proc = spawn(command, text=True, stdin=None)  # the job's stdin, as the build had it

    def ask_left() -> float | None:
        return slurm_time_left(job) if state["scheduler"] == "slurm" else None

    left = ask_left()
    relay = _Relay(proc, out)
    stopper = _Stopper(proc, (walltime if left is None else min(walltime, left)) - warning, warning, ask_left, out)
    code = proc.wait()
    relay.thread.join(timeout=30)
    stopper.cancel()
    ended = "finished" if code == 0 else (stopper.why or "failed")
    record = Round(number, job, started, round(time.monotonic() - t0, 1), relay.steps, ended)
    state["rounds"].append(dataclasses.asdict(record))
    atomic_write_text(state_path, json.dumps(state, indent=2) + "\n")
    print(
        f"torchbuild: round {number} {ended} after {record.seconds:.0f} s: {record.ninja_steps} ninja steps finished",
        file=out,
        flush=True,
    )
    return _after(state, record, code, relay.manifest, state_path, out)


def _after(state: dict[str, Any], record: Round, code: int, manifest: str, state_path: Path, out: TextIO) -> int:
    if record.ended == "finished":
        if manifest:
            add_rounds_to_manifest(Path(manifest), state["rounds"])
        return 0
    if record.ended != "limit":
        return code  # the build's own failure, or the job cancelled: no new round
    if record.ninja_steps == 0:
        raise NoProgress(
            f"round {record.round} finished no ninja step before the limit: another round would do the same",
            hint="give the job a longer walltime (a round must configure and finish a compile), then submit again",
        )
    if record.round >= int(state["max_rounds"]):
        raise RoundsExhausted(
            f"the build did not finish in {record.round} rounds (job_rounds); its tree is kept for a new submit",
            hint="raise job_rounds or walltime (--set job_rounds=N) and submit the same request again",
        )
    return _next_round(state, record, state_path, out)


def _next_round(state: dict[str, Any], record: Round, state_path: Path, out: TextIO) -> int:
    argv = [a.replace("{job}", record.job) for a in state["submit"]]
    print(f"torchbuild: round {record.round + 1} is submitted: {' '.join(argv)}", file=out, flush=True)
    try:
        done = run_captured(argv, timeout=120)
        if done.returncode is None:
            done.checked()  # TimeoutExpired, said as before
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SubmissionRefused(
            f"the next round could not be submitted ({argv[0]}: {exc})",
            hint=f"submit the kept script again by hand; the rounds so far are in {state_path}",
        ) from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())
        raise SubmissionRefused(
            f"{argv[0]} refused the next round: {said or f'exit code {done.returncode}'}",
            hint=f"submit the kept script again by hand; the rounds so far are in {state_path}",
        )
    if done.stdout.strip():
        print(f"torchbuild: next round's job: {done.stdout.strip()}", file=out, flush=True)
    return 0


def add_rounds_to_manifest(path: Path, rounds: list[dict[str, Any]]) -> None:
    """The wheel's manifest gains the rounds that built it (written whole, atomically)."""
    from torchbuild.runtime import manifest

    m = manifest.read(path)
    manifest.write(dataclasses.replace(m, rounds=tuple(manifest.RoundRecord(**r) for r in rounds)), path)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(
            "usage: python -m torchbuild.batch.rounds STATE -- BUILD ARGV... (written by invoke submit)",
            file=sys.stderr,
        )
        return 2
    try:
        return run_round(Path(argv[0]), argv[2:])
    except TorchbuildError as err:
        print(f"error: {type(err).__name__}: {err.message}", file=sys.stderr, flush=True)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr, flush=True)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
