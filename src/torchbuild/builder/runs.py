"""The runs of one build: a build cut off (a walltime, a Ctrl-C, a machine that went away) and
finished by running the same command again is one build made in several runs. Each run notes
itself in the build tree (`torchbuild-runs.json`, beside `.ninja_log`) when it starts and when it
ends, so that the report of the run that makes the wheel can give the whole build's wall time
over its lower bound (builder/bound.py), not only its own run's.

A run that was cut has no end in the record: its end is its log's last write (the log is written
line by line as the build goes, so its modification time is when the run stopped). The file is
torchbuild's own and small (one entry a run); `--clean` removes it with the tree.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from torchbuild.core import process
from torchbuild.core.atomic import atomic_write_bytes
from torchbuild.core.errors import PathError, TreeBusy, named_os_errors
from torchbuild.core.safeio import read_json

RUNS_FILE = "torchbuild-runs.json"
RUNS_LIMIT = 4 * 2**20  # ~150 bytes a run


@dataclasses.dataclass(frozen=True)
class RunRecord:
    run_id: str
    start: float  # seconds since the epoch
    end: float | None  # None: the run was cut before it could say
    log: str

    def stopped(self) -> float | None:
        """When the run stopped: its recorded end, else its log's last write, else unknown."""
        if self.end is not None:
            return self.end
        try:
            return Path(self.log).stat().st_mtime
        except OSError:
            return None

    @property
    def wall(self) -> float | None:
        stop = self.stopped()
        return None if stop is None else max(stop - self.start, 0.0)


def read_runs(build: Path) -> list[RunRecord]:
    """The runs recorded in the build tree, oldest first ([] where none are, or the record is not
    one torchbuild wrote: the report then covers the last run only)."""
    path = build / RUNS_FILE
    if not path.is_file():
        return []
    try:
        raw = read_json(path, RUNS_LIMIT, "reading the build's runs")
        return [
            RunRecord(
                str(r["run_id"]), float(r["start"]), None if r.get("end") is None else float(r["end"]), str(r["log"])
            )
            for r in raw["runs"]
        ]
    except (PathError, KeyError, TypeError, ValueError):
        return []


def write_runs(build: Path, runs: Sequence[RunRecord]) -> None:
    data = json.dumps({"runs": [dataclasses.asdict(r) for r in runs]}, indent=1).encode()
    with named_os_errors(build, "recording the build's runs"):
        build.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(build / RUNS_FILE, data, what="recording the build's runs", fsync=False)


def begin(build: Path, run_id: str, log: Path, now: float | None = None) -> None:
    """Note a run's start (before anything of it reaches the tree)."""
    started = time.time() if now is None else now
    write_runs(build, [*read_runs(build), RunRecord(run_id, started, None, str(log))])


def end(build: Path, run_id: str, now: float | None = None) -> list[RunRecord]:
    """Note the run's end; the runs, this one ended."""
    stop = time.time() if now is None else now
    runs = [dataclasses.replace(r, end=stop) if r.run_id == run_id and r.end is None else r for r in read_runs(build)]
    if runs:
        write_runs(build, runs)
    return runs


# One build at a time in a tree: the run holds a lock on the source directory itself (flock on
# its descriptor: no file is added to the user's tree, and --clean, which removes build/, cannot
# remove it), and so does pip under it (core.process.HELD_FDS), which outlives a torchbuild
# killed outright. The holder is read back from /proc/locks for the message. filelock locks a
# file of its own beside what it guards, which is what this avoids.


def hold_tree(source: Path) -> int | None:
    """The tree held for this run: a descriptor to give to release_tree, or None where the file
    system has no flock (some NFS mounts: then nothing is held). TreeBusy when another build is
    running in it."""
    with named_os_errors(source, "opening the source tree"):
        fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        st = os.fstat(fd)
        os.close(fd)
        raise TreeBusy(f"another build is running in {source}: {_holder(st)}") from None
    except OSError:
        os.close(fd)
        return None
    process.HELD_FDS.add(fd)
    return fd


def release_tree(fd: int | None) -> None:
    if fd is not None:
        process.HELD_FDS.discard(fd)
        os.close(fd)


def _holder(st: os.stat_result) -> str:
    """Who holds the tree's lock: the process that took it (/proc/locks: "1: FLOCK ADVISORY WRITE
    <pid> MA:MI:INODE 0 EOF") if it lives, else one that inherited it (a killed torchbuild's pip),
    found among the open descriptors in /proc that name the tree."""
    node = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            pids = [
                ln.split()[4]
                for ln in f.read(1 << 20).splitlines()
                if ln.split()[1:2] == ["FLOCK"] and ln.split()[5:6] == [node]
            ]
    except OSError:
        pass
    for pid in [*pids, *_openers(st)]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read(4096).decode(errors="replace").split("\0")
        except OSError:
            continue
        cmd = " ".join([os.path.basename(argv[0]), *argv[1:]]).strip()
        return f"process {pid} ({cmd[:100]})"
    return "a process this one cannot see (another container, or another host sharing the file system)"


def _openers(st: os.stat_result) -> list[str]:
    """The processes (other than this one) with a descriptor open on the tree itself."""
    found = []
    me = str(os.getpid())
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        if fd_dir.parent.name == me:
            continue
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                there = os.stat(fd)
            except OSError:
                continue
            if (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino):
                found.append(fd_dir.parent.name)
                break
    return found
