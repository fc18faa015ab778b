"""How many compile jobs a build may run: from cores, usable memory and per-job peak memory."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class HostResources:
    cores: int
    memory_bytes: int  # memory the build may use
    memory_source: str  # where memory_bytes was read from

    @classmethod
    def detect(cls) -> HostResources:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        mem, source = _memory_limit()
        return cls(cores=cores, memory_bytes=mem, memory_source=source)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cgroup_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of this process's cgroup (v2 memory.max or v1 limit_in_bytes), if any."""
    v2 = root / "memory.max"
    if v2.is_file():
        return _read_int(v2)  # "max" -> None
    v1 = _read_int(root / "memory" / "memory.limit_in_bytes")
    if v1 is not None and v1 < (1 << 60):  # v1 reports a huge number when unlimited
        return v1
    return None


def _memory_limit() -> tuple[int, str]:
    avail = mem_available()
    limit = cgroup_limit()
    if limit is not None and (avail == 0 or limit < avail):
        return limit, "cgroup memory limit"
    return avail, "MemAvailable"


@dataclasses.dataclass(frozen=True)
class JobPlan:
    jobs: int
    reason: str


def plan_jobs(max_jobs: str | int, mem_per_job_gb: float, host: HostResources) -> JobPlan:
    """MAX_JOBS for a build: a fixed number, or the smaller of cores and memory / per-job peak."""
    if max_jobs != "auto":
        return JobPlan(int(max_jobs), "fixed by max_jobs")
    by_mem = int(host.memory_bytes // int(mem_per_job_gb * GiB)) if mem_per_job_gb > 0 else host.cores
    jobs = max(1, min(host.cores, by_mem))
    reason = (
        f"auto: {host.cores} cores, {host.memory_bytes / GiB:.1f} GiB ({host.memory_source}) "
        f"/ {mem_per_job_gb:g} GiB per job -> {jobs}"
    )
    return JobPlan(jobs, reason)
