"""torchvision, torchaudio and torchtext built against the torch just built.

Host side (`fetch`): each companion of the profile is fetched through the source cache (a git
URL through the mirror, an archive checked against its sha256, or a local tree built where it
is), and its version.txt is checked against the companion table before anything compiles.

Step side (`build_all`, in the same place as the torch build: natively, in the image or in the
SIF): the torch wheel is unpacked into a directory put first on PYTHONPATH, so each setup.py
imports exactly that torch; each library is built with `pip wheel --no-build-isolation
--no-deps`, with BUILD_VERSION (its version with torch's local part) and PYTORCH_VERSION (its
Requires-Dist pins that torch, so pip never fetches another), ccache and the job planner. Each
wheel is then unpacked beside that torch and checked: its version, where torch was imported
from, and an operator of its compiled extension (torchvision.ops.nms, torchaudio's
forced_align). A wheel is moved into the output only after its checks pass; its manifest
records the torch wheel it was built against.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from torchbuild.builder.companion_table import REPOS, default_ref, is_development, pairing_problem, version_problem
from torchbuild.builder.repro import normalize_wheel, source_date_epoch
from torchbuild.core.arch import Arch
from torchbuild.core.errors import CompanionError, SourceError, WheelError, named_os_errors
from torchbuild.core.process import run_captured
from torchbuild.core.safeio import KiB, read_text, user_path
from torchbuild.profile.config import BuildSpec, fail
from torchbuild.runtime import compile_job, elffloor, manifest, pipenv
from torchbuild.runtime.compile_job import (
    CompileJob,
    check_wheel_tools,
    into_place,
    open_log,
    partial_dir,
    path_independent,
    pip_wheel,
    release_partial,
)
from torchbuild.runtime.environment import compile_env, compilers
from torchbuild.runtime.oom import Sink
from torchbuild.source.fetch import SourceInfo, describe_dir, fetch_git, update_tree

# what torchbuild sets for each library unless companion_env says otherwise: both switches
# download third-party code while building (sox from SourceForge, FFmpeg from PyTorch's S3)
DEFAULT_ENV: dict[str, dict[str, str]] = {
    "torchaudio": {"BUILD_SOX": "0", "USE_FFMPEG": "0"},
}
# torch's own build switches: a companion reads some of the same names (torchaudio: USE_CUDA,
# USE_OPENMP, BUILD_*) with other meanings, so none of torch's are passed on
VERSION_TXT_LIMIT = 64 * KiB  # a version.txt holds one line
_TORCH_ONLY = ("USE_", "BUILD_", "PYTORCH_BUILD_", "BLAS", "MKL_THREADING", "TORCH_NVCC_FLAGS")


# --------------------------------------------------------------------------- host side


def check(values: Mapping[str, Any], where: Mapping[str, str], arch: Arch) -> None:
    """The profile's companion keys against companions and the table (profile/config.py runs it
    among its rules over more than one key: its COMPANIONS_CHECK slot)."""
    for key in ("companion_repos", "companion_refs", "companion_sha256"):
        extra = sorted(set(values[key]) - set(values["companions"]))
        if extra:
            problem = f"names {', '.join(extra)}, which companions does not list"
            fail(where, key, problem, f"add it to companions or drop it from {key}")
    for name in values["companions"]:
        problem = pairing_problem(
            name, values["torch_version"], values["torch_ref"], values["companion_refs"].get(name, "")
        )
        if problem:
            hint = "drop it from companions, or choose a torch_version the table pairs it with"
            if "companion_refs" in problem:
                hint = f"name the {name} tag that goes with it in companion_refs, or drop it from companions"
            fail(where, "companions", problem, hint)


def derived_refs(spec: BuildSpec) -> dict[str, tuple[str, str]]:
    """What the build uses where the profile leaves a companion key empty: name -> (value, what
    it is derived from). Each companion's ref from torch_version and torch_ref through the
    companion table (torch 2.5.1: torchvision v0.20.1), its repository from torchbuild's list.
    `invoke config` shows them beside profile.config.derived's, marked as derived."""
    out: dict[str, tuple[str, str]] = {}
    for name in spec.companions:
        if name not in spec.companion_refs:
            dev = is_development(spec.torch_ref)
            source = f"torch_ref {spec.torch_ref}" if dev else f"torch_version {spec.torch_version}"
            ref = default_ref(name, spec.torch_version, spec.torch_ref)
            out[f"companion_refs.{name}"] = (ref, f"{source} (companion table)")
        if name not in spec.companion_repos:
            out[f"companion_repos.{name}"] = (REPOS[name], "companions (the default repository)")
    return out


@dataclasses.dataclass(frozen=True)
class Fetched:
    """A companion's tree on the host, ready to build."""

    name: str
    tree: Path
    origin: str  # URL@ref, archive or directory it came from
    digest: str  # the commit (git), the archive's sha256 (tarball) or the tree's digest (dir)
    version: str  # version.txt
    kind: str = "git"  # git | tarball | dir

    def to_dict(self) -> dict[str, str]:
        return {**dataclasses.asdict(self), "tree": str(self.tree)}


def short(name: str) -> str:
    return name.removeprefix("torch")  # vision, audio, text: the repositories' names


def tree_version(name: str, tree: Path) -> str:
    path = tree / "version.txt"
    if not path.exists():
        raise CompanionError(
            f"{name}: {tree} has no version.txt; it is not a {name} source tree",
            hint=f"point companion_repos.{name} at a checkout or release archive of {REPOS[name]}",
        )
    return read_text(path, VERSION_TXT_LIMIT, f"{name}'s version.txt", CompanionError).strip()


def _is_git(origin: str) -> bool:
    from torchbuild.source.fetch import is_git_url

    return is_git_url(origin) and not user_path(origin).is_dir()


def fetch_one(spec: BuildSpec, name: str, cache: Path, out: TextIO = sys.stdout) -> Fetched:
    """One companion's tree: a git URL cloned at its ref into <cache>/src/<vision>-<ref> (an
    existing checkout there is used as it is), an archive unpacked in <cache>/src, or a local
    tree used where it is."""
    from torchbuild.source.fetch import fetch as fetch_archive

    origin = spec.companion_repos.get(name) or REPOS[name]
    ref = spec.companion_refs.get(name) or default_ref(name, spec.torch_version, spec.torch_ref)
    if _is_git(origin):
        tree, digest = _checkout(spec, name, origin, ref, cache, out)
        shown, kind = f"{origin}@{ref}", "git"
    else:
        if name in spec.companion_refs:
            raise CompanionError(
                f"companion_refs.{name}: {origin} is not a git repository, so a ref cannot be chosen in it",
                hint=f"drop companion_refs.{name}, or give a git URL in companion_repos.{name}",
            )
        got = fetch_archive(
            name,
            origin,
            "",
            spec.companion_sha256.get(name, ""),
            cache,
            out,
            key=f"companion_repos.{name}",
            area="src",
            sha_key=f"companion_sha256.{name}",
        )
        tree, digest, shown = got.tree, got.digest, got.origin
        kind = "dir" if user_path(origin).is_dir() else "tarball"
    return Fetched(name=name, tree=tree, origin=shown, digest=digest, version=tree_version(name, tree), kind=kind)


def _checkout(spec: BuildSpec, name: str, origin: str, ref: str, cache: Path, out: TextIO) -> tuple[Path, str]:
    """A git companion's checkout in <cache>/src (cloned at ref unless it is there) and its commit."""
    if name in spec.companion_sha256:
        raise CompanionError(
            f"companion_sha256.{name}: {origin} is a git repository; a sha256 checks an archive",
            hint=f"drop companion_sha256.{name} (a git ref, or a commit id in companion_refs, pins it)",
        )
    dest = cache / "src" / f"{short(name)}-{ref.replace('/', '_')}"
    if dest.is_dir():
        print(f"{name}: using the existing checkout {dest}", file=out)
        info = describe_dir(dest)
    else:
        info = fetch_git(origin, ref, dest, cache, out)
    return dest, info.commit


def fetch(spec: BuildSpec, cache: Path, torch_version: str = "", out: TextIO = sys.stdout) -> list[Fetched]:
    """Every companion of the profile, fetched and checked against the companion table for
    torch_version (default the profile's): CompanionError before anything is compiled."""
    fetched = []
    for name in spec.companions:
        got = fetch_one(spec, name, cache, out)
        problem = version_problem(name, got.version, torch_version or spec.torch_version, spec.torch_ref)
        if problem:
            raise CompanionError(
                f"{problem} (tree {got.tree})",
                hint=f"set companion_refs.{name} to a tag of that line, or remove {name} from companions",
            )
        print(f"{name} {got.version} from {got.origin}: {got.tree}", file=out)
        fetched.append(got)
    return fetched


def update(spec: BuildSpec, cache: Path, out: TextIO = sys.stdout) -> list[Path]:
    """`invoke source --update`: fast-forward every companion checkout of the profile."""
    trees = []
    for name in spec.companions:
        origin = spec.companion_repos.get(name) or REPOS[name]
        if _is_git(origin):
            ref = spec.companion_refs.get(name) or default_ref(name, spec.torch_version, spec.torch_ref)
            tree = cache / "src" / f"{short(name)}-{ref.replace('/', '_')}"
        else:
            tree = user_path(origin).absolute()
        if not tree.is_dir():
            raise SourceError(f"{name}: no checkout at {tree} to update", hint="run `invoke source` first")
        info = update_tree(tree, out)
        print(f"{name}: {tree} at {info.commit[:12]}", file=out)
        trees.append(tree)
    return trees


# --------------------------------------------------------------------------- step side


@dataclasses.dataclass(frozen=True)
class Job:
    """One companion as the build step sees it."""

    name: str
    tree: str
    origin: str
    digest: str
    version: str  # version.txt
    kind: str = "git"

    @classmethod
    def of(cls, f: Fetched, tree: str) -> Job:
        return cls(name=f.name, tree=tree, origin=f.origin, digest=f.digest, version=f.version, kind=f.kind)

    def source_record(self) -> dict[str, str]:
        """The manifest's source record: a git commit, an archive's sha256, or a local tree."""
        record = {"kind": self.kind, "path": self.tree, "url": self.origin}
        if self.kind == "git":
            record["commit"] = self.digest
        elif self.kind == "tarball":
            record["sha256"] = self.digest
        return record


def torch_wheel_version(wheel: Path) -> Version:
    try:
        return parse_wheel_filename(wheel.name)[1]
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise CompanionError(f"{wheel.name} is not a torch wheel's name ({exc})") from None


def check_torch_wheel(wheel: Path) -> Version:
    """The version of the torch wheel the companions are to be built against: WheelError when
    the file is not a readable wheel, or is one of another project (a torchvision wheel)."""
    from torchbuild.verify.host import check_wheel_file

    check_wheel_file(wheel)
    project = canonicalize_name(parse_wheel_filename(wheel.name)[0])
    if project != "torch":
        raise WheelError(
            f"--wheel {wheel} is a {project} wheel, not a torch wheel: the companions are built against torch",
            hint="point --wheel at the torch wheel `invoke build` wrote (torch-<version>-...whl)",
        )
    return torch_wheel_version(wheel)


def build_version(job: Job, torch_version: Version, local: str) -> str:
    """The companion's version: its version.txt with torch's local part (0.21.0+gh200). Release
    trees carry a development number (torchaudio's v2.6.0 tag says 2.6.0a0; the release process
    sets BUILD_VERSION): built against a release torch, the companion gets its release number."""
    tree = Version(job.version)
    base = tree.public if torch_version.is_prerelease else tree.base_version
    part = torch_version.local or local
    return f"{base}+{part}" if part else base


def companion_env(spec: BuildSpec, name: str, base: Mapping[str, str]) -> dict[str, str]:
    """The variables a companion's build gets from torchbuild: the toolchain part of the torch
    build's (compilers, ccache, CUDA, flags), the library's defaults, then companion_env."""
    env = {k: v for k, v in base.items() if not k.startswith(_TORCH_ONLY)}
    if spec.cuda:
        env["FORCE_CUDA"] = "1"
    return {**env, **DEFAULT_ENV.get(name, {}), **spec.companion_env}


def ccache_shims(directory: Path, spec: BuildSpec) -> Path | None:
    """A directory of ccache masquerade links named like the compilers (ccache finds the real
    one further down PATH), for the setuptools extensions that call $CC/$CXX directly; None
    when a compiler is given by path (then it is run as it is) or ccache is missing."""
    ccache = shutil.which("ccache")
    names = {Path(c).name for c in compilers(spec)} | {"cc", "c++", "gcc", "g++"}
    if ccache is None or any("/" in c for c in compilers(spec)):
        return None
    directory.mkdir(parents=True, exist_ok=True)
    for name in sorted(names):
        link = directory / name
        if not link.exists():
            link.symlink_to(ccache)
    return directory


# the checks each wheel must pass, run beside the torch it was built against
CHECKS = {
    "torchvision": """
import torchvision, torch
from torchvision.ops import nms
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])
keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
assert keep.tolist() == [0, 2], keep
result["op"] = "torchvision.ops.nms -> " + str(keep.tolist())
result["extension"] = torch.ops.torchvision.nms.default.name()
""",
    "torchaudio": """
import torchaudio, torch
from torchaudio._extension import _IS_TORCHAUDIO_EXT_AVAILABLE
assert _IS_TORCHAUDIO_EXT_AVAILABLE, "torchaudio's C++ extension (libtorchaudio) did not load"
log_probs = torch.log_softmax(torch.tensor([[[0.1, 2.0, 0.1], [0.1, 0.1, 2.0], [2.0, 0.1, 0.1]]]), -1)
aligned, scores = torch.ops.torchaudio.forced_align(log_probs, torch.tensor([[1, 2]], dtype=torch.int32),
                                                    torch.tensor([3]), torch.tensor([2]), 0)
assert aligned.tolist() == [[1, 2, 0]], aligned
result["op"] = "torch.ops.torchaudio.forced_align -> " + str(aligned.tolist())
result["extension"] = "torchaudio.lib._torchaudio"
""",
    "torchtext": """
import torchtext, torch
from torchtext.data.functional import load_sp_model
import torchtext._torchtext as ext
result["op"] = "import torchtext._torchtext"
result["extension"] = ext.__file__
""",
}

_CHECK = """
import json, sys
result = {}
import torch
result["torch_file"] = torch.__file__
result["torch_version"] = torch.__version__
mod = __import__(NAME)
result["version"] = mod.__version__
result["file"] = mod.__file__
BODY
print("TORCHBUILD_CHECK " + json.dumps(result))
"""


def missing_requirements(target: Path) -> list[str]:
    """The unconditional requirements of the wheel unpacked in target that this interpreter
    cannot import, torch and the companions left out (torch is the built one, beside it)."""
    from importlib.metadata import PackageNotFoundError, PathDistribution, distribution

    from packaging.requirements import Requirement

    infos = list(target.glob("*.dist-info"))
    requires = (PathDistribution(infos[0]).requires or []) if infos else []
    missing = []
    for text in requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in {"torch", *map(canonicalize_name, REPOS)}:
            continue
        try:
            distribution(req.name)
        except PackageNotFoundError:
            missing.append(str(req))
    return missing


def check_wheel(
    name: str, wheel: Path, torch_dir: Path, work: Path, env: Mapping[str, str], torch_version: str = ""
) -> dict[str, str]:
    """Unpack wheel beside torch_dir (torch_version's torch) and run the library's check in a
    fresh interpreter (from another directory, so the source tree is not what is imported)."""
    target = work / f"check-{name}"
    pins = {name: str(parse_wheel_filename(wheel.name)[1]), **({"torch": torch_version} if torch_version else {})}
    env = {**env, **pipenv.keep_built(work / f"check-{name}-constraints.txt", pins, sys.executable, env)}
    _pip(
        ["install", "--no-deps", "--no-index", "--quiet", "--target", str(target), "--", str(wheel)],
        env,
        f"unpacking {wheel.name}",
    )
    deps = work / f"check-{name}-deps"
    missing = missing_requirements(target)
    if missing:  # e.g. pillow for torchvision: its import needs them, the image may not have them
        _pip(
            ["install", "--no-deps", "--quiet", "--target", str(deps), "--", *missing],
            env,
            f"installing {name}'s runtime dependencies {', '.join(missing)} for its check",
        )
    script = _CHECK.replace("NAME", repr(name)).replace("BODY", CHECKS[name])
    run_env = {**env, "PYTHONPATH": os.pathsep.join([str(target), str(torch_dir), str(deps)])}
    proc = run_captured([sys.executable, "-c", script], cwd=work, env=run_env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TORCHBUILD_CHECK ")), "")
    if proc.returncode != 0 or not line:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise CompanionError(
            f"{name}: {wheel.name} fails its check beside the torch it was built against:\n" + "\n".join(detail),
            hint="an undefined symbol means it was compiled against another torch; the build log says which",
        )
    result: dict[str, str] = json.loads(line.removeprefix("TORCHBUILD_CHECK "))
    if not Path(result["torch_file"]).is_relative_to(torch_dir):
        raise CompanionError(f"{name}: its check imported torch from {result['torch_file']}, not the built one")
    return result


def unpack_torch(torch_wheel: Path, torch_dir: Path, env: Mapping[str, str], work: Path) -> None:
    """The torch wheel unpacked into torch_dir, whatever a site's pip configuration pins torch
    to (pipenv.keep_built: its constraint would refuse any other torch)."""
    pins = {"torch": str(torch_wheel_version(torch_wheel))}
    env = {**env, **pipenv.keep_built(work / "torch-constraints.txt", pins, sys.executable, env)}
    _pip(
        ["install", "--no-deps", "--no-index", "--quiet", "--target", str(torch_dir), "--", str(torch_wheel)],
        env,
        f"unpacking {torch_wheel.name}",
    )


def _pip(args: Sequence[str], env: Mapping[str, str], what: str) -> None:
    proc = run_captured([sys.executable, "-m", "pip", *args], env=env)
    if proc.returncode != 0:
        raise CompanionError(f"{what} failed:\n{(proc.stderr or proc.stdout).strip()[-2000:]}")


@dataclasses.dataclass(frozen=True)
class Request:
    """The companions step's request (plain data, as a backend hands it over)."""

    spec: BuildSpec
    torch_wheel: str
    jobs: tuple[Job, ...]
    out_dir: str
    cache_root: str
    run_id: str  # at the top: on a failure or Ctrl-C the backend removes its .partial-<run_id>*
    backend: str = "native"
    max_jobs: int = 0  # 0: plan
    oom_retry: bool = True
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # {"image": ...} in a container


@dataclasses.dataclass(frozen=True)
class Against:
    """The torch the companions are built against: its wheel, version and unpacked tree."""

    wheel: Path
    version: Version
    tree: Path


def build_all(req: Request, out: TextIO = sys.stdout) -> list[Path]:
    """Build, check and record each companion against req.torch_wheel; their wheels (in
    req.out_dir) in order. A failure leaves no wheel of the library that failed."""
    spec, torch_wheel = req.spec, Path(req.torch_wheel)
    work = Path(req.cache_root) / "tmp" / f"companions-{req.run_id}"
    wheels: list[Path] = []
    try:
        torch = Against(torch_wheel, torch_wheel_version(torch_wheel), work / "torch")
        with named_os_errors(work, "preparing the companions' build"):
            torch.tree.mkdir(parents=True, exist_ok=True)
        plan = compile_job.plan(spec, req.cache_root, req.max_jobs)
        base = compile_env(spec, plan, req.cache_root, backend=req.backend)
        engine = req.provenance.get("engine", req.backend)
        where = "this host" if engine == "native" else f"the toolchain image's base {spec.base_image}"
        said = elffloor.check_toolchain(spec, {**os.environ, **base}, where)
        if said:
            print(said, file=out, flush=True)
        print(f"companions: unpacking {torch_wheel.name} to build against it", file=out, flush=True)
        unpack_torch(torch_wheel, torch.tree, {**os.environ, **base}, work)
        shims = ccache_shims(work / "ccache-bin", spec)
        for job in req.jobs:
            env_vars, env, origin = _environment(spec, job, torch, base, shims, work)
            log = (
                Path(req.out_dir)
                / "logs"
                / f"{job.name}-{spec.profile}-{time.strftime('%Y%m%d-%H%M%S')}-{req.run_id}.log"
            )
            tee = open_log(log, out, what="writing the companion's build log")
            try:
                compiled = CompileJob(spec, plan, env_vars, env, tee, req.oom_retry)
                wheels.append(_build_one(req, job, torch, compiled, work, log, origin))
            finally:
                tee.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return wheels


def _environment(
    spec: BuildSpec, job: Job, torch: Against, base: Mapping[str, str], shims: Path | None, work: Path
) -> tuple[dict[str, str], dict[str, str], str]:
    """What one companion's build sets (printed and recorded), its whole environment, and where
    its SOURCE_DATE_EPOCH came from."""
    env_vars = {
        **companion_env(spec, job.name, base),
        "BUILD_VERSION": build_version(job, torch.version, spec.local_version),
        "PYTORCH_VERSION": str(torch.version),
    }
    env_vars.update(path_independent(env_vars, job.tree))
    tree_info = SourceInfo(kind="git" if job.kind == "git" else "dir", path=Path(job.tree))
    epoch = source_date_epoch(
        dataclasses.replace(tree_info, commit=job.digest) if job.kind == "git" else tree_info,
        {**os.environ, **env_vars},
    )
    env_vars.setdefault("SOURCE_DATE_EPOCH", str(epoch.seconds))
    search_path = os.environ.get("PATH", "")
    env = {
        **os.environ,
        **env_vars,
        "PATH": f"{shims}{os.pathsep}{search_path}" if shims else search_path,
        "PYTHONPATH": os.pathsep.join(p for p in (str(torch.tree), os.environ.get("PYTHONPATH", "")) if p),
        "TMPDIR": str(work),
    }
    return env_vars, env, epoch.origin


def _build_one(
    req: Request, job: Job, torch: Against, compiled: CompileJob, work: Path, log: Path, origin: str
) -> Path:
    """One companion: built, checked beside torch, moved into req.out_dir, recorded."""
    tee, env_vars, version = compiled.sink, compiled.env_vars, compiled.env_vars["BUILD_VERSION"]
    _print_start(tee, job, version, torch, env_vars)
    check_wheel_tools(job.tree)  # setuptools (and wheel) for --no-build-isolation, named up front
    compiled.zero_ccache()
    out_dir, run_id = Path(req.out_dir), f"{req.run_id}.{short(job.name)}"
    partial = partial_dir(out_dir, run_id, "the companion wheel", tee.line)
    try:
        compiled.compile(lambda n: pip_wheel(partial, job.tree), cwd=job.tree, what=f"pip wheel {job.name}")
        wheel, floor = elffloor.measure(_built_wheel(job, partial, version), compiled.spec.glibc_floor, tee.line, work)
        normalized = normalize_wheel(wheel, int(env_vars["SOURCE_DATE_EPOCH"]))
        checked = check_wheel(job.name, wheel, torch.tree, work, compiled.env, str(torch.version))
        tee.line(f"{job.name}: {checked['op']} (torch from {checked['torch_file']})")
        final = into_place(wheel, out_dir / wheel.name, "the companion wheel")
    finally:
        release_partial(partial)
    fields = compiled.manifest_fields()
    m = manifest.for_build(
        compiled.spec,
        run_id=run_id,
        provenance={
            "engine": req.backend,
            **{k: v for k, v in req.provenance.items() if k in ("image", "engine")},
            "source": job.source_record(),
        },
        **fields,
        log=log.name,
        report=None,
        wheel=final,
        companion=_companion_record(job, version, torch, checked),
        reproducibility=_reproducibility(env_vars, origin, normalized),
        floor=floor,
    )
    path = manifest.write(m, manifest.manifest_path(out_dir, final.name, compiled.spec.profile, run_id))
    tee.line(f"{job.name}: {final} ({fields['seconds']:.1f} s), manifest {path.name}")
    return final


def _print_start(tee: Sink, job: Job, version: str, torch: Against, env_vars: Mapping[str, str]) -> None:
    """Name the companion, its version and the torch it is built against, then the build's environment."""
    tee.line(f"{job.name} {version} against {torch.wheel.name} ({job.tree})")
    for k in sorted(env_vars):
        tee.line(f"  {k}={env_vars[k]}")


def _built_wheel(job: Job, partial: Path, version: str) -> Path:
    """The one wheel pip built in partial; CompanionError when there are others or it is not job's at version."""
    built = sorted(partial.glob("*.whl"))
    if len(built) != 1:
        raise CompanionError(f"{job.name}: pip wheel produced {len(built)} wheels in {partial}; expected one")
    name, got, _, _ = parse_wheel_filename(built[0].name)
    if canonicalize_name(name) != canonicalize_name(job.name) or got != Version(version):
        raise CompanionError(f"{job.name}: pip built {built[0].name}, not {job.name} {version}")
    return built[0]


def _companion_record(job: Job, version: str, torch: Against, checked: Mapping[str, str]) -> dict[str, Any]:
    """The manifest's companion record: what was built, the torch wheel it was built and checked against."""
    return {
        "name": job.name,
        "version": version,
        "torch_wheel": dataclasses.asdict(manifest.WheelRecord.of(torch.wheel)),
        "torch_version": str(torch.version),
        "check": checked["op"],
    }


def _reproducibility(env_vars: Mapping[str, str], origin: str, normalized: bool) -> dict[str, Any]:
    """The manifest's reproducibility record: the timestamp, origin, ccache base and Python the wheel was made
    with, and whether it was normalized."""
    return {
        "source_date_epoch": int(env_vars["SOURCE_DATE_EPOCH"]),
        "origin": origin,
        "ccache_basedir": env_vars["CCACHE_BASEDIR"],
        "python": "{}.{}".format(*sys.version_info[:2]),
        "normalized": normalized,
    }


def run_companions_step(req: Request) -> int:
    """The `companions` step: build against a given torch wheel (`invoke companions`)."""
    build_all(req)
    return 0
