"""Named failures. Each carries an exit code and one line on what to do next.

The top-level handlers (invoke tasks and the ``torchbuild`` console script) print
``error: <message>`` and ``hint: <hint>`` and exit with ``exit_code``; a traceback is
shown only with ``--debug`` (invoke) or ``TORCHBUILD_DEBUG=1``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import ClassVar


class TorchbuildError(Exception):
    """Base class: a failure the user can act on."""

    exit_code: ClassVar[int] = 1
    default_hint: ClassVar[str] = "run with --debug for a traceback"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        return self.message


class ProfileError(TorchbuildError):
    """A profile or --set override is invalid (unknown key, wrong type, bad value)."""

    exit_code = 2
    default_hint = "run `invoke config --keys` to list every key with its type and allowed values"


class EngineUnavailable(TorchbuildError):
    """The Docker engine cannot be reached."""

    exit_code = 3
    default_hint = (
        "start the engine (`sudo systemctl start docker`, or `sudo dockerd &`) "
        "or point DOCKER_HOST at a running one; `invoke doctor` checks the host"
    )


class ImageBuildFailed(TorchbuildError):
    """``docker build`` of a toolchain or base image failed."""

    exit_code = 4
    default_hint = "read the build log named above; fix the profile (packages, base image) and rerun"


class ToolMissing(TorchbuildError):
    """A host program the task needs is not installed."""

    exit_code = 5
    default_hint = "install it with your package manager, then rerun; `invoke doctor` lists what is missing"


class BaseImageError(TorchbuildError):
    """Making a local Debian base image (debootstrap + import) failed."""

    exit_code = 6
    default_hint = "check the mirror and suite (`--mirror`, `--suite`); debootstrap needs root"


class ImageNotFound(TorchbuildError):
    """A build needs a toolchain image that has not been built."""

    exit_code = 7
    default_hint = "build it first with `invoke image --profile <profile> --arch <arch>`"


def debug_enabled() -> bool:
    """True when the user asked for tracebacks (invoke --debug or TORCHBUILD_DEBUG=1)."""
    if os.environ.get("TORCHBUILD_DEBUG", "") not in ("", "0"):
        return True
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def report(err: TorchbuildError) -> int:
    """Print a named error the way every entry point does; return its exit code."""
    name = type(err).__name__
    print(f"error: {name}: {err.message}", file=sys.stderr)
    if err.hint:
        print(f"hint: {err.hint}", file=sys.stderr)
    return err.exit_code


class SourceError(TorchbuildError):
    """Fetching or unpacking the PyTorch source failed."""

    exit_code = 8
    default_hint = "check --source (URL, directory, tarball or .dsc) and the ref"


class PatchConflict(TorchbuildError):
    """A patch of the series does not apply; the tree was left untouched."""

    exit_code = 9
    default_hint = "refresh the patch for this version, or build with --set patches=none"


class BuildFailed(TorchbuildError):
    """The compile (or the wheel step) failed."""

    exit_code = 10
    default_hint = "read the log named above; `invoke build --preflight` finds toolchain errors in minutes"


class SifError(TorchbuildError):
    """Converting an image to a SIF, or running one, failed."""

    exit_code = 11
    default_hint = "read the log named above; `invoke doctor` shows whether Apptainer or a Docker engine is usable"


class InsufficientSpace(TorchbuildError):
    """A step would run out of disk: refused before it starts, so nothing is left half written."""

    exit_code = 12
    default_hint = "free disk space, or point cache_dir (--set cache_dir=...) or --out at a larger file system"


class OutOfMemory(TorchbuildError):
    """Compilers were killed for memory even with one job."""

    exit_code = 13
    default_hint = (
        "give the build more memory (a bigger node, --memory, a larger Slurm --mem), or build fewer CUDA archs"
    )


class VerifyFailed(TorchbuildError):
    """A built wheel (or installed torch) failed a verification check."""

    exit_code = 14
    default_hint = "the table above names each failed check; the JSON report has the details"


class BuildInterrupted(TorchbuildError):
    """The build was interrupted (Ctrl-C or SIGTERM); its container and partial wheel are gone."""

    exit_code = 130
    default_hint = "rerun the same command to resume: finished objects are reused from the build tree and ccache"
