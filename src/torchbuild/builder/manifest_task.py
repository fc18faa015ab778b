"""invoke manifest show / diff: read the provenance record a build wrote next to its wheel."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit

from torchbuild.builder import repro
from torchbuild.core.console import printable
from torchbuild.core.errors import WheelError, named_os_errors
from torchbuild.core.options import option, positional
from torchbuild.core.safeio import user_path
from torchbuild.runtime import manifest as mf
from torchbuild.runtime.tasks import options_task
from torchbuild.verify.host import check_wheel_file

# `invoke manifest diff` when the manifests differ. Not 1: invoke exits 1 for its own errors
# (and Python for a traceback), and 2..29 and 130 are named errors (2 a bad option or argument).
DIFFERENT = 99

FILE_HELP = "a *.manifest.json that `invoke build` wrote (next to the wheel, or preflight-*.manifest.json)"


@dataclasses.dataclass(frozen=True)
class ManifestFile:
    """The manifest `invoke manifest show` prints."""

    file: str = positional(FILE_HELP)


@dataclasses.dataclass(frozen=True)
class ManifestPair:
    """The two manifests (or wheels) `invoke manifest diff` compares, and how much of them."""

    a: str = positional(FILE_HELP + ", or a wheel")
    b: str = positional("the manifest (or wheel) to compare it with")
    all_: bool = option(False, "also compare " + ", ".join(mf.PER_RUN))


@options_task(models={"given": ManifestFile})
def show(c: Context, given: ManifestFile) -> None:
    """Print one build's manifest as tables.

    Source commit, patches, every profile key, image and its inputs, tool versions,
    environment, wheel sha256 (or preflight canaries), jobs, ccache and durations."""
    print(mf.show(mf.read(user_path(given.file))))


@options_task(models={"given": ManifestPair})
def diff(c: Context, given: ManifestPair) -> None:
    """Compare two manifests, or two wheels; exit 0 when identical, 99 when they differ.

    Manifests: each differing field is named by its dotted path (resolved_profile.cxxflags,
    environment.CXXFLAGS, wheel.sha256, source.commit, image.id, toolchain.cxx); when both
    wheels are beside their manifests and their bytes differ, the members that differ follow.
    Wheels: identical (same sha256), or each member that differs (content, only in one,
    timestamp, mode, compression, position in the archive).
    Exit status: 0 when identical ("identical" is printed), 99 when they differ, any other
    non-zero on an error (a named error's code: 2 for a bad option or a missing argument)."""
    pa, pb = user_path(given.a), user_path(given.b)
    if pa.suffix == ".whl" or pb.suffix == ".whl":
        _diff_wheels(pa, pb)
        return
    ma, mb = mf.read(pa), mf.read(pb)
    differences = mf.diff(ma, mb, everything=given.all_)
    print(mf.show_diff(differences, pa, pb, everything=given.all_))
    if ma.wheel and mb.wheel and ma.wheel.sha256 != mb.wheel.sha256:
        _diff_wheels_beside(pa.parent / ma.wheel.name, pb.parent / mb.wheel.name)
    if differences:
        raise Exit(code=DIFFERENT)


def _diff_wheels(pa: Path, pb: Path) -> None:
    """`manifest.diff` of two wheels: each checked as a wheel first, then what differs printed (Exit 99 if any)."""
    for p in (pa, pb):
        _regular_file(p)  # zipfile would wait forever on a FIFO, read /dev/zero without end
        repro.check_member_count(p)  # before zipfile reads every member's entry into memory
        check_wheel_file(p)
    wheels = repro.diff_wheels(pa, pb)
    print(repro.describe(wheels, pa, pb))
    if not wheels.identical:
        raise Exit(code=DIFFERENT)


def _diff_wheels_beside(wa: Path, wb: Path) -> None:
    """The members that differ between two manifests' wheels, where both are beside their manifests."""
    if wa.is_file() and wb.is_file():
        print(repro.describe(repro.diff_wheels(wa, wb), wa, wb))
    else:
        print(
            f"the wheels are not both beside their manifests ({printable(wa)}, {printable(wb)}): "
            "their members are not compared"
        )


def _regular_file(path: Path) -> None:
    """WheelError unless path is a regular file (PathError when it cannot be read at all)."""
    with named_os_errors(path, "reading the wheel"):
        mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise WheelError(
            f"{printable(path)} is not a regular file (a directory, device, FIFO or socket)",
            hint="give two wheels, or two *.manifest.json, that `invoke build` wrote",
        )


manifest = Collection("manifest", show, diff)
