"""invoke manifest show / diff: read the provenance record a build wrote next to its wheel."""

from __future__ import annotations

from pathlib import Path

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from .. import manifest as mf
from .common import handles_errors

# `invoke manifest diff` when the manifests differ. Not 1: invoke itself exits 1 for a bad
# option or a missing argument (and Python for a traceback), and 2..19 and 130 are named errors.
DIFFERENT = 99

FILE_HELP = "a *.manifest.json that `invoke build` wrote (next to the wheel, or preflight-*.manifest.json)"


@task(help={"file": FILE_HELP})
@handles_errors
def show(c: Context, file: str) -> None:
    """Print one build's manifest as tables.

    Source commit, patches, every profile key, image and its inputs, tool versions,
    environment, wheel sha256 (or preflight canaries), jobs, ccache and durations."""
    print(mf.show(mf.read(Path(file).expanduser())))


@task(help={"a": FILE_HELP, "b": "the manifest to compare it with", "all_": "also compare " + ", ".join(mf.PER_RUN)})
@handles_errors
def diff(c: Context, a: str, b: str, all_: bool = False) -> None:
    """Compare two manifests; exit 0 when identical, 99 when they differ.

    Each differing field is named by its dotted path (resolved_profile.cxxflags,
    environment.CXXFLAGS, wheel.sha256, source.commit, image.id, toolchain.cxx).
    Exit status: 0 when identical ("identical" is printed), 99 when they differ, any other
    non-zero on an error (invoke's own 1 for a bad option; 2-19 for torchbuild's named errors)."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    differences = mf.diff(mf.read(pa), mf.read(pb), everything=all_)
    print(mf.show_diff(differences, pa, pb, everything=all_))
    if differences:
        raise Exit(code=DIFFERENT)


manifest = Collection("manifest", show, diff)
