"""When not to build: which of a profile's choices need a source build, and, where none does, the
official wheel that would do, with `invoke comms`' plugin and `invoke install`'s runtime env.

A source build costs a site hours (docs' Measured figures: 22,110 s of compile for a CPU wheel);
an official wheel costs a download. The facts about the official wheels are in official_wheels
(one table, with its sources); this module only compares a BuildSpec with them. A choice counts
as a need only where the official wheel cannot give it: a BLAS or flags of the site's own are a
difference, reported as a note, not a need.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from torchbuild.profile import official_wheels as ow
from torchbuild.profile.config import BuildSpec, data_dir
from torchbuild.profile.torch_lines import version_tuple
from torchbuild.source.fetch import Series, load_series

_ON = ("1", "on", "yes", "true")
_DEFAULT_REPO = "https://github.com/pytorch/pytorch.git"
_FINAL = re.compile(r"\d+\.\d+(\.\d+)?")


@dataclasses.dataclass(frozen=True)
class Reason:
    """One profile choice the official wheel cannot give: the key, its value, and why."""

    key: str
    value: str
    why: str
    known: bool = True  # False: torchbuild's table cannot tell (a torch line it does not know)

    def __str__(self) -> str:
        return f"{self.key}: {self.value}: {self.why}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """reasons (empty: no build needed), notes (differences that need none) and, without reasons,
    the official-wheel route, one step a line."""

    reasons: tuple[Reason, ...]
    notes: tuple[str, ...]
    route: tuple[str, ...]
    index: str = ""  # the official wheel's pip index, where one fits

    @property
    def summary(self) -> str:
        if any(r.known for r in self.reasons):
            return "yes: " + "; ".join(f"{r.key} {r.value}" for r in self.reasons if r.known)
        if self.reasons:
            return "cannot tell: " + self.reasons[0].why
        return f"no: the official wheel would do ({self.index})"


def _major_minor(arch: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)", arch)
    return (int(m[1]), int(m[2])) if m else None


def arch_runs(arch: str, wheel: ow.Wheel) -> str | None:
    """The entry of wheel's list whose code runs on arch's GPU ("8.9": 8.6's, binary compatible
    within a major for a higher minor; "9.0a": 9.0's, without its arch-specific instructions),
    None when none does. "+PTX" is left aside (PTX is for GPUs newer than the list)."""
    base = arch.removesuffix("+PTX").removesuffix("a")
    listed = [a.removesuffix("+PTX") for a in wheel.archs]
    if base in listed:
        return base
    wanted = _major_minor(base)
    if wanted is None:
        return None
    runs = [a for a in listed if (mm := _major_minor(a)) and mm[0] == wanted[0] and mm[1] <= wanted[1]]
    return max(runs, key=version_tuple) if runs else None


def _covers(wheel: ow.Wheel, archs: Sequence[str]) -> bool:
    return all(arch_runs(a, wheel) for a in archs)


def choose_wheel(spec: BuildSpec, line: ow.Line) -> ow.Wheel | Reason:
    """The official wheel for spec's arch and CUDA: the CPU one, the same CUDA, else one of the same
    CUDA major (the wheel brings its own CUDA runtime; a driver of that major runs it) that runs
    cuda_arch_list, the nearest; a Reason when the line has none of that major."""
    wheels = line.x86_64 if spec.arch.value == "x86_64" else line.aarch64
    if not spec.cuda:
        return ow.CPU
    exact = [w for w in wheels if w.cuda == spec.cuda_version]
    if exact:
        return exact[0]
    major = spec.cuda_version.split(".")[0]
    same = [w for w in wheels if w.cuda.split(".")[0] == major]
    if not same:
        has = ", ".join(w.cuda for w in wheels if w.cuda) or "none"
        driver = " (a CUDA 13 wheel needs driver r580 or newer)" if major != "13" and has.startswith("13") else ""
        return Reason(
            "cuda_version",
            spec.cuda_version,
            f"torch {line.torch}'s official {spec.arch.value} wheels have no CUDA {major} build (CUDA: {has}){driver}",
        )
    fit = [w for w in same if _covers(w, spec.cuda_arch_list)] or same
    wanted = version_tuple(spec.cuda_version)
    return min(fit, key=lambda w: (version_tuple(w.cuda) < wanted, abs(version_tuple(w.cuda)[1] - wanted[1])))


def _arch_reasons(spec: BuildSpec, wheel: ow.Wheel) -> list[Reason]:
    missing = [a for a in spec.cuda_arch_list if not arch_runs(a, wheel)]
    if not missing:
        return []
    return [
        Reason(
            "cuda_arch_list",
            ",".join(missing),
            f"no code of the official CUDA {wheel.cuda} {spec.arch.value} wheel runs on it "
            f"(its list: {';'.join(wheel.archs)})",
        )
    ]


def _python_reasons(spec: BuildSpec, line: ow.Line) -> list[Reason]:
    out = []
    for version in spec.pythons:
        if not version_tuple(line.python_min) <= version_tuple(version) <= version_tuple(line.python_max):
            key = "python_version" if version == spec.python_version else "python_versions"
            span = f"{line.python_min} to {line.python_max}"
            out.append(Reason(key, version, f"no official torch {line.torch} wheel for it (Pythons {span})"))
    return out


def _distributed_reasons(spec: BuildSpec) -> list[Reason]:
    out = []
    if "mpi" in spec.distributed or _on(spec, "USE_MPI"):
        out.append(Reason("distributed", "includes mpi", "official wheels have no MPI backend (built without USE_MPI)"))
    if "ucc" in spec.distributed or _on(spec, "USE_UCC"):
        out.append(Reason("distributed", "includes ucc", "official wheels have no UCC backend"))
    return out


def _nccl_reasons(spec: BuildSpec) -> list[Reason]:
    """A site NCCL linked at build time. The official wheel loads pip's libnccl.so.2 through an
    RPATH searched before LD_LIBRARY_PATH: only LD_PRELOAD puts another NCCL in its place, at
    run time, untested by PyTorch; a build links the one chosen."""
    if not spec.cuda or "nccl" not in spec.distributed:
        return []
    runtime = (
        "the official wheel loads libnccl.so.2 from the nvidia-nccl pip package (its RPATH wins over "
        "LD_LIBRARY_PATH; LD_PRELOAD of the site's is the run-time alternative, untested)"
    )
    if spec.nccl == "source":
        return [
            Reason(
                "nccl",
                "source",
                f"NCCL {spec.nccl_version} built for cuda_arch_list and linked at build time; {runtime}",
            )
        ]
    if spec.nccl == "system" or _on(spec, "USE_SYSTEM_NCCL"):
        return [Reason("nccl", "system", f"the image's or site's NCCL linked at build time; {runtime}")]
    return []


def _on(spec: BuildSpec, switch: str) -> bool:
    return spec.switches.get(switch, "").strip().lower() in _ON


def _applies(where: str, spec: BuildSpec) -> bool:
    return all(t == "all" or (t == "cuda" and spec.cuda) or t == spec.arch.value for t in where.split("-"))


def _switch_reasons(spec: BuildSpec) -> list[Reason]:
    """Switches turned on that the official wheel is not known to have. Turned off, a switch
    asks for less than the wheel has: no need."""
    handled = {"USE_MPI", "USE_UCC", "USE_SYSTEM_NCCL"}
    out = []
    for name, value in sorted(spec.switches.items()):
        if name in handled or not _on(spec, name):
            continue
        where = ow.ON.get(name)
        if where is None or not _applies(where, spec):
            why = "not among what the official wheels are known to build with"
            out.append(Reason(f"switches.{name}", value, why))
    return out


def _patch_reasons(spec: BuildSpec, series: Series) -> list[Reason]:
    """The series' patches, less those that touch only MPI-only sources when the build has no MPI."""
    mpi = "mpi" in spec.distributed or _on(spec, "USE_MPI")
    counted = [p for p in series.patches if mpi or not _mpi_only(p.path.read_text(errors="replace"))]
    if not counted:
        return []
    where = _shown_dir(series.directory) if series.directory else spec.patches
    names = ", ".join(p.name for p in counted)
    n = len(counted)
    return [Reason("patches", spec.patches, f"a series of {n} patch{'es' if n > 1 else ''} ({where}: {names})")]


def _shown_dir(directory: Path) -> str:
    """patches/pytorch/2.4 for torchbuild's own series, the path for a site's."""
    try:
        return str(directory.relative_to(data_dir()))
    except ValueError:
        return str(directory)


def _mpi_only(text: str) -> bool:
    paths = re.findall(r"^diff --git a/(\S+) b/", text, flags=re.M)
    return bool(paths) and all(p.startswith(ow.MPI_ONLY_SOURCES) for p in paths)


def _source_reasons(spec: BuildSpec, line: ow.Line | None) -> list[Reason]:
    if line is None:
        known = f"{ow.LINES[0].torch} to {ow.LINES[-1].torch}"
        return [
            Reason(
                "torch_version",
                spec.torch_version,
                f"torchbuild's table of official wheels knows {known} only",
                known=False,
            )
        ]
    out = []
    if not _FINAL.fullmatch(spec.torch_version):
        out.append(Reason("torch_version", spec.torch_version, "not a final release"))
    if spec.torch_ref and spec.torch_ref != f"v{spec.torch_version}":
        out.append(
            Reason(
                "torch_ref",
                spec.torch_ref,
                "not the release tag: official wheels are of release tags (nightlies are of main's day, not a chosen commit)",
            )
        )
    return out


def reasons(spec: BuildSpec, series: Series | None = None) -> list[Reason]:
    """Every reason spec needs a source build; [] when the official wheel would do. series is its
    patch series (default: the one its `patches` key selects)."""
    line = ow.line_of(spec.torch_version)
    found = _source_reasons(spec, line)
    if line is None:
        return found
    wheel = choose_wheel(spec, line)
    found += [wheel] if isinstance(wheel, Reason) else _arch_reasons(spec, wheel)
    found += _python_reasons(spec, line)
    if spec.glibc_floor and version_tuple(spec.glibc_floor) < version_tuple(line.glibc):
        why = f"below the official torch {line.torch} wheels' glibc {line.glibc} (manylinux_{line.glibc.replace('.', '_')})"
        found.append(Reason("glibc_floor", spec.glibc_floor, why))
    found += _distributed_reasons(spec) + _nccl_reasons(spec) + _switch_reasons(spec)
    found += _patch_reasons(spec, series if series is not None else load_series(spec.patches, spec.torch_version))
    return found


def _arch_notes(spec: BuildSpec, wheel: ow.Wheel) -> list[str]:
    """The arches the official wheel serves with another entry's code."""
    out = []
    for arch in spec.cuda_arch_list if wheel.cuda else ():
        runs, base = arch_runs(arch, wheel), arch.removesuffix("+PTX")
        if runs and base.endswith("a"):
            out.append(
                f"cuda_arch_list {arch}: the official wheel's {runs} code runs there, without arch-specific "
                "code throughout (a choice, not a need)"
            )
        elif runs and runs != base:
            out.append(
                f"cuda_arch_list {arch} runs the official wheel's {runs} code (binary compatible within a major)"
            )
    return out


def _notes(spec: BuildSpec, wheel: ow.Wheel) -> list[str]:
    """The differences from the official wheel that need no build."""
    out = []
    if wheel.cuda and wheel.cuda != spec.cuda_version:
        out.append(
            f"cuda_version {spec.cuda_version}: the official wheel is CUDA {wheel.cuda}, with its own CUDA "
            f"libraries from pip; a driver for CUDA {wheel.cuda.split('.')[0]} runs it"
        )
    out += _arch_notes(spec, wheel)
    official_blas = "mkl" if spec.arch.value == "x86_64" else "openblas"
    if spec.blas != official_blas and not (spec.arch.value == "aarch64" and spec.blas == "nvpl"):
        out.append(
            f"blas {spec.blas}: the official {spec.arch.value} wheel has {official_blas.upper()} (a choice, not a need)"
        )
    flags = [k for k in ("cflags", "cxxflags", "ldflags") if getattr(spec, k)]
    if flags:
        out.append(f"{', '.join(flags)}: the official wheel is built without these flags (a choice, not a need)")
    if spec.mpi != "none" and "mpi" not in spec.distributed:
        out.append(f"mpi {spec.mpi} serves mpi4py only (distributed has no mpi): `invoke install` builds it")
    if spec.torch_repo != _DEFAULT_REPO:
        out.append(
            f"torch_repo {spec.torch_repo}: a mirror's release tag is the same code; a fork's changes need a build"
        )
    return out


def _route(spec: BuildSpec, wheel: ow.Wheel, profile: str) -> list[str]:
    """The official-wheel route, one step a line; profile as the user names it (quoted)."""
    tag = f"+cu{wheel.cuda.replace('.', '')}" if wheel.cuda else "+cpu"
    named = shlex.quote(profile)
    steps = [
        f"pip download torch=={spec.torch_version} --no-deps --index-url {wheel.index} --dest WHEELS "
        f"(run with Python {spec.python_version} on {spec.arch.value})"
    ]
    if spec.aws_ofi_nccl_version:
        steps.append(
            f"invoke comms --profile {named}: the aws-ofi-nccl {spec.aws_ofi_nccl_version} plugin alone (the wheel's "
            "NCCL is pip's); point jobs at it with runtime_env NCCL_NET_PLUGIN=<the plugin library under the prefix "
            "it prints> (NCCL 2.21 and later open a path) and its libfabric on their library path (runtime_modules): "
            "`invoke install` carries a comms prefix only for a wheel torchbuild built"
        )
    steps.append(
        f"invoke install --profile {named} --prefix PREFIX --wheel WHEELS/torch-{spec.torch_version}{tag}-*.whl: "
        "the venv with runtime_packages, mpi4py where the profile has MPI, runtime_env and modulefiles"
    )
    steps.append("nothing to compile: the hours of a source build saved")
    return steps


def assess(spec: BuildSpec, series: Series | None = None, profile: str = "") -> Verdict:
    """reasons(spec), and, without reasons, the official-wheel route (its commands name profile,
    default spec's name); the notes either way."""
    found = reasons(spec, series)
    line = ow.line_of(spec.torch_version)
    if line is None:
        return Verdict(tuple(found), (), ())
    wheel = choose_wheel(spec, line)
    if isinstance(wheel, Reason):
        return Verdict(tuple(found), (), ())
    route = () if found else tuple(_route(spec, wheel, profile or spec.profile))
    return Verdict(tuple(found), tuple(_notes(spec, wheel)), route, wheel.index)


def render(verdict: Verdict, profile: str) -> str:
    """The doctor's section: the reasons, or the route; the notes."""
    lines = [f"source build needed? (profile {profile})"]
    if verdict.reasons:
        head = "yes" if any(r.known for r in verdict.reasons) else "cannot tell"
        lines.append("  yes: official wheels lack what the profile asks:" if head == "yes" else "  cannot tell:")
        lines += [f"  - {r}" for r in verdict.reasons]
    else:
        lines.append("  no: the official wheel, `invoke comms`' plugin and `invoke install`'s runtime env would do:")
        lines += [f"  {n}. {step}" for n, step in enumerate(verdict.route, 1)]
    lines += [f"  note: {n}" for n in verdict.notes]
    return "\n".join(lines)
