"""The runs of one build: a build cut off (a walltime, a Ctrl-C, a machine that went away) and
finished by running the same command again is one build made in several runs. Each run notes
itself in the build tree (`torchbuild-runs.json`, beside `.ninja_log`) when it starts and when it
ends, so that the report of the run that makes the wheel can give the whole build's wall time
over its lower bound (steps/bound.py), not only its own run's.

A run that was cut has no end in the record: its end is its log's last write (the log is written
line by line as the build goes, so its modification time is when the run stopped). The file is
torchbuild's own and small (one entry a run); `--clean` removes it with the tree.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

from torchbuild.core.atomic import atomic_write_bytes
from torchbuild.core.errors import PathError, named_os_errors
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
