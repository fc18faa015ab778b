"""Out of memory, in one place: what counts as evidence, the resume loop with fewer jobs, and
what the host makes of a build's exit code.

A compile step (pip wheel, cmake --build) that the kernel's OOM killer interrupts is resumed on
the same build tree with half the jobs (ninja rebuilds only what did not finish), down to one
job; then OutOfMemory with the peaks seen. The host side maps a containerised build's exit code
13 (OutOfMemory raised inside) or 137/-9 (SIGKILL: the container's memory limit) to OutOfMemory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from torchbuild.core.errors import BuildFailed, InsufficientSpace, OutOfMemory, TorchbuildError
from torchbuild.core.process import Finished, run_streamed
from torchbuild.runtime.jobs import cgroup_peak

# What compilers and drivers print when the kernel's OOM killer took them (gcc, clang, nvcc,
# the linker); "Killed" alone is what a shell prints for a SIGKILLed child.
OOM_PATTERNS = [
    re.compile(p)
    for p in (
        r"Killed signal terminated program (\S+)",
        r"(cicc|ptxas|nvlink|cudafe\+\+|fatbinary)'? died due to signal 9",
        r"internal compiler error: Killed \(program (\S+)\)",
        r"(clang(\+\+)?|c\+\+|g\+\+|gcc|cc1plus): error: unable to execute command: Killed",
        r"(ld|collect2|lld)(: fatal error)?: .*terminated with signal 9",
        r"virtual memory exhausted",
        r"out of memory allocating \d+ bytes",
        r"std::bad_alloc",
        r"^Killed$",
    )
]
SIGKILLED = (137, -9)
OOM_EXITS = (OutOfMemory.exit_code, *SIGKILLED)  # what a step's exit says about memory


# What a process that hit a full file system (or a quota) prints: Python's OSError, the
# compilers', the linker's, ninja's and ccache's messages all end in strerror's text.
DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded|\[Errno (?:28|122)\]")
_PATH_IN_LINE = re.compile(r"(/[^\s'\":,;()\[\]]+)")


def disk_full_evidence(line: str) -> str | None:
    """The disk-full message in one output line, if it is one."""
    text = line.strip()
    return text[:300] if DISK_FULL.search(text) else None


def full_file_system(evidence: str, candidates: Sequence[str]) -> tuple[Path, int | None]:
    """The directory whose file system was full: the nearest existing directory of a path the
    message names (a program's own path, `/usr/bin/ld: ...`, left out), else the candidate
    with the least free space (the build tree, TMPDIR, the caches). (directory, its free bytes,
    None where they cannot be read)."""
    for text in _PATH_IN_LINE.findall(evidence):
        path = Path(text)
        if path.is_file() and os.access(path, os.X_OK):
            continue
        d = next((a for a in (path, *path.parents) if a.is_dir()), None)
        if d is not None and d != Path("/"):
            return d, _free(d)
    best: tuple[Path, int] | None = None
    for c in candidates:
        free = _free(Path(c)) if c and Path(c).is_dir() else None
        if free is not None and (best is None or free < best[1]):
            best = (Path(c), free)
    if best is not None:
        return best
    return Path(candidates[0] if candidates else "."), None


def _free(d: Path) -> int | None:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return None


def oom_evidence(line: str) -> str | None:
    """The out-of-memory message in one output line, if it is one."""
    text = line.strip()
    for pat in OOM_PATTERNS:
        if pat.search(text):
            return text[:200]
    return None


class Sink(Protocol):
    """Where a step's output goes (core.progress.Tee): the terminal and the log."""

    def write(self, text: str) -> None: ...

    def line(self, text: str = "") -> None: ...

    @property
    def path(self) -> Path: ...


def fewer_jobs(jobs: int) -> int:
    """The next attempt after an out-of-memory kill: half as many jobs, at least one."""
    return max(1, jobs // 2)


@dataclasses.dataclass
class JobsUsed:
    """The jobs a build started with, what it ended with, and every out-of-memory retry."""

    start: int
    current: int
    retries: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def run_watched(
    cmd: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    sink: Sink,
    watch: Callable[[str], None] | None = None,
    disk_full: list[str] | None = None,
) -> tuple[Finished, str | None]:
    """Run cmd with its output streamed into sink (and each line to watch); (how it finished,
    the first OOM evidence seen). With disk_full, the first disk-full message goes into it."""
    sink.line(f"$ {' '.join(cmd)}")
    evidence: list[str] = []

    def on_line(line: str) -> None:
        sink.write(line)
        if watch is not None:
            watch(line)
        if not evidence:
            found = oom_evidence(line)
            if found:
                evidence.append(found)
        if disk_full is not None and not disk_full:
            full = disk_full_evidence(line)
            if full:
                disk_full.append(full)

    done = run_streamed(cmd, cwd=cwd, env=env, on_line=on_line)
    return done, (evidence[0] if evidence else None)


def run_compile(
    cmd_for: Callable[[int], Sequence[str]],
    *,
    cwd: str,
    env_for: Callable[[int], Mapping[str, str]],
    sink: Sink,
    what: str,
    jobs: JobsUsed,
    retry: bool = True,
    watch: Callable[[str], None] | None = None,
    failure: Callable[[Finished], TorchbuildError] | None = None,
) -> float:
    """Run a compile step with jobs.current jobs; resume it with fewer after an OOM kill.
    Returns the seconds spent over all attempts. A failure that printed a disk-full message is
    InsufficientSpace naming the file system that was full (never retried: fewer jobs need
    the same space); any other failure is failure(how it finished), else BuildFailed."""
    total = 0.0
    while True:
        env = env_for(jobs.current)
        full: list[str] = []
        done, evidence = run_watched(cmd_for(jobs.current), cwd=cwd, env=env, sink=sink, watch=watch, disk_full=full)
        total += done.seconds
        if done.returncode == 0:
            return total
        if full:
            candidates = [cwd, *(env.get(k, "") for k in ("TMPDIR", "CCACHE_DIR", "PIP_CACHE_DIR"))]
            where, free = full_file_system(full[0], candidates)
            left = f" ({free / 2**30:.1f} GiB free now)" if free is not None else ""
            raise InsufficientSpace(
                f"{what} ran out of disk space on the file system of {where}{left}: {full[0]}; log: {sink.path}",
                hint=f"free space on the file system of {where} (or point TMPDIR, cache_dir or --out at a larger "
                "one) and run the same command again: the build resumes where it stopped",
            )
        evidence = evidence or (f"exit {done.returncode} (SIGKILL)" if done.returncode in SIGKILLED else None)
        if evidence is None:
            if failure is not None:
                raise failure(done)
            raise BuildFailed(f"{what} failed (exit {done.returncode}) after {done.seconds:.0f} s; log: {sink.path}")
        _resume_or_raise(what, done, evidence, jobs, retry, sink)


def _resume_or_raise(what: str, done: Finished, evidence: str, jobs: JobsUsed, retry: bool, sink: Sink) -> None:
    cg_peak = cgroup_peak()
    peak_text = f"largest process {done.peak_rss / 2**30:.2f} GiB" + (
        f", cgroup peak {cg_peak / 2**30:.2f} GiB" if cg_peak else ""
    )
    if jobs.current == 1 or not retry:
        raise OutOfMemory(
            f"{what} ran out of memory with {jobs.current} jobs ({evidence}; {peak_text}); log: {sink.path}",
            hint=None if retry else "drop --no-retry to resume with fewer jobs automatically",
        )
    nxt = fewer_jobs(jobs.current)
    jobs.retries.append(
        {
            "step": what,
            "jobs": jobs.current,
            "next_jobs": nxt,
            "evidence": evidence,
            "peak_rss_bytes": done.peak_rss,
            "cgroup_peak_bytes": cg_peak,
            "seconds": round(done.seconds, 1),
        }
    )
    sink.line(
        f"torchbuild: out of memory in {what} with {jobs.current} jobs ({evidence}; {peak_text}); "
        f"resuming the same build tree with {nxt} jobs (retry {len(jobs.retries)})"
    )
    jobs.current = nxt


def step_failure(rc: int, where: str, logs: Path) -> TorchbuildError:
    """The host's error for a step that exited rc in a container or SIF (its own error was
    printed above by the step itself)."""
    if rc == OutOfMemory.exit_code:
        return OutOfMemory(f"the build in {where} ran out of memory at its last retry; the log is in {logs}")
    if rc in SIGKILLED:
        return OutOfMemory(
            f"the build in {where} was killed (exit {rc}, SIGKILL: out of memory?); the log is in {logs}"
        )
    return BuildFailed(f"the step in {where} exited with {rc}; the log is in {logs}")
