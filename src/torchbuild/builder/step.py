"""The build itself. The same code runs inside the toolchain container (`torchbuild build-inside`)
and natively on a login node (`invoke build` without --in-container).

A BuildRequest is plain data (JSON) so the host can hand it to the container; everything the
build does is decided by it and the host facts read here (cores, memory limit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from torchbuild import __version__
from torchbuild.builder import buildenv, cmakecache, codegen, flatbuf, runs, unitpeak
from torchbuild.builder.bound import (
    bound_of,
    efficiency_record,
    ninja_graph,
    not_this_run,
    parse_graph,
    render_across,
    render_bound,
    render_heaviest,
)
from torchbuild.builder.heavy import apply_cmake_pool, apply_pool, pool_record, write_cmake_hook
from torchbuild.builder.repro import normalize_wheel
from torchbuild.core.atomic import atomic_write_text
from torchbuild.core.console import table
from torchbuild.core.dirs import make_dirs
from torchbuild.core.errors import BuildFailed, PathError, TorchbuildError, named_os_errors
from torchbuild.core.process import Finished, run_captured
from torchbuild.core.progress import Tee
from torchbuild.core.safeio import sha256_file
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime import compile_job, elffloor, manifest, skbuild
from torchbuild.runtime.compile_job import (
    CompileJob,
    check_wheel_tools,
    into_place,
    now_utc,
    open_log,
    partial_dir,
    path_independent,
    pip_wheel,
    release_partial,
)
from torchbuild.runtime.environment import NO_CCACHE, ccache_launcher, compile_env, format_env
from torchbuild.runtime.jobs import peaks_file, record_measured, record_unit_peaks, units_file
from torchbuild.runtime.oom import run_watched
from torchbuild.runtime.pipenv import interpreter
from torchbuild.runtime.report import LogMark, Report, Step, mark, read_across_runs, write_report
from torchbuild.runtime.tree import SKBUILD, kind_of


@dataclasses.dataclass(frozen=True)
class BuildRequest:
    spec: BuildSpec
    source: str  # the tree as the build sees it (/src in the container)
    out_dir: str  # where the wheel, manifest and logs go (/out in the container)
    cache_root: str  # ccache, pip cache, HOME (/cache in the container)
    preflight: bool = False
    clean: bool = False  # remove the build tree first
    jobs: int = 0  # 0: plan from the profile and this machine
    targets: tuple[str, ...] = ()  # preflight targets; empty: the profile's
    canaries: tuple[str, ...] = ()  # preflight canaries; empty: the profile's
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # source, patches, image
    progress: str = "auto"  # bar, lines, raw; auto: bar on a terminal, else lines
    oom_retry: bool = True  # resume with fewer jobs after an out-of-memory kill
    backend: str = "native"  # which backend runs it (the environment differs; recorded as the engine)
    # variables added to the build's environment (NCCL_ROOT and friends of the NCCL `invoke comms` built)
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    python: str = ""  # X.Y of the interpreter to build with; "": the one running this step
    source_date_epoch: int = 0  # the source's time (repro.source_date_epoch); 0: none known
    epoch_origin: str = ""  # where that time came from
    # CUDA_HOME as the host chose it (environment.cuda_home: natively the loaded CUDA's unless
    # the profile sets cuda_home itself); "": the profile's
    cuda_home: str = ""
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])


Request = BuildRequest  # the step's typed request, as every compile step names it


def run_logged(
    cmd: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    tee: Tee,
    what: str,
    watch: Callable[[str], None] | None = None,
) -> Finished:
    """Run cmd streaming its output into tee; BuildFailed on a non-zero exit."""
    done, _ = run_watched(cmd, cwd=cwd, env=env, sink=tee, watch=watch)
    if done.returncode != 0:
        raise BuildFailed(f"{what} failed (exit {done.returncode}) after {done.seconds:.0f} s; log: {tee.path}")
    return done


def build_dir(source: str) -> Path:
    return Path(source) / "build"


def remove_build_dir(source: str, tee: Tee) -> None:
    """--clean: remove the tree's build/ directory. A symbolic link there is refused (PathError
    naming it and its target): shutil.rmtree refuses links with an OSError that named nothing
    ("invoke build: .: OSError"), and what a link points to is not the tree's to remove."""
    build = build_dir(source)
    if build.is_symlink():
        with named_os_errors(build, "--clean"):
            target = os.readlink(build)
        raise PathError(
            f"--clean: {build} is a symbolic link (to {target}): --clean removes the tree's own build "
            "directory, never what a link points to",
            hint=f"remove the link (rm {build}) or empty what it points to yourself, then build again",
        )
    if not build.exists():
        return
    tee.line(f"removing {build} (--clean)")
    with named_os_errors(build, "--clean: removing the build directory"):
        shutil.rmtree(build)


def configure(
    source: str,
    env: Mapping[str, str],
    tee: Tee,
    watch: Callable[[str], None] | None = None,
    python: str = sys.executable,
    defines: Mapping[str, str] | None = None,
) -> float:
    """CMake configure the way the wheel build would, by the tree's kind (runtime/tree.py):
    setup.py build --cmake-only, or for a scikit-build-core tree CMake as the backend runs it
    (runtime/skbuild.py) with torchbuild's defines."""
    if kind_of(source) == SKBUILD:
        cmd = skbuild.configure_cmd(source, env, defines or {}, python)
    else:
        cmd = [python, "setup.py", "build", "--cmake-only"]
    return run_logged(cmd, cwd=source, env=env, tee=tee, what="configure", watch=watch).seconds


# --------------------------------------------------------------------------- configure stamp
# setup.py reuses an existing CMakeCache.txt: a build with other flags on a configured tree
# would silently compile with the old ones. The stamp records what the last configure was
# given; a difference (or a configure that never finished) clears CMake's state first.

CONFIGURE_STAMP = "torchbuild-configure.json"
CONFIGURE_DONE = "-- Build files have been written to: "  # CMake's last line of a good configure
_NOT_CONFIGURE_INPUTS = (
    "MAX_JOBS",
    "CMAKE_BUILD_PARALLEL_LEVEL",
    "HOME",
    "PYTHONUNBUFFERED",
    "TMPDIR",
    "PIP_CACHE_DIR",
)


def configure_inputs(env_vars: Mapping[str, str]) -> dict[str, str]:
    """The part of the build environment that decides what CMake generates."""
    return {
        k: v
        for k, v in sorted(env_vars.items())
        if k not in _NOT_CONFIGURE_INPUTS and not k.startswith(("CCACHE_", "GIT_CONFIG_"))
    }


def _stamp(source: str) -> Path:
    return build_dir(source) / CONFIGURE_STAMP


def write_stamp(source: str, inputs: Mapping[str, str], complete: bool) -> None:
    path = _stamp(source)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"complete": complete, "inputs": dict(inputs)}, indent=2) + "\n")


def stale_configure(source: str, inputs: Mapping[str, str]) -> str | None:
    """Why the tree's CMake state cannot be reused with inputs, or None when it can (or there
    is none)."""
    if not (build_dir(source) / "CMakeCache.txt").exists():
        return None
    try:
        old = json.loads(_stamp(source).read_text())
    except (OSError, ValueError):
        return "it was configured without a torchbuild record of its inputs"
    before: dict[str, str] = old.get("inputs") or {}
    changed = sorted(k for k in {*before, *inputs} if before.get(k) != inputs.get(k))
    if changed:
        return f"{', '.join(changed)} changed since it was configured"
    return None if old.get("complete") else "its last configure did not finish"


def prepare_configure(source: str, inputs: Mapping[str, str], tee: Tee) -> None:
    """Clear CMake's state when it is stale (saying why), then stamp the inputs as pending."""
    reason = stale_configure(source, inputs)
    b = build_dir(source)
    if reason is not None:
        tee.line(f"torchbuild: reconfiguring {b}: {reason}")
        clear_cmake_state(b)
        write_stamp(source, inputs, complete=False)
    elif (b / "CMakeCache.txt").exists():  # configured with these inputs, and it finished
        tee.line(f"torchbuild: skipping configure: {b} was configured with these inputs and finished")
    else:
        write_stamp(source, inputs, complete=False)


def clear_cmake_state(b: Path) -> None:
    """Remove what makes setup.py (or CMake) reuse a configure: its cache, build.ninja, CMakeFiles."""
    for name in ("CMakeCache.txt", "build.ninja"):
        (b / name).unlink(missing_ok=True)
    shutil.rmtree(b / "CMakeFiles", ignore_errors=True)


def configure_finished(source: str) -> bool:
    try:
        return bool(json.loads(_stamp(source).read_text()).get("complete"))
    except (OSError, ValueError, AttributeError):
        return False


class ConfigureWatch:
    """Marks the stamp complete when CMake says it wrote the build files."""

    def __init__(self, source: str, inputs: Mapping[str, str]) -> None:
        self.source, self.inputs = source, inputs

    def __call__(self, line: str) -> None:
        if CONFIGURE_DONE in line:  # pip -v indents the build's output
            write_stamp(self.source, self.inputs, complete=True)


_T = TypeVar("_T")


def with_checks(run: Run, watch: ConfigureWatch, step: Callable[[Callable[[str], None]], _T]) -> _T:
    """Run step (what configures: setup.py --cmake-only, or pip wheel) with the watch it gets on
    its output, after seeding a fresh tree with the probe results an earlier configure in this
    image saved (cmakecache.py). A seeded configure that fails drops them and step runs once more
    from a clean tree; a configure that finished saves its probe results for the next fresh tree."""
    req, tee, b = run.req, run.tee, build_dir(run.req.source)
    checks = cmakecache.for_build(req.cache_root, req.provenance.get("image"), run.versions, watch.inputs)
    if checks is None:
        tee.line("torchbuild: CMake checks: not reused outside a toolchain image (a host's libraries change unseen)")
        return step(watch)
    try:
        seeded, why = checks.seed(b, Path(req.source))
    except OSError as exc:
        seeded, why = 0, f"could not seed them: {exc}"
    if seeded:
        tee.line(f"torchbuild: CMake checks: seeding {b}/CMakeCache.txt with {seeded} results: {checks.path}")
    probes = cmakecache.ProbeCounter(watch)
    try:
        result = step(probes)
    except BuildFailed:
        if not seeded or configure_finished(req.source):
            raise
        tee.line(f"torchbuild: configure failed with seeded CMake checks: dropped {checks.path}, retrying")
        checks.drop()
        clear_cmake_state(b)
        write_stamp(req.source, watch.inputs, complete=False)
        seeded, why, probes = 0, "the seeded configure failed", cmakecache.ProbeCounter(watch)
        result = step(probes)
    if why != cmakecache.OWN_CACHE:
        done = f"{seeded} seeded" if seeded else f"none seeded ({why})"
        tee.line(f"torchbuild: CMake checks: {done}, {probes.count} probes ran")
    if configure_finished(req.source):
        try:
            saved, wrote = checks.save(b, Path(req.source), run.versions)
        except OSError as exc:
            tee.line(f"torchbuild: CMake checks: not saved: {exc}")
        else:
            if wrote:
                tee.line(f"torchbuild: CMake checks: saved {saved} for the next fresh tree: {checks.path}")
    return result


def object_target(source: str, file: str, env: Mapping[str, str]) -> str:
    """The ninja target that compiles one source file: .../Foo.cpp.o, or for ATen's per-CPU-
    capability kernels (native/cpu/*.cpp) the DEFAULT variant .../Foo.cpp.DEFAULT.cpp.o."""
    # ninja reads the whole build.ninja and lists every target
    proc = run_captured(["ninja", "-C", str(build_dir(source)), "-t", "targets", "all"], env=env, timeout=600)
    targets = [line.split(":", 1)[0] for line in proc.stdout.splitlines()]
    rel = Path(file).as_posix()
    for suffix in (".o", ".DEFAULT.cpp.o"):
        matches = [t for t in targets if t.endswith("/" + Path(rel).name + suffix)]
        # prefer the target whose path carries the file's directory (two files may share a name)
        best = [t for t in matches if Path(rel).parent.as_posix() in t] or matches
        if best:
            return best[0]
    raise BuildFailed(
        f"canary {file}: no object target for it in {build_dir(source)}/build.ninja",
        hint="give the path relative to the source tree, of a file this configuration compiles",
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Where a build's results are; everything else about it is in the manifest."""

    wheel: Path | None  # None for a preflight
    manifest: Path
    log: Path


@dataclasses.dataclass
class Run:
    """One build as it goes: what it was asked, where it logs, its compile job (plan,
    environment, jobs used, times), what it measured."""

    req: BuildRequest
    tee: Tee
    log: Path
    job: CompileJob
    tmp: Path  # TMPDIR of this run (pip's temporary trees), removed at the end
    canaries: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    ninja_mark: LogMark | None = None  # where .ninja_log stood before this build
    python: str = sys.executable  # the interpreter that configures and builds the wheel
    normalized: bool = False  # the wheel's zip was rewritten into canonical form
    epoch_origin: str = ""  # where SOURCE_DATE_EPOCH came from
    venv: buildenv.BuildVenv | None = None  # the native build venv (profile key build_venv)
    floor: manifest.FloorRecord | None = None  # the wheel's ELF floor (runtime/elffloor.py)
    records: list[runs.RunRecord] = dataclasses.field(default_factory=list)  # the tree's runs, this one ended
    kind: str = ""  # the tree's kind (runtime/tree.py): setup.py or scikit-build-core

    def defines(self, jobs: int) -> dict[str, str]:
        """torchbuild's CMake defines for a scikit-build-core tree (runtime/skbuild.py): the code
        generation's include and the heavy pool's hook for jobs; {} for a setup.py tree."""
        if self.kind != SKBUILD:
            return {}
        hook = write_cmake_hook(build_dir(self.req.source), self.job.plan.heavy, jobs)
        return skbuild.project_defines(self.env_vars, hook)

    def configure(self, watch: Callable[[str], None]) -> float:
        return configure(
            self.req.source, self.env, self.tee, watch, python=self.python, defines=self.defines(self.job.jobs.current)
        )

    @property
    def env_vars(self) -> dict[str, str]:
        return self.job.env_vars

    @property
    def env(self) -> dict[str, str]:
        return self.job.env

    @property
    def versions(self) -> dict[str, str]:
        return self.job.toolchain()


def run_build(req: BuildRequest, out: TextIO = sys.stdout) -> Outcome:
    """Build a wheel (or run a preflight) as the request says; write manifest and log to out_dir."""
    out_dir = Path(req.out_dir)
    kind = "preflight" if req.preflight else "build"
    log = out_dir / "logs" / f"{kind}-{req.spec.profile}-{time.strftime('%Y%m%d-%H%M%S')}-{req.run_id}.log"
    tee = open_log(log, out, req.progress)
    run: Run | None = None
    tree: int | None = None
    try:
        tree = runs.hold_tree(Path(req.source))  # before anything writes into the tree
        run = _start(req, tee, log)
        if req.clean:
            remove_build_dir(req.source, tee)
        run.ninja_mark = mark(build_dir(req.source) / ".ninja_log")
        # the run's start in the tree's record: a build cut off and run again is one build
        runs.begin(build_dir(req.source), req.run_id, log, time.time() - (time.monotonic() - run.job.t0))
        # another interpreter is another configure (Python's paths are in CMake's cache); ninja
        # and ccache still reuse every object whose command line is the same
        inputs = {**configure_inputs(run.env_vars), "torchbuild:python": run.python}
        prepare_configure(req.source, inputs, tee)
        watch = ConfigureWatch(req.source, inputs)
        run.job.zero_ccache()
        # before configure: a pinned generated header that cannot compile fails here, not at 90 %
        regenerated = flatbuf.regenerate(req.source, run.env)
        if regenerated:
            tee.line(regenerated)
        if req.preflight:
            _preflight(run, watch)
            return _finish(run, None)
        return _finish(run, _build_wheel(run, watch))
    finally:
        runs.release_tree(tree)
        tee.close()
        # this run's TMPDIR, also when it stopped while starting (Ctrl-C during the tool probes)
        shutil.rmtree(run_tmp(req), ignore_errors=True)


def run_tmp(req: BuildRequest) -> Path:
    """TMPDIR of the run (pip's temporary trees): cache_dir/tmp/<run id>, removed at its end."""
    return Path(req.cache_root) / "tmp" / req.run_id


def _start(req: BuildRequest, tee: Tee, log: Path) -> Run:
    """Plan the jobs, compute the environment, print both, read the tool versions."""
    spec = req.spec
    started, t0 = now_utc(), time.monotonic()
    kind = kind_of(req.source)  # a tree torchbuild cannot build is named before anything runs
    plan = compile_job.plan(spec, req.cache_root, req.jobs)
    env_vars = compile_env(spec, plan, req.cache_root, req.extra_env, backend=req.backend, cuda=req.cuda_home)
    env_vars.update(path_independent(env_vars, req.source))
    if req.source_date_epoch and "SOURCE_DATE_EPOCH" not in spec.env:
        env_vars["SOURCE_DATE_EPOCH"] = str(req.source_date_epoch)
    python = interpreter(req.python)
    tmp = run_tmp(req)
    for d in (env_vars["CCACHE_DIR"], env_vars["PIP_CACHE_DIR"], tmp):
        with named_os_errors(d, "creating the build's cache directories"):
            make_dirs(d)
    tee.line(f"torchbuild {__version__}: {'preflight' if req.preflight else 'wheel build'} of {req.source} ({kind})")
    tee.line(f"profile {spec.profile} (sha256 {spec.hash[:16]}), version {spec.build_version}, on {req.backend}")
    tee.line(f"jobs: {plan.jobs} ({plan.reason})")
    if req.backend == "native" and not ccache_launcher(req.backend):
        tee.line(NO_CCACHE)
    _check_floor(req, env_vars, tee)
    venv = _build_venv(req, python, env_vars, tee)
    python = venv.python if venv else python
    _codegen(req, python, env_vars, tee)
    path = {"PATH": venv.env(os.environ, False)["PATH"]} if venv else {}
    env = {**os.environ, **env_vars, **path, "TMPDIR": str(tmp)}
    if req.python:
        tee.line(f"python: {python} (Python {req.python})")
    tee.line("environment:")
    for line in format_env(env_vars).splitlines():
        tee.line(f"  {line}")
    _measure_units(req, env, tmp, tee)
    job = CompileJob(spec, plan, env_vars, env, tee, req.oom_retry, started, t0)
    job.toolchain()
    run = Run(req, tee, log, job, tmp)
    run.python, run.epoch_origin, run.venv, run.kind = python, req.epoch_origin, venv, kind
    return run


def _check_floor(req: BuildRequest, env_vars: Mapping[str, str], tee: Tee) -> None:
    """The toolchain against the profile's glibc_floor and libstdcxx_floor, before anything
    compiles (FloorError naming a base that fits)."""
    engine = req.provenance.get("engine", req.backend)
    where = "this host" if engine == "native" else f"the toolchain image's base {req.spec.base_image}"
    said = elffloor.check_toolchain(req.spec, {**os.environ, **env_vars}, where)
    if said:
        tee.line(said)


UNITS_RECORD = "torchbuild-units.tsv"  # in the build directory: a resumed build adds to it


def _measure_units(req: BuildRequest, env: dict[str, str], tmp: Path, tee: Tee) -> None:
    """Each real compile's peak memory and time into build/torchbuild-units.tsv, through ccache's
    prefix command (builder/unitpeak.py): not where ccache is not the launcher, nor in a spread
    over nodes, whose CCACHE_PREFIX is distcc (a remote compile's memory is not this node's)."""
    if "CMAKE_CXX_COMPILER_LAUNCHER" not in env or env.get("CCACHE_PREFIX", "").strip():
        return
    measure = unitpeak.launcher(str(tmp), str(build_dir(req.source) / UNITS_RECORD))
    if measure is None:
        tee.line("torchbuild: units' peak memory not measured: a path has whitespace (ccache splits CCACHE_PREFIX)")
        return
    env.update(measure)
    tee.line(f"torchbuild: each compile's peak memory and time go to build/{UNITS_RECORD} (through CCACHE_PREFIX)")


def _across_runs(run: Run, ninja_log: Path, deps: Mapping[str, set[str]] | None) -> tuple[str, dict[str, Any]] | None:
    """The whole build's bound and walls where the tree records several runs (builder/runs.py),
    else None (this run's own figures stand). A log with steps from before the record began
    (a tree a torchbuild without it started) gives none: its walls are not known."""
    records = run.records
    if len(records) < 2:
        return None
    across = read_across_runs(ninja_log, [r.start for r in records], [r.end for r in records])
    if across.unplaced:
        run.tee.line(
            f"torchbuild: no whole-build lower bound: {across.unplaced} of the log's steps were made "
            "before the tree recorded its runs"
        )
        return None
    # a cut run stopped at its log's last write, or at its ninja's last step where that came later
    # (pip holds the build's output until the end: the log may go quiet long before the cut)
    walls = [max(r.wall or 0.0, (w or r.start) - r.start) for r, w in zip(records, across.last_write, strict=True)]
    b = bound_of(across.steps, deps, run.job.jobs.start)
    return render_across(b, walls, across.spans), efficiency_record(b, sum(across.spans), sum(walls), len(records))


def _heaviest(run: Run) -> list[dict[str, object]]:
    """The ten units with the highest peak memory this tree's builds measured; every measured
    unit's peak is kept for the heavy pool of the next plans (inputs.jobs.record_unit_peaks)."""
    units = unitpeak.read_record(str(build_dir(run.req.source) / UNITS_RECORD), run.req.source)
    if units:
        measured = [{"file": f, "peak_rss_bytes": peak} for f, (peak, _) in units.items()]
        with contextlib.suppress(OSError):
            record_unit_peaks(units_file(run.req.cache_root, run.req.spec.hash), measured)
    return unitpeak.heaviest(units)


def _codegen(req: BuildRequest, python: str, env_vars: dict[str, str], tee: Tee) -> None:
    """Run ATen's code generation through its cache (codegen.py) unless the profile's
    environment names its own CMAKE_PROJECT_INCLUDE."""
    if "CMAKE_PROJECT_INCLUDE" in env_vars:
        if codegen.hook(req.cache_root, python, req.source, write=False):
            tee.line("torchbuild: code generation: not reused (the environment sets CMAKE_PROJECT_INCLUDE)")
        return
    try:
        env_vars.update(codegen.hook(req.cache_root, python, req.source))
    except OSError as exc:
        tee.line(f"torchbuild: code generation: not reused: {exc}")


def _build_venv(req: BuildRequest, python: str, env_vars: dict[str, str], tee: Tee) -> buildenv.BuildVenv | None:
    """Natively with build_venv on (not in a SIF, whose image has its tools): the build venv,
    made or reused (one line saying which); its variables join env_vars (PATH is set apart)."""
    if req.backend != "native" or req.provenance.get("engine", "native") != "native" or not req.spec.build_venv:
        return None
    venv = buildenv.ensure(req.spec, req.source, req.cache_root, python, tee)
    how = f"created in {venv.seconds:.0f} s" if venv.created else "reused"
    tools = ", ".join(f"{k} {v}" for k, v in venv.versions.items())
    tee.line(f"build venv: {how} ({venv.path}: {tools})")
    mkl = buildenv.wants_mkl(req.spec)
    env_vars.update({k: v for k, v in venv.env({**os.environ, **env_vars}, mkl).items() if k != "PATH"})
    return venv


def _preflight(run: Run, watch: ConfigureWatch) -> None:
    """Configure, the preflight targets, then each canary alone (its peak memory recorded)."""
    req, tee = run.req, run.tee
    seconds = with_checks(run, watch, run.configure)
    run.phases["configure_s"] = round(seconds, 1)
    # CMake's try_compile checks run in randomly named directories and can never hit the
    # cache: count hits from here on, over the compiles that can
    run.job.zero_ccache()
    targets = list(req.targets or req.spec.preflight_targets)
    if targets:
        build = str(build_dir(req.source))
        seconds = run.job.compile(
            lambda n: ["cmake", "--build", build, "--target", *targets, "--", f"-j{n}"],
            cwd=req.source,
            what=f"building {' '.join(targets)}",
            before=lambda n: _heavy_pool(run, n),
        )
        run.phases["targets_s"] = round(seconds, 1)
    for canary in req.canaries or req.spec.canaries:
        done = _canary(run, canary)
        run.canaries.append({"file": canary, "seconds": round(done.seconds, 2), "peak_rss_bytes": done.peak_rss})
    if run.canaries:
        record_unit_peaks(units_file(req.cache_root, req.spec.hash), run.canaries)
        measured = record_measured(peaks_file(req.cache_root, req.spec.hash), run.canaries)
        tee.line(f"canary peaks recorded for the next plans: {_fmt_peaks(measured)}")


def _canary(run: Run, canary: str) -> Finished:
    """Compile one canary for real, alone: its object (in the build directory torchbuild made)
    is removed first and ccache compiles again (CCACHE_RECACHE), since an object a preflight
    target already built, or a cache hit, would record ninja's or ccache's memory as its peak."""
    req = run.req
    target = object_target(req.source, canary, run.env)
    with named_os_errors(build_dir(req.source) / target, "removing the canary's object"):
        (build_dir(req.source) / target).unlink(missing_ok=True)
    return run_logged(
        ["ninja", "-C", str(build_dir(req.source)), target],
        cwd=req.source,
        env={**run.env, "CCACHE_RECACHE": "1"},
        tee=run.tee,
        what=f"canary {canary}",
    )


def _heavy_pool(run: Run, jobs: int) -> int:
    """The heavy units' pool (builder/heavy.py), at most jobs deep: in build.ninja, or for a
    scikit-build-core tree (which configures again, writing build.ninja anew) CMake's job pool.
    Said in the log. The jobs the attempt runs: fewer where no compile matched the heavy units."""
    b, heavy = build_dir(run.req.source), run.job.plan.heavy
    if run.kind == SKBUILD:
        said, jobs = apply_cmake_pool(b, heavy, jobs)
    else:
        said, jobs = apply_pool(b, Path(run.req.source), heavy, jobs)
    if said:
        run.tee.line(said)
    return jobs


def _fmt_peaks(measured: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in measured.items()) or "none"


def _build_wheel(run: Run, watch: ConfigureWatch) -> Path:
    """pip wheel --no-build-isolation into a partial directory, then rename into out_dir; an
    out-of-memory kill resumes it with fewer jobs (MAX_JOBS, CMAKE_BUILD_PARALLEL_LEVEL) in the
    same build tree."""
    req = run.req
    check_wheel_tools(req.source, run.python)
    out_dir = Path(req.out_dir)
    if run.job.plan.heavy is not None and _unconfigured(run):
        # setup.py reuses build.ninja, where the pool goes; a scikit-build-core tree's pool is the
        # configure's (what it pooled decides the jobs): configure first, as a preflight does
        with_checks(run, watch, run.configure)
    config = skbuild.config_settings(run.defines(run.job.jobs.current)) if run.kind == SKBUILD else []
    partial = partial_dir(out_dir, req.run_id, "the wheel", run.tee.line)
    try:
        with_checks(
            run,
            watch,
            lambda w: run.job.compile(
                lambda n: pip_wheel(partial, req.source, run.python, config),
                cwd=req.source,
                what="pip wheel",
                watch=w,
                before=lambda n: _heavy_pool(run, n),
            ),
        )
        wheels = sorted(partial.glob("*.whl"))
        if len(wheels) != 1:
            raise BuildFailed(f"pip wheel produced {len(wheels)} wheels in {partial}; expected one")
        wheel, run.floor = elffloor.measure(wheels[0], req.spec.glibc_floor, run.tee.line, run.tmp)
        epoch = int(run.env_vars.get("SOURCE_DATE_EPOCH") or 0)
        if epoch:
            run.normalized = normalize_wheel(wheel, epoch)
            if run.normalized:
                run.tee.line(f"torchbuild: rewrote {wheel.name} in canonical zip form (SOURCE_DATE_EPOCH {epoch})")
        return into_place(wheel, out_dir / wheel.name, "the wheel")
    finally:
        release_partial(partial)


def _unconfigured(run: Run) -> bool:
    """No configure the heavy pool can use: no build.ninja, or for a scikit-build-core tree no
    record of what its pool took (builder/heavy.py: pool_record)."""
    b = build_dir(run.req.source)
    if run.kind == SKBUILD:
        return pool_record(b) is None
    return not (b / "build.ninja").is_file()


def _finish(run: Run, wheel: Path | None) -> Outcome:
    """The report, the manifest (with the compile job's record: times, jobs, ccache's figures)
    and the summary table."""
    run.records = runs.end(build_dir(run.req.source), run.req.run_id)
    report = _report(run)
    fields = run.job.manifest_fields()
    with named_os_errors(run.req.out_dir, "writing the manifest"):
        manifest = _write_manifest(run, fields, wheel, report)
    _summary(run, wheel, manifest, fields["seconds"], fields["ccache"], report)
    return Outcome(wheel, manifest, run.log)


def _report(run: Run) -> dict[str, Any] | None:
    """The build report next to the log, from what this build added to the tree's .ninja_log
    (text, Chrome trace, picture) with the build's lower bound on its jobs (builder/bound.py). A
    report that cannot be written is a note, not a failure."""
    req, tee = run.req, run.tee
    ninja_log = build_dir(req.source) / ".ninja_log"
    if not ninja_log.is_file():
        return None
    found: dict[str, Any] = {}
    try:
        rep = write_report(
            ninja_log,
            run.log.parent,
            f"report-{req.spec.profile}-{req.run_id}",
            since=run.ninja_mark,
            appendix=lambda summary, steps: _report_appendix(run, ninja_log, found, summary, steps),
        )
    except TorchbuildError as err:
        tee.line(f"torchbuild: no build report: {err.message}")
        return None
    if rep.summary.slowest:
        slowest = rep.summary.slowest[0]
        tee.line(f"slowest translation unit: {slowest.output} ({slowest.seconds:.1f} s)")
    if "efficiency" in found:
        tee.line(_efficiency_line(found["efficiency"]))
    if rep.notice:
        tee.line(rep.notice)
    files = {"text": rep.text.name, "trace": rep.trace.name, **({"png": rep.png.name} if rep.png else {})}
    return {**files, **found}


def _report_appendix(run: Run, ninja_log: Path, found: dict[str, Any], summary: Report, steps: list[Step]) -> str:
    """The report's appendix: the build's lower bound and its heaviest steps (kept in found as "efficiency" and
    "heaviest"); "" when they cannot be figured (named in the log: they never fail a build)."""
    req, tee = run.req, run.tee
    try:  # the report's figures never fail a build whose wheel is made
        wall = time.monotonic() - run.job.t0
        graph = ninja_graph(build_dir(req.source))
        deps = parse_graph(graph) if graph else None
        found["heaviest"] = heaviest = _heaviest(run)
        whole = _across_runs(run, ninja_log, deps)
        if whole is not None:
            text, found["efficiency"] = whole
            return text + render_heaviest(heaviest)
        mixed = not_this_run(summary.wall_seconds, wall)
        if mixed:
            tee.line(f"torchbuild: no lower bound in the report: {mixed}")
            return render_heaviest(heaviest)
        b = bound_of(steps, deps, run.job.jobs.start)
        text = render_bound(b, summary.wall_seconds, wall) + render_heaviest(heaviest)
    except Exception as exc:  # named in the log; the build goes on
        tee.line(f"torchbuild: no lower bound in the report: {type(exc).__name__}: {exc}")
        return ""
    found["efficiency"] = efficiency_record(b, summary.wall_seconds, wall)
    return text


def _efficiency_line(e: Mapping[str, Any]) -> str:
    """The log's efficiency line: the build's wall time against its lower bound on its jobs."""
    return (
        f"efficiency: wall {e['build_wall_s']:.0f} s = {e['build_wall_s'] / e['bound_s']:.2f} x the lower bound "
        f"{e['bound_s']:.0f} s on {e['jobs']} jobs (limited by {e['limited_by']})"
        + (f", over the build's {e['runs']} runs" if e["runs"] > 1 else "")
        if e["bound_s"] > 0
        else "efficiency: no step took measurable time"
    )


def _write_manifest(run: Run, fields: Mapping[str, Any], wheel: Path | None, report: Mapping[str, Any] | None) -> Path:
    req, spec = run.req, run.req.spec
    m = manifest.for_build(
        spec,
        run_id=req.run_id,
        # the image's installed list, copied beside the log, and its sha256 (none natively)
        provenance={
            "engine": req.backend,
            **req.provenance,
            **manifest.installed_packages(run.log.parent, f"installed-{spec.profile}-{req.run_id}.txt"),
            **({"build_venv": run.venv.record()} if run.venv else {}),
        },
        **fields,
        log=run.log.name,
        report=report,
        wheel=wheel,
        preflight=None
        if wheel is not None
        else {"targets": list(req.targets or spec.preflight_targets), "canaries": run.canaries, **run.phases},
        reproducibility=_repro_record(run),
        floor=run.floor,
    )
    path = manifest.manifest_path(Path(req.out_dir), wheel.name if wheel else None, spec.profile, req.run_id)
    return manifest.write(m, path)


def _repro_record(run: Run) -> dict[str, Any]:
    epoch = run.env_vars.get("SOURCE_DATE_EPOCH", "")
    given = run.req.spec.env.get("SOURCE_DATE_EPOCH")
    return {
        "source_date_epoch": int(epoch) if epoch.isdigit() else 0,
        "origin": "profile env" if given else (run.epoch_origin or ("" if epoch else "none")),
        "ccache_basedir": run.env_vars.get("CCACHE_BASEDIR", ""),
        "python": run.req.python or "{}.{}".format(*sys.version_info[:2]),
        "normalized": run.normalized,
    }


def _summary(
    run: Run,
    wheel: Path | None,
    manifest: Path,
    seconds: float,
    ccache: tuple[int, int, float],
    report: Mapping[str, Any] | None,
) -> None:
    """The artifacts (name, size, sha256) and the build's figures, as two tables."""
    files = [f for f in (wheel, manifest) if f is not None]
    run.tee.line("")
    run.tee.line(
        table(
            ["artifact", "size", "sha256"],
            [(f.name, f"{f.stat().st_size / 1e6:.1f} MB", sha256_file(f)[:16]) for f in files],
            justify=["left", "right", "left"],
        )
    )
    run.tee.line(table(["", ""], _facts(run, seconds, ccache, report), header=False))


def _facts(
    run: Run, seconds: float, ccache: tuple[int, int, float], report: Mapping[str, Any] | None
) -> list[tuple[str, str]]:
    """The build's figures for _summary's second table: time, jobs, retries, ccache, canaries, log and report."""
    hits, misses, rate = ccache
    jobs = run.job.jobs
    used = str(jobs.start) if jobs.current == jobs.start else f"{jobs.start} -> {jobs.current}"
    facts = [
        ("duration", f"{seconds:.1f} s"),
        ("jobs used", used),
        ("OOM retries", str(len(jobs.retries))),
        (
            ("ccache hit rate", f"{rate:.0%} ({hits} hits, {misses} misses)")
            if "CMAKE_CXX_COMPILER_LAUNCHER" in run.env_vars
            else ("ccache", "not used (none on PATH)")
        ),
        *[
            (f"canary {c['file']}", f"{c['seconds']:.1f} s, peak {c['peak_rss_bytes'] / 2**20:.0f} MiB")
            for c in run.canaries
        ],
        ("log", str(run.log)),
        *(
            [("report", ", ".join(str(run.log.parent / report[k]) for k in ("text", "trace", "png") if k in report))]
            if report
            else []
        ),
    ]
    return facts


def run_build_step(req: BuildRequest) -> int:
    """The `build` step (steps.STEPS parses what the backend hands over into req)."""
    run_build(req)
    return 0
