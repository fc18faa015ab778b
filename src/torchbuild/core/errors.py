"""Named failures. Each carries an exit code and one line on what to do next.

The top-level handlers (invoke tasks and the ``torchbuild`` console script) print
``error: <message>`` and ``hint: <hint>`` and exit with ``exit_code``; a traceback is
shown only with ``--debug`` (invoke) or ``TORCHBUILD_DEBUG=1``.

Every named error is defined here and listed in ``ERRORS``; ``error_for_exit`` turns a step's
exit code (inside a container or SIF) back into its class on the host without depending on
which other modules happen to be imported. The documentation's page "Errors and exit codes" is
generated from ERRORS: each class's docstring is its meaning there, so keep it a user's sentence.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, Union

from torchbuild.core.dirs import make_dirs


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

    @property
    def status(self) -> int:
        """The process's exit status for this error (exit_code, unless the error carries one)."""
        return self.exit_code


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
    """Building or pulling a toolchain or base image (``docker build``, a pull) failed."""

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
    from torchbuild.core.console import printable, redact  # rich, loaded only when an error is shown

    # a message quotes file names, logs, URLs and tools' words: no escape sequence reaches the
    # terminal, no credential of a URL is repeated
    name = type(err).__name__
    print(f"error: {name}: {printable(redact(err.message))}", file=sys.stderr)
    if err.hint:
        print(f"hint: {printable(redact(err.hint))}", file=sys.stderr)
    return err.status


class SourceError(TorchbuildError):
    """Fetching or unpacking the PyTorch source failed, or an archive was refused as unsafe (a
    member, symlink or hard link leading outside the tree, on every Python); nothing was unpacked."""

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
    """The disk is too small for the step: refused before anything was written, or a file system
    filled up during it (a compile step, ``pip wheel``, a copy into a wheelhouse); the message
    names the full file system, and what the step had made is removed."""

    exit_code = 12
    default_hint = "free disk space, or point cache_dir (--set cache_dir=...) or --out at a larger file system"


class OutOfMemory(TorchbuildError):
    """Compilers were killed for memory even with one job (after the automatic retries with fewer)."""

    exit_code = 13
    default_hint = (
        "give the build more memory (a bigger node, --memory, a larger Slurm --mem), or build fewer CUDA archs"
    )


class VerifyFailed(TorchbuildError):
    """A built wheel (or installed torch) failed a verification check (the table names it)."""

    exit_code = 14
    default_hint = "the table above names each failed check; the JSON report has the details"


class BuildInterrupted(TorchbuildError):
    """The build was interrupted (Ctrl-C or SIGTERM); its container, every build process and the
    partial wheel are gone."""

    exit_code = 130
    default_hint = "rerun the same command to resume: finished objects are reused from the build tree and ccache"


class UsageError(TorchbuildError):
    """An option was given a value it cannot take (``--jobs 0``), or together with one it
    contradicts (``--memory`` without ``--in-container``, ``--ref`` with a local tree), or a
    ``--ref``/``--source`` starts with ``-`` (git would read it as an option; profile keys such as
    ``torch_ref`` are refused alike, as ProfileError)."""

    exit_code = 2
    default_hint = "see `invoke --help <task>` for the options and their values"


class PathError(TorchbuildError):
    """A path the user gave (``--out``, ``--dest``, ``cache_dir``, ``--source``, a manifest...) cannot
    be used as asked: missing, not a directory, not writable, read-only, or too long."""

    exit_code = 15
    default_hint = "choose a path you can write to (an existing, writable directory, or one that can be created)"


class UnsafePatch(TorchbuildError):
    """A patch would write outside the source tree (a ``..`` path or a symlink leading out); nothing was written."""

    exit_code = 16
    default_hint = "fix the patch (paths relative to the tree, no `..`) or remove the symlink from the tree"


class ImageOutOfDate(TorchbuildError):
    """The toolchain image (or SIF) was built from other inputs than the profile asks for (the
    message lists them)."""

    exit_code = 17
    default_hint = "rebuild it with `invoke image --profile <profile> --arch <arch>`"


class WheelError(TorchbuildError):
    """A file given as a wheel is not one (its name, not a zip, no ``.dist-info/WHEEL``)."""

    exit_code = 18
    default_hint = "point --wheel at a .whl file `invoke build` wrote"


class SubmissionRefused(TorchbuildError):
    """sbatch or qsub refused the batch job (account, partition or queue, limits); the
    scheduler's own message says why."""

    exit_code = 20
    default_hint = "fix what the scheduler names, then submit again; --dry-run shows the script"


class JobFailed(TorchbuildError):
    """A batch job followed with ``--wait`` failed, was cancelled or timed out: the message gives
    its id, state, exit code and the last 30 lines of its log. The process exits with the job's
    own exit code (the build's named error code) where it has one, else 21."""

    exit_code = 21
    default_hint = "read the job's log; submit again to resume where it stopped"

    def __init__(self, message: str, hint: str | None = None, job_exit: int | None = None) -> None:
        super().__init__(message, hint)
        self.job_exit = job_exit

    @property
    def status(self) -> int:
        return self.job_exit if self.job_exit and 0 < self.job_exit < 256 else self.exit_code


class InstallFailed(TorchbuildError):
    """``invoke install`` could not make the environment (venv, pip, mpi4py, ``pip check``, the
    import check); the prefix it had made is removed."""

    exit_code = 22
    default_hint = "the pip or compiler output above says why; fix it and run the same command again"


class WheelhouseConflict(TorchbuildError):
    """A wheelhouse (or an install) would mix local versions of one project, or replace a wheel
    with another of the same name."""

    exit_code = 23
    default_hint = "use one wheelhouse per build flavour"


class CommsFailed(TorchbuildError):
    """NCCL or the aws-ofi-nccl plugin did not build, or what was built fails its checks
    (``ncclGetVersion``, ``ldd``, the plugin's symbols); nothing of the run is kept."""

    exit_code = 24
    default_hint = "the compiler output above says why; fix it and run the same command again"


class HostSetupFailed(TorchbuildError):
    """``invoke host-check --apply``/``--restore`` could not change (or put back) a setting of the
    benchmark host, or was run without root; what it had already changed is put back."""

    exit_code = 25
    default_hint = "run it as root, or apply the printed command by hand"


class CompanionError(TorchbuildError):
    """A companion library (torchvision, torchaudio, torchtext) does not pair with the torch
    being built (outside the companion table), its tree is not one, or its wheel did not build or
    fails its check beside that torch; no wheel of it is kept."""

    exit_code = 26
    default_hint = "see the companion table: docs/guide/developers.md, 'Which releases go together'"


class BenchFailed(TorchbuildError):
    """torchbench's install asked for a torch other than the built one (or replaced it), or its
    run failed."""

    exit_code = 27
    default_hint = "the pip or benchmark output above says why"


class ManifestError(TorchbuildError):
    """A file given as a manifest cannot be read as one: not JSON, not a torchbuild manifest,
    fields of the wrong type, or written by a newer torchbuild (a newer schema_version)."""

    exit_code = 19
    default_hint = "give a *.manifest.json that `invoke build` wrote (next to the wheel, or preflight-*.manifest.json)"


class LockError(TorchbuildError):
    """A toolchain lock file cannot be used: it is not a lock, was made for other image inputs
    (another profile, arch, package list or Python), or no longer installs (a pinned version
    is gone from the archive or the index, or a hash does not match)."""

    exit_code = 28
    default_hint = "refresh it with `invoke image --lock` (with --rebuild, every package is resolved afresh)"


class RecipeError(TorchbuildError):
    """``invoke sif --from-recipe`` cannot translate the toolchain recipe (``USER``, ``ONBUILD``,
    another ``SHELL`` form, an ``ARG`` without a value, several stages, options such as
    ``COPY --from=``, a JSON form, a here-document, text that is not UTF-8: the line is named), or
    Apptainer cannot build it unprivileged here (no ``/etc/subuid`` entry for a debootstrap
    bootstrap, no user namespaces): the hint names the command or setting."""

    exit_code = 29
    default_hint = "build the image with Docker and convert it instead: `invoke image` then `invoke sif`"


class NoProgress(TorchbuildError):
    """A job round (the profile's job_rounds) finished no build step before its limit: another
    round would do the same, so the job stops instead of going on."""

    exit_code = 30
    default_hint = "give the job a longer walltime, then submit the same request again"


class RoundsExhausted(TorchbuildError):
    """The build did not finish within the profile's job_rounds allocations."""

    exit_code = 31
    default_hint = "raise job_rounds or walltime and submit the same request again: the build resumes"


class FloorError(TorchbuildError):
    """A toolchain or a wheel needs a newer glibc or libstdc++ than where the wheel must run: the
    profile's glibc_floor or libstdcxx_floor, a wheelhouse's floor, or the install host's glibc."""

    exit_code = 32
    default_hint = "build in a base whose glibc is at most the floor (the message names one), or raise the floor"


class TreeBusy(TorchbuildError):
    """Another build is running in the same source tree: a torchbuild run, or the compile of one
    whose torchbuild was killed while its pip and ninja go on. Two ninjas in one tree would write
    the same objects."""

    exit_code = 33
    default_hint = "wait for it to end, or stop it (the message names its process), then run the same command again"


class TooLarge(PathError):
    """A file the user named (a manifest, a CA file, the host-check state file, a ninja log, a
    constraint file) is larger than torchbuild will read for that purpose."""


# The registry: every TorchbuildError subclass, listed by hand (tests/unit/core/test_errors.py checks
# that no subclass anywhere in the package is missing; the docs' error table is generated from it).
ERRORS: tuple[type[TorchbuildError], ...] = (
    ProfileError,
    UsageError,
    EngineUnavailable,
    ImageBuildFailed,
    ToolMissing,
    BaseImageError,
    ImageNotFound,
    SourceError,
    PatchConflict,
    BuildFailed,
    SifError,
    InsufficientSpace,
    OutOfMemory,
    VerifyFailed,
    PathError,
    TooLarge,
    UnsafePatch,
    ImageOutOfDate,
    WheelError,
    ManifestError,
    SubmissionRefused,
    JobFailed,
    InstallFailed,
    WheelhouseConflict,
    CommsFailed,
    HostSetupFailed,
    CompanionError,
    BenchFailed,
    LockError,
    RecipeError,
    NoProgress,
    RoundsExhausted,
    FloorError,
    TreeBusy,
    BuildInterrupted,
)

# The exit codes that more than one class shares, deliberately, and the class each maps back to:
# 2 is a bad input, ProfileError (a profile or --set value) or UsageError (an option); a step in
# a container gets its options from the host, which checked them, so a 2 there is the profile's.
# 15 is PathError and TooLarge, its refinement for a file too large to read: a path problem.
SHARED_EXITS: dict[int, type[TorchbuildError]] = {2: ProfileError, 15: PathError}


def _exit_map() -> dict[int, type[TorchbuildError]]:
    by_code: dict[int, list[type[TorchbuildError]]] = {}
    for cls in ERRORS:
        by_code.setdefault(cls.exit_code, []).append(cls)
    found: dict[int, type[TorchbuildError]] = {}
    for code, classes in by_code.items():
        if len(classes) == 1:
            found[code] = classes[0]
        elif SHARED_EXITS.get(code) in classes:
            found[code] = SHARED_EXITS[code]
        else:  # a new class reusing a code: give it its own, or document the sharing above
            raise RuntimeError(f"exit code {code} is shared by {', '.join(c.__name__ for c in classes)}")
    return found


EXIT_CODES: dict[int, type[TorchbuildError]] = _exit_map()


def error_for_exit(code: int) -> type[TorchbuildError] | None:
    """The named error class whose exit code is `code` (for a shared code, the one SHARED_EXITS
    names); None for 0, 1 (a crash, or a plain TorchbuildError) and any code no class has."""
    return EXIT_CODES.get(code)


StrPath = Union[str, "os.PathLike[str]"]

_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def os_fault(exc: OSError, path: StrPath, what: str) -> TorchbuildError:
    """The named error for an operating-system fault met while doing `what` with `path`."""
    p = Path(path)
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientSpace(f"{what}: no space left on the file system of {p}")
    if exc.errno == errno.EROFS:
        return PathError(f"{what}: {p} is on a read-only file system")
    if exc.errno in _NOT_WRITABLE:
        return PathError(
            f"{what}: permission denied for {p}", hint="choose a directory you can write to, or fix its permissions"
        )
    if exc.errno == errno.ENAMETOOLONG:
        return PathError(f"{what}: the path {p} is too long for its file system", hint="choose a shorter path")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return PathError(
            f"{what}: {p} (or a parent of it) exists and is not a directory", hint="choose a directory path"
        )
    if exc.errno == errno.EISDIR:
        return PathError(f"{what}: {p} is a directory, a file was expected")
    if exc.errno == errno.ENOENT:
        return PathError(f"{what}: {p} does not exist")
    if exc.errno == errno.ENOEXEC:
        return PathError(
            f"{what}: {p} cannot be executed here (no #! line, or built for another machine)",
            hint="run it through its interpreter (sh, python3), or use a build for this machine",
        )
    return PathError(f"{what}: {p}: {reason}")


@contextlib.contextmanager
def named_os_errors(path: StrPath, what: str) -> Iterator[None]:
    """Turn any OSError raised inside into the named error for `path` (never a traceback)."""
    try:
        yield
    except TorchbuildError:
        raise
    except OSError as exc:
        raise os_fault(exc, fault_path(exc) or path, what) from exc


def fault_path(exc: OSError) -> StrPath | None:
    """The path an OSError is about: for a full disk the destination of a copy, rename or link
    (filename2; shutil.copyfile names the source in filename), else its filename."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and getattr(exc, "filename2", None):
        return exc.filename2  # type: ignore[no-any-return]
    return getattr(exc, "filename", None)


def writable_dir(path: StrPath, what: str) -> Path:
    """Create path (and its parents) if needed and check that it is a writable directory;
    PathError or InsufficientSpace naming it otherwise. Returns the absolute path."""
    try:
        p = Path(path).expanduser().absolute()
    except RuntimeError:  # ~user of no user here (safeio.user_path names it the same way)
        raise PathError(
            f"{what} {path}: there is no such user on this host to expand ~", hint="write the path out in full"
        ) from None
    with named_os_errors(p, what):
        if p.exists() and not p.is_dir():
            raise PathError(f"{what}: {p} exists and is not a directory", hint="choose a directory path")
        make_dirs(p)  # recorded: a failed task removes it again while it is empty (core/dirs.py)
        if not os.access(p, os.W_OK | os.X_OK):
            raise PathError(f"{what}: {p} is not writable", hint="choose a directory you can write to")
    return p
