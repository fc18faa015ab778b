"""How many compile jobs a build may run: from cores, the memory the build may use, and the
peak memory of one compile job.

Memory is the smallest of: MemAvailable, the memory limits of this process's cgroups (a
container's, or a Slurm or PBS job's under cgroup confinement) and the Slurm allocation
(SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE). Cores are the CPU affinity,
bounded by the allocation's cores (SLURM_CPUS_ON_NODE; PBS's NCPUS; Torque's PBS_NUM_PPN).
Per-job peaks start from the profile (mem_per_job_gb for C++, mem_per_cuda_job_gb for CUDA
builds, where flash-attention kernels need about 5 GB) and are replaced by the peaks measured
on preflight canaries once there are some (`Peaks`). Where some units are known to be heavy
(heavy_units, or canaries that measured above mem_per_job_gb), they get a pool of their own
(`plan_heavy`: its depth from memory) and the light jobs the cores (`HeavyPlan`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from torchbuild.core.atomic import atomic_write_text

if TYPE_CHECKING:
    from torchbuild.profile.config import BuildSpec

GiB = 1024**3
# cores a batch allocation grants: Slurm, PBS Professional (NCPUS of the chunk), Torque
ALLOCATION_CPUS = ("SLURM_CPUS_ON_NODE", "NCPUS", "PBS_NUM_PPN")
# what a container must be told of the allocation, since its own view is the node's
ALLOCATION_ENV = (
    *ALLOCATION_CPUS,
    "SLURM_MEM_PER_NODE",
    "SLURM_MEM_PER_CPU",
    "SLURM_CPUS_PER_TASK",
    "SLURM_JOB_ID",
    "PBS_JOBID",
)
# measured peaks are raised by this margin: a canary is one file, the build has many
PEAK_MARGIN = 1.25
MAX_NVCC_THREADS = 4


@dataclasses.dataclass(frozen=True)
class HostResources:
    cores: int
    memory_bytes: int  # memory the build may use
    memory_source: str  # where memory_bytes was read from
    cores_source: str = "CPU affinity"

    @classmethod
    def detect(
        cls,
        environ: Mapping[str, str] | None = None,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        meminfo: Path = Path("/proc/meminfo"),
        self_cgroup: Path = Path("/proc/self/cgroup"),
    ) -> HostResources:
        env = os.environ if environ is None else environ
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        cores_source = "CPU affinity"
        quota = cgroup_cpus(cgroup_root, self_cgroup)
        if quota is not None and quota < cores:  # `docker run --cpus 2`, a cgroup with a CPU quota
            cores, cores_source = quota, "cgroup CPU quota"
        for variable in ALLOCATION_CPUS:
            allotted = _int(env.get(variable))
            if allotted and allotted < cores:
                cores, cores_source = allotted, variable
        candidates: list[tuple[int, str]] = []
        avail = mem_available(meminfo)
        if avail:
            candidates.append((avail, "MemAvailable"))
        limit = cgroup_limit(cgroup_root, self_cgroup)
        if limit is not None:
            candidates.append((limit, "cgroup memory limit"))
        slurm = slurm_memory(env)
        if slurm is not None:
            candidates.append(slurm)
        mem, source = min(candidates) if candidates else (0, "unknown")
        return cls(cores=cores, memory_bytes=mem, memory_source=source, cores_source=cores_source)


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _read_int(path: Path) -> int | None:
    try:
        return _int(path.read_text())
    except OSError:
        return None


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def own_cgroups(root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")) -> list[Path]:
    """The memory cgroup directories of this process, from its own up to the root: a Slurm
    job's (task/cgroup) or a PBS job's cgroup is where the job's limit is. In a container
    (its own cgroup namespace) the paths resolve to the container's root."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    dirs: list[Path] = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2: 0::/path
            base = root
        elif "memory" in controllers.split(","):
            base = root / "memory"
        else:
            continue
        here = base / path.strip("/")
        while here != base and here.is_relative_to(base):
            if here.is_dir():
                dirs.append(here)
            here = here.parent
    return dirs


def cgroup_limit(root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The smallest memory limit over this process's cgroups and the root's (v2 memory.max,
    v1 memory.limit_in_bytes), if any."""
    limits = []
    for d in own_cgroups(root, self_cgroup):
        limits.append(_read_int(d / "memory.max") or _read_int(d / "memory.limit_in_bytes"))
    v2 = root / "memory.max"
    if v2.is_file():
        limits.append(_read_int(v2))  # "max" -> None
    else:
        limits.append(_read_int(root / "memory" / "memory.limit_in_bytes"))
    found = [x for x in limits if x is not None and x < (1 << 60)]  # v1 says unlimited with a huge number
    return min(found) if found else None


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The cores a CPU quota allows (quota / period, rounded up, at least 1) over this process's
    cgroups and the root's (v2 cpu.max "QUOTA PERIOD" or "max PERIOD"; v1 cpu.cfs_quota_us and
    cpu.cfs_period_us, -1 for none); None without a quota."""
    found: list[int] = []
    for d in [*own_cgroups(root, self_cgroup), root]:
        try:
            text = (d / "cpu.max").read_text().split()
        except (OSError, UnicodeDecodeError):
            text = []
        if len(text) == 2 and text[0].isdigit() and text[1].isdigit() and int(text[1]) > 0:
            found.append(max(1, -(-int(text[0]) // int(text[1]))))
    quota, period = _read_int(root / "cpu" / "cpu.cfs_quota_us"), _read_int(root / "cpu" / "cpu.cfs_period_us")
    if quota and period and quota > 0:
        found.append(max(1, -(-quota // period)))
    return min(found) if found else None


def cgroup_peak(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The cgroup's high-water mark (v2 memory.peak, v1 max_usage_in_bytes), if the kernel has one."""
    return _read_int(root / "memory.peak") or _read_int(root / "memory" / "memory.max_usage_in_bytes")


def slurm_memory(env: Mapping[str, str]) -> tuple[int, str] | None:
    """The job's memory from Slurm's variables (megabytes), if this runs in a Slurm allocation."""
    per_node = _int(env.get("SLURM_MEM_PER_NODE"))
    if per_node:
        return per_node * 2**20, "SLURM_MEM_PER_NODE"
    per_cpu = _int(env.get("SLURM_MEM_PER_CPU"))
    cpus = _int(env.get("SLURM_CPUS_ON_NODE")) or _int(env.get("SLURM_CPUS_PER_TASK"))
    if per_cpu and cpus:
        return per_cpu * cpus * 2**20, "SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE"
    return None


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Peak memory of one compile job, per kind ("cxx", "cuda"), and where each came from."""

    cxx: int
    cuda: int
    source: str = "profile defaults"

    @classmethod
    def defaults(cls, mem_per_job_gb: float, mem_per_cuda_job_gb: float) -> Peaks:
        return cls(int(mem_per_job_gb * GiB), int(mem_per_cuda_job_gb * GiB))

    def with_measured(self, measured: Mapping[str, int]) -> Peaks:
        """Measured canary peaks (bytes, per kind) replace the defaults, with PEAK_MARGIN."""
        cxx = int(measured["cxx"] * PEAK_MARGIN) if measured.get("cxx") else self.cxx
        cuda = int(measured["cuda"] * PEAK_MARGIN) if measured.get("cuda") else self.cuda
        kinds = [k for k in ("cxx", "cuda") if measured.get(k)]
        if not kinds:
            return self
        return Peaks(cxx, cuda, f"measured on canaries ({', '.join(kinds)}) x {PEAK_MARGIN}")


def canary_kind(file: str) -> str:
    return "cuda" if file.endswith((".cu", ".cuh")) else "cxx"


def peaks_file(cache_root: str | Path, profile_hash: str) -> Path:
    return Path(cache_root) / "peaks" / f"{profile_hash[:16]}.json"


def load_measured(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: int(v) for k, v in data.items() if k in ("cxx", "cuda") and isinstance(v, int)}


def record_measured(path: Path, canaries: list[dict[str, object]]) -> dict[str, int]:
    """Keep the largest peak per kind from these canaries (and earlier ones) for later plans."""
    measured = load_measured(path)
    for c in canaries:
        kind, peak = canary_kind(str(c["file"])), c.get("peak_rss_bytes")
        if isinstance(peak, int) and peak > measured.get(kind, 0):
            measured[kind] = peak
    if measured:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(measured, indent=2))
    return measured


@dataclasses.dataclass(frozen=True)
class JobPlan:
    jobs: int
    reason: str
    nvcc_threads: int = 0  # 0: leave nvcc's default
    heavy: HeavyPlan | None = None  # the heavy units' pool, where there is one


def plan_jobs(
    max_jobs: str | int,
    mem_per_job_gb: float,
    host: HostResources,
    *,
    cuda: bool = False,
    peaks: Peaks | None = None,
    nvcc_threads: int = 0,
    cuda_archs: int = 1,
) -> JobPlan:
    """MAX_JOBS for a build: a fixed number, or the smaller of cores and memory / per-job peak.
    For CUDA builds the CUDA peak decides; nvcc --threads (which compiles a file's archs in
    parallel) gets the cores that memory leaves idle, at most one per arch and 4, unless the
    profile fixes nvcc_threads. The CUDA peak is per nvcc call as measured, threads included."""
    peaks = peaks or Peaks.defaults(mem_per_job_gb, 5.0)
    if max_jobs != "auto":
        jobs = int(max_jobs)
        threads = nvcc_threads if cuda else 0
        return JobPlan(jobs, f"fixed: {jobs} jobs", threads)
    peak = max(peaks.cxx, peaks.cuda) if cuda else peaks.cxx
    by_mem = int(host.memory_bytes // peak) if peak > 0 else host.cores
    jobs = max(1, min(host.cores, by_mem))
    limit = "cores" if host.cores <= by_mem else "memory"
    reason = (
        f"auto: {host.cores} cores ({host.cores_source}), {host.memory_bytes / GiB:.1f} GiB "
        f"({host.memory_source}) / {peak / GiB:.2f} GiB per {'CUDA ' if cuda else ''}job "
        f"({peaks.source}) -> {jobs} jobs, limited by {limit}"
    )
    threads = 0
    if cuda:
        if nvcc_threads:
            threads = nvcc_threads
        else:
            threads = max(1, min(MAX_NVCC_THREADS, max(1, cuda_archs), host.cores // jobs))
            reason += f"; nvcc --threads {threads} ({host.cores // jobs} idle cores per job, {cuda_archs} archs)"
    return JobPlan(jobs, reason, threads)


def plan_for(
    spec: BuildSpec,
    host: HostResources,
    cache_root: str | Path,
    jobs: int = 0,
    *,
    spread: bool = False,
    local_slots: int = 0,
) -> JobPlan:
    """The plan a build of spec gets here: --jobs (jobs), else the profile's max_jobs, with the
    per-job peaks measured on this profile's canaries (under cache_root) where there are some.
    spread (compiles sent to other nodes, CCACHE_PREFIX): --jobs for the light units, and the
    heavy ones' pool on this node beside distcc's local_slots (heavy_for)."""
    if jobs and spread:
        heavy = heavy_for(spec, host, cache_root, jobs, spread=True, local_slots=local_slots)
        if heavy.depth:
            return JobPlan(jobs, f"--jobs {jobs} over the allocation's nodes; {heavy.reason} here", heavy=heavy)
    if jobs:
        return JobPlan(jobs, f"--jobs {jobs}", spec.nvcc_threads)
    heavy = heavy_for(spec, host, cache_root)
    if heavy.depth:
        return JobPlan(heavy.jobs, f"auto: {host.cores} cores ({host.cores_source}); {heavy.reason}", heavy=heavy)
    peaks = Peaks.defaults(spec.mem_per_job_gb, spec.mem_per_cuda_job_gb).with_measured(
        load_measured(peaks_file(cache_root, spec.hash))
    )
    return plan_jobs(
        spec.max_jobs,
        spec.mem_per_job_gb,
        host,
        cuda=spec.cuda,
        peaks=peaks,
        nvcc_threads=spec.nvcc_threads,
        cuda_archs=len(spec.cuda_arch_list),
    )


def plan_make(spec: BuildSpec, host: HostResources, cache_root: str | Path, jobs: int = 0, *, kind: str) -> JobPlan:
    """The plan of a make whose compile jobs are of one kind ("cxx": the C++ per-job peak;
    "cuda": the CUDA one, for nvcc's device code) and that takes no nvcc --threads (NCCL's
    make, the aws-ofi-nccl plugin's): --jobs (jobs), else the profile's max_jobs, planned as
    plan_for plans, from the same peaks (measured on this profile's canaries where there are some)."""
    if jobs:
        return JobPlan(jobs, f"--jobs {jobs}")
    peaks = Peaks.defaults(spec.mem_per_job_gb, spec.mem_per_cuda_job_gb).with_measured(
        load_measured(peaks_file(cache_root, spec.hash))
    )
    # nvcc_threads=1: a fixed count adds nothing to the plan, and such a make is given none
    plan = plan_jobs(spec.max_jobs, spec.mem_per_job_gb, host, cuda=kind == "cuda", peaks=peaks, nvcc_threads=1)
    return JobPlan(plan.jobs, plan.reason)


# --------------------------------------------------------------------------- heavy units
# A few translation units (PyTorch's big operator files, the fixture's MINITORCH_HEAVY units)
# need several times the memory of the rest; planning every job for them caps the whole build
# at memory / heavy peak. With a heavy pool they alone are limited (a ninja pool, builder/heavy.py)
# and the light jobs use the cores.


def units_file(cache_root: str | Path, profile_hash: str) -> Path:
    """Peak memory per canary file (bytes), as this profile's preflights measured them."""
    return Path(cache_root) / "peaks" / f"{profile_hash[:16]}.units.json"


def load_unit_peaks(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, int) and v > 0}


def record_unit_peaks(path: Path, canaries: list[dict[str, object]]) -> dict[str, int]:
    """Keep each canary's largest peak (and earlier ones') for the heavy pool of later builds."""
    peaks = load_unit_peaks(path)
    for c in canaries:
        file, peak = str(c["file"]), c.get("peak_rss_bytes")
        if isinstance(peak, int) and peak > peaks.get(file, 0):
            peaks[file] = peak
    if peaks:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(peaks, indent=2, sort_keys=True))
    return peaks


@dataclasses.dataclass(frozen=True)
class HeavyPlan:
    """The heavy units' pool: source globs (relative to the tree), its depth, and the total jobs
    (MAX_JOBS) the light ones may then run; depth 0: no pool. fallback: the jobs where no compile
    matches the globs (every job planned at the heavy peak, as without a pool); local: the heavy
    compiles stay on this node while the others are spread over the allocation's nodes."""

    patterns: tuple[str, ...] = ()
    depth: int = 0
    jobs: int = 0
    reason: str = ""
    fallback: int = 0
    local: bool = False


def heavy_units(spec_units: tuple[str, ...], unit_peaks: Mapping[str, int], light_peak: int) -> tuple[str, ...]:
    """The profile's heavy_units and every measured unit whose peak (with PEAK_MARGIN) is above
    the light per-job peak."""
    measured = sorted(f for f, p in unit_peaks.items() if p * PEAK_MARGIN > light_peak and f not in spec_units)
    return (*spec_units, *measured)


def plan_heavy(host: HostResources, patterns: tuple[str, ...], light_peak: int, heavy_peak: int) -> HeavyPlan:
    """The largest pool depth d (1 at least) and total jobs n (cores at most) with
    d x heavy + (n - d) x light <= memory: light jobs first take the cores memory allows, the heavy
    pool gets what is left; where not even one heavy job fits beside them, n shrinks for it."""
    if not patterns:
        return HeavyPlan()
    light_peak, heavy_peak = max(1, light_peak), max(light_peak, heavy_peak)
    mem = host.memory_bytes
    jobs = max(1, min(host.cores, mem // light_peak))
    # a heavy job in place of a light one adds heavy - light
    depth = (mem - jobs * light_peak) // (heavy_peak - light_peak) if heavy_peak > light_peak else jobs
    if depth < 1:
        depth, jobs = 1, max(1, min(jobs, 1 + max(0, mem - heavy_peak) // light_peak))
    depth = min(depth, jobs)
    fallback = max(1, min(host.cores, mem // heavy_peak))
    reason = (
        f"heavy pool: {len(patterns)} pattern(s) at {heavy_peak / GiB:.2f} GiB, light jobs at {light_peak / GiB:.2f} GiB, "
        f"{mem / GiB:.1f} GiB ({host.memory_source}) -> {jobs} jobs, {depth} of them heavy at once"
    )
    return HeavyPlan(patterns, int(depth), int(jobs), reason, int(fallback))


def distcc_local_slots(hosts: str) -> int:
    """The compiles distcc runs on this node by DISTCC_HOSTS's value (its `localhost/N`); 0 where
    it names no such count."""
    for host in hosts.split():
        name, _, limit = host.partition("/")
        if name == "localhost" and limit.isdigit():
            return int(limit)
    return 0


def spread_heavy(
    plan: HeavyPlan, host: HostResources, light: int, heavy: int, jobs: int, local_slots: int
) -> HeavyPlan:
    """plan in a spread over nodes (jobs: every node's slots): the heavy compiles bypass distcc
    (env -u CCACHE_PREFIX) and so run beside its local slots' light ones, which fill this node
    first, not in their place: depth = (memory - slots x light) // heavy, 1 at least, jobs at
    most. local_slots 0 (DISTCC_HOSTS names none): the slots this node's memory allows."""
    light, heavy = max(1, light), max(light, heavy)
    mem = host.memory_bytes
    slots = local_slots or max(1, min(host.cores, mem // light))
    depth = max(1, min(jobs, (mem - slots * light) // heavy))
    reason = (
        f"heavy pool: {len(plan.patterns)} pattern(s) at {heavy / GiB:.2f} GiB beside distcc's {slots} local "
        f"slot(s) at {light / GiB:.2f} GiB, {mem / GiB:.1f} GiB ({host.memory_source}) -> {depth} heavy at once"
    )
    return dataclasses.replace(
        plan, depth=int(depth), jobs=jobs, reason=reason, fallback=min(jobs, plan.fallback), local=True
    )


def heavy_for(
    spec: BuildSpec,
    host: HostResources,
    cache_root: str | Path,
    jobs: int = 0,
    *,
    spread: bool = False,
    local_slots: int = 0,
) -> HeavyPlan:
    """The heavy pool a build of spec gets here: none for a fixed jobs count (--jobs, max_jobs)
    or CUDA builds (their per-job peak is the CUDA one) or where no unit is known to be heavy.
    spread: the compiles go to the allocation's nodes (jobs: their slots), the heavy ones stay
    here in a pool as deep as this node's memory beside distcc's local_slots allows
    (spread_heavy); the fallback is bounded by jobs too."""
    if spec.cuda or (not spread and (jobs or spec.max_jobs != "auto")):
        return HeavyPlan()
    light = int(spec.mem_per_job_gb * GiB)
    unit_peaks = load_unit_peaks(units_file(cache_root, spec.hash))
    patterns = heavy_units(spec.heavy_units, unit_peaks, light)
    measured = [p for f, p in unit_peaks.items() if f in patterns]
    heavy = int(max(measured) * PEAK_MARGIN) if measured else int(spec.mem_per_heavy_job_gb * GiB)
    plan = plan_heavy(host, patterns, light, heavy)
    if not spread or not plan.depth:
        return plan
    return spread_heavy(plan, host, light, heavy, jobs, local_slots)
