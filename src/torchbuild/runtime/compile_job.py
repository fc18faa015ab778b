"""One compile job, whichever step runs it: torch's build, the companions, an editable tree,
NCCL and its plugin.

    typed request (each step's Request, records.from_dict)
      -> plan        the allocation-aware planner (`plan`: plan_for, or plan_make for a make)
      -> environment inputs.environment.compile_env; MAX_JOBS and CMAKE_BUILD_PARALLEL_LEVEL
                     from the plan, set again on each out-of-memory resume (CompileJob.env_for)
      -> log         `open_log` (core.progress.Tee)
      -> run         CompileJob.compile: oom.run_compile, resumed with fewer jobs
      -> place       `partial_dir` then `into_place` (a rename: whole or not at all)
      -> record      CompileJob.manifest_fields / CompileJob.record: times, jobs planned and
                     used, toolchain versions, ccache's hit rate, torchbuild's version

Each step keeps only what is its own (torch's configure stamp and preflight, the companions'
version rules, NCCL's gencode). Also here: the interpreter's wheel tools, the environment that
makes objects independent of the tree's path, and the pip wheel command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from torchbuild import __version__
from torchbuild.core import process
from torchbuild.core.atomic import PARTIAL_PREFIX
from torchbuild.core.errors import ToolMissing, TorchbuildError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, Finished, run_captured
from torchbuild.core.progress import Tee
from torchbuild.profile import remote_cache
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime.environment import compiler_commands, jobs_env
from torchbuild.runtime.jobs import HostResources, JobPlan, distcc_local_slots, plan_for, plan_make
from torchbuild.runtime.oom import JobsUsed, Sink, run_compile
from torchbuild.runtime.tree import SETUP_PY, SKBUILD, is_skbuild


def now_utc() -> str:
    """The time now in UTC, to the second (ISO 8601): when a compile job started or finished."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


VERSION_PROBE_S = 60.0  # `cc --version` and the like: a site's wrapper may load a module first


def first_line(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The first line a tool's version command prints ("" when the tool is not there, or says
    nothing within VERSION_PROBE_S). It runs in a process group of its own that is stopped on
    every way out: Ctrl-C or SIGTERM during the probe of a wrapper (a site's `cc` script) left
    the wrapper's child running after torchbuild had said its processes were stopped."""
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        return ""
    done = run_captured(cmd, env=env or None, timeout=VERSION_PROBE_S)
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else ""


def toolchain_versions(spec: BuildSpec, env: Mapping[str, str]) -> dict[str, str]:
    commands = compiler_commands(spec)
    cc, cxx = env.get("CC") or commands["CC"], env.get("CXX") or commands["CXX"]  # what the build ran
    versions = {
        "cc": first_line([cc, "--version"], env),
        "cxx": first_line([cxx, "--version"], env),
        "python": sys.version.split()[0],
        "cmake": first_line(["cmake", "--version"], env),
        "ninja": first_line(["ninja", "--version"], env),
        "ccache": first_line(["ccache", "--version"], env),
    }
    if spec.cuda:
        nvcc = env.get("CUDACXX", "nvcc")
        proc = run_captured([nvcc, "--version"], timeout=VERSION_PROBE_S) if shutil.which(nvcc) else None
        lines = proc.stdout.strip().splitlines() if proc and proc.returncode == 0 else []
        # "Cuda compilation tools, release 12.4, V12.4.131"
        versions["nvcc"] = next((ln for ln in lines if "release" in ln), lines[-1] if lines else "not found")
    return versions


def ccache_stats(env: Mapping[str, str]) -> dict[str, int]:
    """ccache's counters (ccache >= 4.4 `--print-stats`), {} when unavailable (also when there is
    no ccache at all: `invoke comms` natively on a site node without one)."""
    try:
        proc = run_captured(["ccache", "--print-stats"], env=env, timeout=QUERY_TIMEOUT)
    except OSError:
        return {}
    stats: dict[str, int] = {}
    if proc.returncode == 0:
        for line in proc.stdout.splitlines():
            key, _, value = line.partition("\t")
            if value.strip().isdigit():
                stats[key] = int(value)
    return stats


def hit_rate(stats: Mapping[str, int]) -> tuple[int, int, float]:
    """(hits, misses, rate) of compilations ccache saw since its counters were zeroed."""
    hits = stats.get("direct_cache_hit", 0) + stats.get("preprocessed_cache_hit", 0)
    misses = stats.get("cache_miss", 0)
    total = hits + misses
    return hits, misses, (hits / total if total else 0.0)


_WHEEL_TOOLS = """
import importlib.util as u
missing = []
if KIND == "scikit-build-core":
    if u.find_spec("scikit_build_core") is None:
        missing.append("scikit-build-core")
elif u.find_spec("setuptools") is None:
    missing.append("setuptools")
elif u.find_spec("setuptools.command.bdist_wheel") is None and u.find_spec("wheel") is None:
    missing.append("wheel")  # setuptools < 70.1 needs the wheel package for bdist_wheel
print(" ".join(missing))
"""


def check_wheel_tools(source: str, python: str = sys.executable) -> None:
    """--no-build-isolation builds with the interpreter's packages: say what is missing up front
    (the backend of the tree's kind, runtime/tree.py: setuptools and wheel, or scikit-build-core)."""
    if is_skbuild(source):
        kind = SKBUILD
    elif (Path(source) / "setup.py").is_file():
        kind = SETUP_PY
    else:  # a tree of another kind: pip says what it lacks
        return
    # asked of the interpreter itself (another Python's packages are not this process's)
    proc = run_captured([python, "-c", f"KIND = {kind!r}\n{_WHEEL_TOOLS}"], timeout=QUERY_TIMEOUT)
    if proc.returncode != 0:
        raise ToolMissing(f"{python} does not run: {proc.stderr.strip()[-300:]}")
    missing = proc.stdout.split()
    if missing:
        raise ToolMissing(
            f"{python} lacks {', '.join(missing)}, which a {kind} build needs",
            hint=f"{python} -m pip install {' '.join(missing)} (with the rest of PyTorch's requirements.txt)",
        )


def path_independent(env_vars: Mapping[str, str], source: str) -> dict[str, str]:
    """What makes objects independent of where the tree is: ccache rewrites the tree's absolute
    paths into relative ones, for its hash and for the compiler (so __FILE__ and assert messages
    say `../aten/...`), and leaves the working directory out of the hash. A profile's own
    CCACHE_BASEDIR wins. No -ffile-prefix-map is added to CFLAGS/CXXFLAGS: PyTorch (and the
    fixture) record those flags in the library (torch.__config__.show()), so the tree's path
    would be in every wheel."""
    return {
        "CCACHE_BASEDIR": env_vars.get("CCACHE_BASEDIR") or os.path.abspath(source),
        "CCACHE_NOHASHDIR": env_vars.get("CCACHE_NOHASHDIR", "1"),
    }


def pip_wheel(partial: Path, source: str, python: str = sys.executable, config: Sequence[str] = ()) -> list[str]:
    """The wheel build: with the interpreter's packages (torch's build requirements, or the torch
    a companion is built against), no dependencies, verbose for the log; config: the backend's
    --config-settings (a scikit-build-core tree's, runtime/skbuild.py)."""
    return [
        python,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "-v",
        *config,
        "-w",
        str(partial),
        "--",
        source,
    ]


# --------------------------------------------------------------------------- the job

R = TypeVar("R")


def plan(spec: BuildSpec, cache_root: str | Path, jobs: int = 0, *, kind: str = "") -> JobPlan:
    """The jobs a compile may run where the step runs (an allocation's cores and memory, a
    container's limits: HostResources.detect); jobs: --jobs (0: plan). kind "": a build that
    takes nvcc --threads (torch, a companion, an editable tree); "cxx" or "cuda": a make of
    that kind of compile job (NCCL's device code, the plugin's C++). Where ccache hands its
    misses to a distributor (CCACHE_PREFIX: a spread over nodes, batch/spread.py), the heavy
    units keep their pool on this node, beside distcc's own slots here (DISTCC_HOSTS's localhost/N)."""
    host = HostResources.detect()
    if kind:
        return plan_make(spec, host, cache_root, jobs, kind=kind)
    spread = bool(os.environ.get("CCACHE_PREFIX", "").strip())
    local_slots = distcc_local_slots(os.environ.get("DISTCC_HOSTS", ""))
    return plan_for(spec, host, cache_root, jobs, spread=spread, local_slots=local_slots)


def open_log(path: Path, out: TextIO, progress: str = "lines", what: str = "writing the build log") -> Tee:
    """The job's log: its output goes to out and to path."""
    with named_os_errors(path.parent, what):
        return Tee(path, out, progress)


# A result's partial directory is held (flock on the directory itself) by the process that makes
# it: a run killed outright (SIGKILL, a node lost, a container killed) cannot remove its own, so
# the next run into the same out/ removes every held-tagged one that no live process holds. The
# lock must die with its maker and sit on the directory it guards: filelock's lock files live
# beside what they guard and would be one more thing a killed run leaves behind. Where the file
# system refuses flock on a directory (some NFS mounts), the partial is not held and never swept.
HELD_TAG = "held-"
_HELD: dict[Path, int] = {}


def partial_dir(out_dir: Path, run_id: str, what: str, note: Callable[[str], None] | None = None) -> Path:
    """A fresh .partial-<run_id>-held-* directory in out_dir for a result being made, held by
    this process until release_partial (the backend removes those of a failed run; the next run
    those of a run killed outright, naming them through note)."""
    for gone in sweep_partials(out_dir):
        if note is not None:
            note(f"torchbuild: removed {gone.name}, left in {out_dir} by a run that was cut off")
    with named_os_errors(out_dir, f"creating {what}'s partial directory"):
        made = Path(tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{run_id}-{HELD_TAG}", dir=out_dir))
    fd = _try_lock(made, blocking=True)
    if fd is not None:
        _HELD[made] = fd
        process.HELD_FDS.add(fd)  # pip, which writes into it, holds it too
    return made


def release_partial(made: Path) -> None:
    """Remove a partial directory (what is left of it) and let go of it."""
    shutil.rmtree(made, ignore_errors=True)
    fd = _HELD.pop(made, None)
    if fd is not None:
        process.HELD_FDS.discard(fd)
        os.close(fd)


def _try_lock(path: Path, blocking: bool) -> int | None:
    """An open descriptor of the directory holding its flock, or None (not a directory of ours, held
    by another process, or a file system without flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def sweep_partials(out_dir: Path) -> list[Path]:
    """Remove the held-tagged partial directories in out_dir that no live process holds."""
    removed = []
    for p in sorted(out_dir.glob(f"{PARTIAL_PREFIX}*-{HELD_TAG}*")):
        if p in _HELD:
            continue
        fd = _try_lock(p, blocking=False)
        if fd is None:
            continue
        try:
            shutil.rmtree(p, ignore_errors=True)
        finally:
            os.close(fd)
        removed.append(p)
    return removed


def into_place(made: Path, final: Path, what: str, *, keep_existing: bool = False) -> Path:
    """made renamed to final (a rename: whole or not at all). keep_existing: a final already
    there (another run finished the same result meanwhile) is kept and made dropped."""
    with named_os_errors(final, f"moving {what} into place"):
        if keep_existing and final.exists():
            shutil.rmtree(made)
        else:
            os.replace(made, final)
    return final


@dataclasses.dataclass
class CompileJob:
    """One compile as it goes: its plan, its environment, where its output goes, the jobs it
    used (fewer after an out-of-memory kill) and when it started."""

    spec: BuildSpec
    plan: JobPlan
    env_vars: dict[str, str]  # what torchbuild sets (printed and recorded): compile_env's
    env: dict[str, str]  # the whole environment of the job's processes
    sink: Sink
    retry: bool = True  # resume with fewer jobs after an out-of-memory kill
    started: str = dataclasses.field(default_factory=now_utc)
    t0: float = dataclasses.field(default_factory=time.monotonic)
    jobs: JobsUsed = dataclasses.field(init=False)
    _versions: dict[str, str] | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.jobs = JobsUsed(self.plan.jobs, self.plan.jobs)

    def toolchain(self) -> dict[str, str]:
        """The toolchain's versions (read once)."""
        if self._versions is None:
            self._versions = toolchain_versions(self.spec, self.env)
        return self._versions

    def env_for(self, n: int) -> dict[str, str]:
        """The environment of an attempt with n jobs (jobs_env: MAX_JOBS, CMAKE_BUILD_PARALLEL_LEVEL)."""
        return {**self.env, **jobs_env(n)}

    def zero_ccache(self) -> None:
        """ccache's counters from zero: the hit rate recorded is this job's. What they held is
        said first: a build cut before its manifest leaves its figures only there, and the run
        that resumes it shows them (a unit compiled again would be a hit on the next run)."""
        hits, misses, _ = hit_rate(ccache_stats(self.env))
        if hits or misses:
            self.sink.line(f"ccache before this run (the run before it, cut or finished): {hits} hits, {misses} misses")
        with contextlib.suppress(OSError):  # no ccache here: nothing to zero
            run_captured(["ccache", "--zero-stats"], env=self.env, timeout=QUERY_TIMEOUT)

    def compile(
        self,
        cmd_for: Callable[[int], Sequence[str]],
        *,
        cwd: str,
        what: str,
        watch: Callable[[str], None] | None = None,
        failure: Callable[[Finished], TorchbuildError] | None = None,
        before: Callable[[int], int] | None = None,
    ) -> float:
        """cmd_for(jobs) in cwd, resumed with fewer jobs after an out-of-memory kill; seconds spent.
        before(jobs), where given, runs before each attempt (the heavy units' pool follows jobs)
        and says the jobs the attempt runs (fewer where the heavy units found no pool)."""

        def env_for(n: int) -> dict[str, str]:
            if before is not None:
                n = self.jobs.current = max(1, min(n, before(n)))
            return self.env_for(n)

        return run_compile(
            cmd_for,
            cwd=cwd,
            env_for=env_for,
            sink=self.sink,
            what=what,
            jobs=self.jobs,
            retry=self.retry,
            watch=watch,
            failure=failure,
        )

    def jobs_record(self) -> dict[str, Any]:
        """The jobs planned and used, and every out-of-memory retry (a manifest's jobs record)."""
        return {
            "max_jobs": self.jobs.start,
            "final_jobs": self.jobs.current,
            "reason": self.plan.reason,
            "nvcc_threads": self.plan.nvcc_threads,
            "retries": self.jobs.retries,
        }

    def manifest_fields(self) -> dict[str, Any]:
        """What every compile records, as manifest.for_build takes it (which adds torchbuild's
        version): toolchain, environment, jobs, times, ccache's hit rate and, with a remote
        storage, its counters (one warning on the sink when it failed)."""
        stats = ccache_stats(self.env)
        return {
            "toolchain": self.toolchain(),
            "environment": self.env_vars,
            "jobs": self.jobs_record(),
            "started": self.started,
            "finished": now_utc(),
            "seconds": time.monotonic() - self.t0,
            "ccache": hit_rate(stats),
            "ccache_remote": self.remote_record(stats),
        }

    def remote_record(self, stats: Mapping[str, int]) -> dict[str, Any] | None:
        """The remote compile cache's counters (CcacheRemoteRecord's fields), None without one;
        one warning when it failed (ccache went on with the local cache: slower, not broken)."""
        if not self.spec.ccache_remote:
            return None
        counts = remote_cache.remote_counts(stats)
        warning = remote_cache.failure_warning(counts)
        if warning:
            self.sink.line(warning)
        return {"url": self.spec.ccache_remote, "read_only": self.spec.ccache_remote_readonly, **counts}

    def record(self) -> dict[str, Any]:
        """manifest_fields as plain data, with torchbuild's version (the comms manifest's parts)."""
        fields = self.manifest_fields()
        hits, misses, rate = fields.pop("ccache")
        remote = fields.pop("ccache_remote")
        fields.pop("environment")
        return {
            "torchbuild_version": __version__,
            **{k: v for k, v in fields.items() if k != "seconds"},
            "duration_s": round(fields["seconds"], 1),
            "ccache": {
                "hits": hits,
                "misses": misses,
                "hit_rate": round(rate, 4),
                **({"remote": remote} if remote else {}),
            },
        }
