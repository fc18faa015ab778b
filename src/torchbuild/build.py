"""The build itself. The same code runs inside the toolchain container (`torchbuild build-inside`)
and natively on a login node (`invoke build` without --in-container).

A BuildRequest is plain data (JSON) so the host can hand it to the container; everything the
build does is decided by it and the host facts read here (cores, memory limit).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from . import __version__
from .config import BuildSpec, spec_from_dict
from .environment import build_env, compilers, format_env
from .errors import BuildFailed, OutOfMemory, ToolMissing
from .jobs import (
    HostResources,
    JobPlan,
    cgroup_peak,
    fewer_jobs,
    peaks_file,
    plan_for,
    record_measured,
)
from .progress import OomWatch, Progress
from .report import write_report
from .source import sha256_file

PARTIAL_PREFIX = ".partial-"


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
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["spec"] = self.spec.to_dict()
        d["provenance"] = dict(self.provenance)
        d["targets"], d["canaries"] = list(self.targets), list(self.canaries)
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str) -> BuildRequest:
        d = json.loads(text)
        d["spec"] = spec_from_dict(d["spec"], "build request")
        d["targets"] = tuple(d["targets"])
        d["canaries"] = tuple(d["canaries"])
        return cls(**d)


class Tee:
    """Write to the terminal (or container log stream) and the log file at once."""

    def __init__(self, log: Path, out: TextIO, progress: str = "raw") -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.file = log.open("a", buffering=1)
        self.out = out
        self.progress = Progress(out, progress)

    def write(self, text: str) -> None:
        self.file.write(text)
        self.progress.write(text)
        self.out.flush()

    def line(self, text: str = "") -> None:
        self.write(text + "\n")

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self.progress.finish()
        self.file.close()


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def first_line(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        return ""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=dict(env) if env else None, check=False)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0] if lines else ""


def toolchain_versions(spec: BuildSpec, env: Mapping[str, str]) -> dict[str, str]:
    cc, cxx = compilers(spec)
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
        proc = (
            subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
            if shutil.which(nvcc)
            else None
        )
        lines = proc.stdout.strip().splitlines() if proc and proc.returncode == 0 else []
        # "Cuda compilation tools, release 12.4, V12.4.131"
        versions["nvcc"] = next((ln for ln in lines if "release" in ln), lines[-1] if lines else "not found")
    return versions


def ccache_stats(env: Mapping[str, str]) -> dict[str, int]:
    """ccache's counters (ccache >= 4.4 `--print-stats`), {} when unavailable."""
    proc = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, env=dict(env), check=False)
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


def _run(
    cmd: Sequence[str], *, cwd: str, env: Mapping[str, str], tee: Tee, watch: OomWatch | None = None
) -> tuple[int, float, int]:
    """Run cmd with its output streamed into tee (and watch); (exit code, seconds, peak RSS of
    the largest process it ran, compilers included, in bytes). The child dies with us."""
    tee.line(f"$ {' '.join(cmd)}")
    start = time.monotonic()
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            tee.write(line)
            if watch is not None:
                watch.feed(line)
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.monotonic() - start, usage.ru_maxrss * 1024


def run_logged(cmd: Sequence[str], *, cwd: str, env: Mapping[str, str], tee: Tee, what: str) -> float:
    """Run cmd streaming its output into tee; BuildFailed on a non-zero exit. Returns seconds."""
    rc, took, _ = _run(cmd, cwd=cwd, env=env, tee=tee)
    if rc != 0:
        raise BuildFailed(f"{what} failed (exit {rc}) after {took:.0f} s; log: {tee.file.name}")
    return took


def _peak_run(cmd: Sequence[str], *, cwd: str, env: Mapping[str, str], tee: Tee, what: str) -> tuple[float, int]:
    """Like run_logged, and also the peak RSS (bytes) of the largest process it ran."""
    rc, took, peak = _run(cmd, cwd=cwd, env=env, tee=tee)
    if rc != 0:
        raise BuildFailed(f"{what} failed (exit {rc}); log: {tee.file.name}")
    return took, peak


@dataclasses.dataclass
class JobsUsed:
    """The jobs a build started with, what it ended with, and every out-of-memory retry."""

    start: int
    current: int
    retries: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def run_compile(
    cmd_for: Callable[[int], Sequence[str]],
    *,
    cwd: str,
    env_for: Callable[[int], Mapping[str, str]],
    tee: Tee,
    what: str,
    jobs: JobsUsed,
    retry: bool = True,
) -> float:
    """Run a compile step; when the OOM killer takes a compiler (or the step), resume the same
    build tree with half the jobs (ninja rebuilds only what did not finish), down to one job,
    then OutOfMemory with the peak seen."""
    total = 0.0
    while True:
        watch = OomWatch()
        rc, took, peak = _run(cmd_for(jobs.current), cwd=cwd, env=env_for(jobs.current), tee=tee, watch=watch)
        total += took
        if rc == 0:
            return total
        evidence = watch.evidence or (f"exit {rc} (SIGKILL)" if rc in (137, -9) else None)
        if evidence is None:
            raise BuildFailed(f"{what} failed (exit {rc}) after {took:.0f} s; log: {tee.file.name}")
        cg_peak = cgroup_peak()
        peak_text = f"largest process {peak / 2**30:.2f} GiB" + (
            f", cgroup peak {cg_peak / 2**30:.2f} GiB" if cg_peak else ""
        )
        if jobs.current == 1 or not retry:
            raise OutOfMemory(
                f"{what} ran out of memory with {jobs.current} jobs ({evidence}; {peak_text}); log: {tee.file.name}",
                hint=None if retry else "drop --no-retry to resume with fewer jobs automatically",
            )
        nxt = fewer_jobs(jobs.current)
        jobs.retries.append(
            {
                "step": what,
                "jobs": jobs.current,
                "next_jobs": nxt,
                "evidence": evidence,
                "peak_rss_bytes": peak,
                "cgroup_peak_bytes": cg_peak,
                "seconds": round(took, 1),
            }
        )
        tee.line(
            f"torchbuild: out of memory in {what} with {jobs.current} jobs ({evidence}; {peak_text}); "
            f"resuming the same build tree with {nxt} jobs (retry {len(jobs.retries)})"
        )
        jobs.current = nxt


def build_dir(source: str) -> Path:
    return Path(source) / "build"


def configure(source: str, env: Mapping[str, str], tee: Tee) -> float:
    """CMake configure the way the wheel build would: setup.py --cmake-only, else plain CMake."""
    src = Path(source)
    if (src / "setup.py").is_file():
        return run_logged(
            [sys.executable, "setup.py", "build", "--cmake-only"], cwd=source, env=env, tee=tee, what="configure"
        )
    return run_logged(
        ["cmake", "-S", source, "-B", str(build_dir(source)), "-G", "Ninja"],
        cwd=source,
        env=env,
        tee=tee,
        what="configure",
    )


def object_target(source: str, file: str, env: Mapping[str, str]) -> str:
    """The ninja target that compiles one source file: .../Foo.cpp.o, or for ATen's per-CPU-
    capability kernels (native/cpu/*.cpp) the DEFAULT variant .../Foo.cpp.DEFAULT.cpp.o."""
    proc = subprocess.run(
        ["ninja", "-C", str(build_dir(source)), "-t", "targets", "all"],
        capture_output=True,
        text=True,
        env=dict(env),
        check=False,
    )
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


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{PARTIAL_PREFIX}{path.name}")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_build(req: BuildRequest, out: TextIO = sys.stdout) -> Outcome:
    """Build a wheel (or run a preflight) as the request says; write manifest and log to out_dir."""
    spec = req.spec
    started, t0 = _now(), time.monotonic()
    out_dir = Path(req.out_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = out_dir / "logs" / f"{'preflight' if req.preflight else 'build'}-{spec.profile}-{stamp}-{req.run_id}.log"
    tee = Tee(log, out, req.progress)
    try:
        host = HostResources.detect()
        plan = plan_for(spec, host, req.cache_root, req.jobs)
        env_vars = build_env(spec, cache_root=req.cache_root, jobs=plan.jobs, nvcc_threads=plan.nvcc_threads or None)
        for d in (env_vars["CCACHE_DIR"], env_vars["PIP_CACHE_DIR"]):
            Path(d).mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **env_vars}
        tee.line(f"torchbuild {__version__}: {'preflight' if req.preflight else 'wheel build'} of {req.source}")
        tee.line(f"profile {spec.profile} (sha256 {spec.hash[:16]}), version {spec.build_version}")
        tee.line(f"jobs: {plan.jobs} ({plan.reason})")
        tee.line("environment:")
        for line in format_env(env_vars).splitlines():
            tee.line(f"  {line}")
        versions = toolchain_versions(spec, env)
        if req.clean and build_dir(req.source).exists():
            tee.line(f"removing {build_dir(req.source)} (--clean)")
            shutil.rmtree(build_dir(req.source))
        subprocess.run(["ccache", "--zero-stats"], env=env, capture_output=True, check=False)
        wheel: Path | None = None
        canaries: list[dict[str, Any]] = []
        phases: dict[str, float] = {}
        jobs = JobsUsed(plan.jobs, plan.jobs)

        def env_for(n: int) -> dict[str, str]:
            return {**env, "MAX_JOBS": str(n)}

        if req.preflight:
            phases["configure_s"] = round(configure(req.source, env, tee), 1)
            # CMake's try_compile checks run in randomly named directories and can never hit
            # the cache: count hits from here on, over the compiles that can
            subprocess.run(["ccache", "--zero-stats"], env=env, capture_output=True, check=False)
            targets = list(req.targets or spec.preflight_targets)
            if targets:
                phases["targets_s"] = round(
                    run_compile(
                        lambda n: [
                            "cmake",
                            "--build",
                            str(build_dir(req.source)),
                            "--target",
                            *targets,
                            "--",
                            f"-j{n}",
                        ],
                        cwd=req.source,
                        env_for=env_for,
                        tee=tee,
                        what=f"building {' '.join(targets)}",
                        jobs=jobs,
                        retry=req.oom_retry,
                    ),
                    1,
                )
            for canary in req.canaries or spec.canaries:
                target = object_target(req.source, canary, env)
                secs, peak = _peak_run(
                    ["ninja", "-C", str(build_dir(req.source)), target],
                    cwd=req.source,
                    env=env,
                    tee=tee,
                    what=f"canary {canary}",
                )
                canaries.append({"file": canary, "seconds": round(secs, 2), "peak_rss_bytes": peak})
            if canaries:
                measured = record_measured(peaks_file(req.cache_root, spec.hash), canaries)
                tee.line(f"canary peaks recorded for the next plans: {_fmt_peaks(measured)}")
        else:
            wheel = _build_wheel(req, env_for, tee, jobs)
        stats = hit_rate(ccache_stats(env))
        report = _report(req, log, tee)
        seconds = time.monotonic() - t0
        manifest = _write_manifest(
            req, versions, env_vars, plan, jobs, started, seconds, wheel, stats, canaries, phases, log, report
        )
        _summary(tee, req, wheel, manifest, seconds, jobs, stats, canaries, log, report)
        return Outcome(wheel, manifest, log)
    finally:
        tee.close()


def _fmt_peaks(measured: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in measured.items()) or "none"


def _report(req: BuildRequest, log: Path, tee: Tee) -> dict[str, str] | None:
    """report-<run>.txt and .png next to the log, from the tree's .ninja_log (if ninja ran)."""
    ninja_log = build_dir(req.source) / ".ninja_log"
    if not ninja_log.is_file():
        return None
    txt, png, rep = write_report(ninja_log, log.parent / f"report-{req.spec.profile}-{req.run_id}")
    if rep.slowest:
        tee.line(f"slowest translation unit: {rep.slowest[0].output} ({rep.slowest[0].seconds:.1f} s)")
    return {"text": txt.name, "png": png.name}


def check_wheel_tools(source: str) -> None:
    """--no-build-isolation builds with this Python's packages: say what is missing up front."""
    if not (Path(source) / "setup.py").is_file():
        return
    missing = []
    if importlib.util.find_spec("setuptools") is None:
        missing.append("setuptools")
    elif (
        importlib.util.find_spec("setuptools.command.bdist_wheel") is None and importlib.util.find_spec("wheel") is None
    ):
        missing.append("wheel")  # setuptools < 70.1 needs the wheel package for bdist_wheel
    if missing:
        raise ToolMissing(
            f"{sys.executable} lacks {', '.join(missing)}, which a setup.py build needs",
            hint=f"{sys.executable} -m pip install {' '.join(missing)} (with the rest of PyTorch's requirements.txt)",
        )


def _build_wheel(req: BuildRequest, env_for: Callable[[int], Mapping[str, str]], tee: Tee, jobs: JobsUsed) -> Path:
    """pip wheel --no-build-isolation into a partial directory, then rename into out_dir; an
    out-of-memory kill resumes it with fewer jobs (MAX_JOBS) in the same build tree."""
    check_wheel_tools(req.source)
    out_dir = Path(req.out_dir)
    partial = Path(tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{req.run_id}-", dir=out_dir))
    try:
        run_compile(
            lambda n: [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-build-isolation",
                "--no-deps",
                "-v",
                "-w",
                str(partial),
                req.source,
            ],
            cwd=req.source,
            env_for=env_for,
            tee=tee,
            what="pip wheel",
            jobs=jobs,
            retry=req.oom_retry,
        )
        wheels = sorted(partial.glob("*.whl"))
        if len(wheels) != 1:
            raise BuildFailed(f"pip wheel produced {len(wheels)} wheels in {partial}; expected one")
        final = out_dir / wheels[0].name
        os.replace(wheels[0], final)
        return final
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _write_manifest(
    req: BuildRequest,
    versions: Mapping[str, str],
    env_vars: Mapping[str, str],
    plan: JobPlan,
    jobs: JobsUsed,
    started: str,
    seconds: float,
    wheel: Path | None,
    ccache: tuple[int, int, float],
    canaries: list[dict[str, Any]],
    phases: Mapping[str, float],
    log: Path,
    report: Mapping[str, str] | None,
) -> Path:
    spec = req.spec
    data: dict[str, Any] = {
        "torchbuild_version": __version__,
        "kind": "preflight" if req.preflight else "wheel",
        "run_id": req.run_id,
        "profile": spec.profile,
        "profile_hash": spec.hash,
        "resolved_profile": spec.to_dict(),
        **dict(req.provenance),
        "toolchain": dict(versions),
        "environment": dict(env_vars),
        "jobs": {
            "max_jobs": jobs.start,
            "final_jobs": jobs.current,
            "reason": plan.reason,
            "nvcc_threads": plan.nvcc_threads,
            "retries": jobs.retries,
        },
        "started": started,
        "finished": _now(),
        "duration_s": round(seconds, 1),
        "ccache": {"hits": ccache[0], "misses": ccache[1], "hit_rate": round(ccache[2], 4)},
        "log": log.name,
        "report": dict(report) if report else None,
    }
    if wheel is not None:
        data["wheel"] = {"name": wheel.name, "sha256": sha256_file(wheel), "size": wheel.stat().st_size}
        path = Path(req.out_dir) / f"{wheel.name}.manifest.json"
    else:
        data["preflight"] = {
            "targets": list(req.targets or spec.preflight_targets),
            "canaries": canaries,
            **phases,
        }
        path = Path(req.out_dir) / f"preflight-{spec.profile}-{req.run_id}.manifest.json"
    _atomic_write(path, json.dumps(data, indent=2) + "\n")
    return path


def _summary(
    tee: Tee,
    req: BuildRequest,
    wheel: Path | None,
    manifest: Path,
    seconds: float,
    jobs: JobsUsed,
    ccache: tuple[int, int, float],
    canaries: list[dict[str, Any]],
    log: Path,
    report: Mapping[str, str] | None,
) -> None:
    rows: list[tuple[str, str, str]] = []
    if wheel is not None:
        rows.append((wheel.name, f"{wheel.stat().st_size / 1e6:.1f} MB", sha256_file(wheel)[:16]))
    rows.append((manifest.name, f"{manifest.stat().st_size / 1e3:.1f} kB", sha256_file(manifest)[:16]))
    width = max(len(r[0]) for r in rows)
    tee.line("")
    tee.line(f"{'artifact':<{width}}  {'size':>10}  sha256")
    for name, size, digest in rows:
        tee.line(f"{name:<{width}}  {size:>10}  {digest}")
    hits, misses, rate = ccache
    used = str(jobs.start) if jobs.current == jobs.start else f"{jobs.start} -> {jobs.current}"
    facts = [
        ("duration", f"{seconds:.1f} s"),
        ("jobs used", used),
        ("OOM retries", str(len(jobs.retries))),
        ("ccache hit rate", f"{rate:.0%} ({hits} hits, {misses} misses)"),
        *[
            (f"canary {c['file']}", f"{c['seconds']:.1f} s, peak {c['peak_rss_bytes'] / 2**20:.0f} MiB")
            for c in canaries
        ],
        ("log", str(log)),
        *([("report", f"{log.parent / report['text']}, {log.parent / report['png']}")] if report else []),
    ]
    kw = max(len(k) for k, _ in facts)
    for key, value in facts:
        tee.line(f"{key:<{kw}}  {value}")


def main_inside(request_file: str) -> int:
    """Entry point of `torchbuild build-inside REQUEST.json` in the container."""
    req = BuildRequest.from_json(Path(request_file).read_text())
    run_build(req)
    return 0
