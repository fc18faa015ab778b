"""The build manifest: a typed, versioned record of one build, written and read only here.

A manifest says what went into a wheel (or a preflight): the source and its commit, the patch
series, the resolved profile, the image and its recorded inputs, the engine, the tool versions,
the environment the compiler saw, the jobs, ccache and timings, and the wheel's sha256.

The JSON keys are those of the untyped dict torchbuild wrote before (so readers of
`<wheel>.manifest.json` keep working), plus `schema_version`. A change to the shape bumps
SCHEMA_VERSION; a manifest from a newer torchbuild is refused with a named error rather than
misread, and one written before versioning (no `schema_version`) reads as version 0.

Records are frozen dataclasses, converted to and from JSON data by the package's one cattrs
converter (core.records): a key a record does not have, a missing key or a value of the wrong
type is a ManifestError naming the field. The hooks registered at the end of the records
section keep the JSON as it was: optional records left out when None, and a SIF manifest's
`image_id` from before schema 1 read as `id`. Annotations use typing.Optional because cattrs
evaluates them at run time, and the package supports Python 3.9.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional

from cattrs.gen import make_dict_unstructure_fn, override

from torchbuild import __version__
from torchbuild.core import records
from torchbuild.core.atomic import atomic_write_text
from torchbuild.core.console import printable, redact, table
from torchbuild.core.errors import BuildFailed, PathError, named_os_errors
from torchbuild.core.errors import (
    ManifestError as ManifestError,  # defined in errors.py (its registry); importable here too
)
from torchbuild.core.safeio import MANIFEST_LIMIT, loads_json, read_bytes
from torchbuild.runtime.installed import INSTALLED_LIST, canonical_list, installed_digest

if typing.TYPE_CHECKING:
    from torchbuild.profile.config import BuildSpec

# 2: `comms` (the NCCL and aws-ofi-nccl plugin `invoke comms` built and torch was linked to)
# 3: `companion` (a torchvision/torchaudio/torchtext wheel: the torch wheel it was built against)
# 4: `reproducibility` (SOURCE_DATE_EPOCH and its origin, ccache's base dir, the Python, the zip rewrite)
# 5: `packages` (the toolchain image's installed list: its sha256, and the copy in <out>/logs)
# 6: `build_venv` (a native build's venv from PyPI: its key, made or reused, cmake/ninja/mkl versions)
# 7: `ccache.remote` (ccache's remote storage, profile ccache_remote: its local and remote hits, misses, errors)
# 8: `floor` (the wheel's ELF floor: glibc, libstdc++ and C++ ABI versions, libraries, manylinux tag)
SCHEMA_VERSION = 8
SUFFIX = ".manifest.json"
ENGINES = ("native", "docker", "apptainer")
KINDS = ("wheel", "preflight")


READ_HINT = ManifestError.default_hint


# --------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class Submodule:
    path: str
    commit: str


@dataclasses.dataclass(frozen=True)
class SourceRecord:
    """Where the tree came from: SourceInfo.to_dict()."""

    kind: str  # git | dir | tarball | dsc
    path: str
    url: str = ""
    ref: str = ""
    commit: str = ""
    sha256: str = ""  # of the tarball or .dsc
    submodules: tuple[Submodule, ...] = ()


@dataclasses.dataclass(frozen=True)
class PatchRecord:
    name: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class PatchesRecord:
    """The patch series (Series) and what applying it did (ApplyResult)."""

    series: Optional[str]  # the series directory; None: no series for this version
    checksum: str
    patches: tuple[PatchRecord, ...] = ()
    applied_now: tuple[str, ...] = ()
    already_applied: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """The toolchain image (Docker) or SIF (Apptainer) the build ran in."""

    aliases: ClassVar[Mapping[str, str]] = {"image_id": "id"}  # SIF manifests before schema 1 (_structure_image)

    tag: Optional[str] = None
    id: Optional[str] = None
    sif: Optional[str] = None  # the SIF's path as the build saw it
    profile_hash: Optional[str] = None
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)  # the image's input labels

    @classmethod
    def from_labels(
        cls,
        labels: Mapping[str, str],
        *,
        tag: str | None = None,
        image_id: str | None = None,
        sif: str | None = None,
    ) -> ImageRecord:
        """The record from an image's (or a SIF's) labels: every `org.torchbuild.<name>` label
        but the SIF's own (`org.torchbuild.sif.*`) is an input, under <name>."""
        from torchbuild.runtime.engine import LABEL_PREFIX  # here: engine.py brings in the Docker client

        prefix, own = f"{LABEL_PREFIX}.", f"{LABEL_PREFIX}.sif."
        inputs = {k[len(prefix) :]: str(v) for k, v in labels.items() if k.startswith(prefix) and not k.startswith(own)}
        return cls(tag=tag, id=image_id, sif=sif, profile_hash=labels.get(f"{prefix}profile-hash"), inputs=inputs)


@dataclasses.dataclass(frozen=True)
class Retry:
    """One out-of-memory kill and the resume with fewer jobs that followed."""

    step: str
    jobs: int
    next_jobs: int
    evidence: str
    peak_rss_bytes: int
    cgroup_peak_bytes: Optional[int]
    seconds: float


@dataclasses.dataclass(frozen=True)
class JobsRecord:
    max_jobs: int
    final_jobs: int
    reason: str
    nvcc_threads: int = 0
    retries: tuple[Retry, ...] = ()


@dataclasses.dataclass(frozen=True)
class CcacheRemoteRecord:
    """ccache's remote storage behind the local cache (the profile's ccache_remote) during the
    compile: hits served by the local cache and by the remote one, remote misses, and the
    errors and timeouts after which ccache went on with the local cache alone."""

    url: str
    read_only: bool
    local_hits: int
    remote_hits: int
    remote_misses: int
    remote_errors: int
    remote_timeouts: int


@dataclasses.dataclass(frozen=True)
class CcacheRecord:
    omit_if_none: ClassVar[tuple[str, ...]] = ("remote",)

    hits: int
    misses: int
    hit_rate: float
    remote: Optional[CcacheRemoteRecord] = None


@dataclasses.dataclass(frozen=True)
class RoundRecord:
    """One allocation of a build carried across walltimes (profile key job_rounds)."""

    round: int
    job: str
    started: str
    seconds: float
    ninja_steps: int
    ended: str  # finished | limit | failed | cancelled


@dataclasses.dataclass(frozen=True)
class EfficiencyRecord:
    """How close the build came to its cores' limit (builder/bound.py): the lower bound of its ninja
    part on `jobs` jobs (the larger of the work over the jobs and the longest dependency chain),
    and the ninja and whole-build wall times over it."""

    jobs: int
    bound_s: float
    work_s: float
    chain_s: float
    limited_by: str
    ninja_wall_s: float
    build_wall_s: float
    runs: int = 1  # a build cut off and run again: the walls are the sums over its runs

    @property
    def ratio(self) -> float:
        return self.build_wall_s / self.bound_s if self.bound_s > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class ReportRecord:
    """File names (in the log directory) of the compile report, and the build's efficiency."""

    text: str
    png: Optional[str] = None
    trace: Optional[str] = None  # Chrome trace (Perfetto)
    efficiency: Optional[EfficiencyRecord] = None
    # the units with the highest peak memory the build measured (builder/unitpeak.py) and their times
    heaviest: Optional[tuple[Canary, ...]] = None
    omit_if_none: ClassVar[tuple[str, ...]] = ("efficiency", "heaviest")  # earlier manifests keep their bytes


@dataclasses.dataclass(frozen=True)
class WheelRecord:
    name: str
    sha256: str
    size: int

    def __post_init__(self) -> None:
        # manifest.diff opens the wheel beside the manifest by this name: a bare file name only
        if self.name in ("", ".", "..") or "/" in self.name or "\0" in self.name:
            raise ManifestError(f"wheel name {printable(self.name)!r} is not a file name (it would name another file)")

    @classmethod
    def of(cls, wheel: Path) -> WheelRecord:
        from torchbuild.core.safeio import sha256_file

        with named_os_errors(wheel, "reading the wheel for its manifest"):
            return cls(name=wheel.name, sha256=sha256_file(wheel), size=wheel.stat().st_size)


@dataclasses.dataclass(frozen=True)
class Canary:
    file: str
    seconds: float
    peak_rss_bytes: int


@dataclasses.dataclass(frozen=True)
class PreflightRecord:
    targets: tuple[str, ...] = ()
    canaries: tuple[Canary, ...] = ()
    configure_s: Optional[float] = None
    targets_s: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class CommsNcclRecord:
    version: str  # nccl_version, e.g. 2.21.5-1
    version_code: int  # ncclGetVersion() of the built library
    sha256: str  # of the source archive (or the tree's files)
    gencode: str  # NVCC_GENCODE it was built with
    library: str  # lib/libnccl.so.2.x.y, relative to the prefix


@dataclasses.dataclass(frozen=True)
class CommsPluginRecord:
    version: str  # aws_ofi_nccl_version
    sha256: str
    libfabric_prefix: str
    libfabric_version: str  # from rdma/fabric.h
    library: str  # lib/libnccl-net*.so, relative to the prefix
    symbols: tuple[str, ...]  # the ncclNetPlugin_v* it exports


@dataclasses.dataclass(frozen=True)
class CommsRecord:
    """The NCCL torch was linked to and the network plugin, as `invoke comms` built them."""

    omit_if_none: ClassVar[tuple[str, ...]] = ("nccl", "plugin")

    prefix: str  # <cache_dir>/comms/<versions>-<key> on the host
    key: str
    nccl: Optional[CommsNcclRecord] = None
    plugin: Optional[CommsPluginRecord] = None


@dataclasses.dataclass(frozen=True)
class CompanionRecord:
    """A companion library's wheel (torchvision, torchaudio, torchtext): what it was built against."""

    name: str
    version: str  # BUILD_VERSION: its version.txt with torch's local part
    torch_wheel: WheelRecord  # the torch wheel it was compiled against and checked beside
    torch_version: str  # PYTORCH_VERSION: the torch its Requires-Dist pins
    check: str  # the operator of its extension that ran, and what it returned


@dataclasses.dataclass(frozen=True)
class ReproRecord:
    """What makes the wheel's bytes a function of its inputs (repro.py)."""

    source_date_epoch: int  # the wheel's timestamps and the compiler's __DATE__/__TIME__
    origin: str  # where that time came from: "commit 1a2b...", "archive x.tar.xz", "env"...
    ccache_basedir: str = ""  # compiles saw paths relative to it (CCACHE_BASEDIR)
    python: str = ""  # the interpreter's X.Y the wheel was built with
    normalized: bool = False  # the zip was rewritten into canonical form (False: it already was)


@dataclasses.dataclass(frozen=True)
class PackagesRecord:
    """What the toolchain image had installed (its /opt/torchbuild/installed.txt): every dpkg
    package and each venv's pip packages with their versions."""

    sha256: str  # of the canonical list (installed.installed_digest)
    file: str  # the list's copy, a file name in <out>/logs
    dpkg: int  # how many Debian packages
    pip: int  # how many pip packages, over every venv


@dataclasses.dataclass(frozen=True)
class BuildVenvRecord:
    """The venv a native build ran in (builder/buildenv.py, profile key build_venv)."""

    key: str  # <cache_dir>/buildenv/<key>: what decided its contents, hashed
    created: bool  # made by this build (False: reused)
    seconds: float  # making (or finding) it
    cmake: str = ""  # the versions pip installed there
    ninja: str = ""
    mkl: str = ""  # with blas mkl on x86_64


@dataclasses.dataclass(frozen=True)
class LibraryRecord:
    """A shared library a wheel's ELF files need that the wheel does not hold."""

    soname: str
    path: str  # where it resolved at build time ("" where it was not found)
    site: bool  # a site library (MPI, NCCL, the OFI plugin, CUDA): never bundled, comes from the site


@dataclasses.dataclass(frozen=True)
class FloorRecord:
    """A wheel's ELF floor (runtime/elffloor.py, measured with auditwheel): the newest glibc,
    libstdc++ (GLIBCXX_) and C++ ABI (CXXABI_) versions its shared objects need ("" for none),
    the libraries it takes from outside, the manylinux policy it earns without bundling, and the
    platform tag it carries."""

    glibc: str = ""
    glibcxx: str = ""
    cxxabi: str = ""
    libraries: tuple[LibraryRecord, ...] = ()
    policy: str = ""  # manylinux_2_31_x86_64; "" when it earns none
    reason: str = ""  # why it earns none, or why it keeps linux_* although it earns one
    tag: str = ""  # the platform tag(s) of the wheel's file name, after tagging
    auditwheel: str = ""  # "auditwheel 6.8.2"

    def summary(self) -> str:
        """One line: `glibc 2.36, GLIBCXX 3.4.30, CXXABI 1.3.13; manylinux_2_36_x86_64`."""
        needs = ", ".join(
            f"{name} {v}"
            for name, v in (("glibc", self.glibc), ("GLIBCXX", self.glibcxx), ("CXXABI", self.cxxabi))
            if v
        )
        return f"{needs or 'no versioned glibc symbol'}; tag {self.tag or '-'}" + (
            f" ({self.reason})" if self.reason else ""
        )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """One build. Field order is the JSON's key order; exactly one of wheel and preflight."""

    # left out of the JSON when None, as before (a native build has no `image` key)
    omit_if_none: ClassVar[tuple[str, ...]] = (
        "source",
        "patches",
        "image",
        "wheel",
        "preflight",
        "comms",
        "companion",
        "reproducibility",
        "packages",
        "build_venv",
        "rounds",
        "floor",
    )

    schema_version: int
    torchbuild_version: str
    kind: str  # wheel | preflight
    run_id: str
    profile: str
    profile_hash: str
    resolved_profile: dict[str, Any]
    engine: str  # native | docker | apptainer
    toolchain: dict[str, str]
    environment: dict[str, str]
    jobs: JobsRecord
    started: str
    finished: str
    duration_s: float
    ccache: CcacheRecord
    log: str  # file name in <out>/logs
    report: Optional[ReportRecord]
    source: Optional[SourceRecord] = None
    patches: Optional[PatchesRecord] = None
    image: Optional[ImageRecord] = None
    wheel: Optional[WheelRecord] = None
    preflight: Optional[PreflightRecord] = None
    comms: Optional[CommsRecord] = None
    companion: Optional[CompanionRecord] = None  # set on a companion library's wheel
    reproducibility: Optional[ReproRecord] = None
    packages: Optional[PackagesRecord] = None  # a build in a toolchain image (schema 5)
    build_venv: Optional[BuildVenvRecord] = None  # a native build in its build venv (schema 6)
    rounds: Optional[tuple[RoundRecord, ...]] = None  # the job rounds that built it (batch/rounds.py)
    floor: Optional[FloorRecord] = None  # the wheel's ELF floor (schema 8)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ManifestError(f"kind: {self.kind!r} is neither of {', '.join(KINDS)}")
        if (self.wheel is None) == (self.preflight is None):
            raise ManifestError("a manifest records exactly one of wheel and preflight")
        if (self.wheel is None) != (self.kind == "preflight"):
            raise ManifestError(f"kind {self.kind!r} does not match the record it carries")
        if self.engine not in ENGINES:
            raise ManifestError(f"engine: {self.engine!r} is none of {', '.join(ENGINES)}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, with today's keys in today's order."""
        return records.to_dict(self)


INSTALL_MANIFEST = "torchbuild-install.json"


@dataclasses.dataclass(frozen=True)
class MpiRecord:
    mpicc: str  # the wrapper mpi4py was compiled with
    mpi4py: str  # its version
    library_version: str  # MPI_Get_library_version() as mpi4py saw it


@dataclasses.dataclass(frozen=True)
class InstallCommsRecord:
    """The NCCL and net plugin of `invoke comms` an install carries (copied from the build
    cache into the environment), and what the check after install saw torch load."""

    source: str  # the comms prefix in the build cache it was copied from
    prefix: str  # where it is now: <install prefix>/comms
    copied: bool  # True: the install does not need the build cache any more
    key: str
    ld_library_path: tuple[str, ...]  # put first on LD_LIBRARY_PATH, in this order
    net_plugin: str  # NCCL_NET_PLUGIN ("" without a plugin)
    nccl_loaded: str  # the libnccl torch mapped after `import torch` ("" when no NCCL was built)
    plugin_symbols: tuple[str, ...]  # the ncclNetPlugin_v* that resolved in the plugin NCCL opens


@dataclasses.dataclass(frozen=True)
class PackageInstallRecord:
    """A runtime_packages entry with its own pip options, as `invoke install` installed it."""

    requirement: str
    pip_args: tuple[str, ...]
    env: dict[str, str]  # the variables its pip install ran with (besides the install's own)
    check: tuple[str, ...]  # the argv run in the environment afterwards; () for none
    check_output: str  # the check's output (its last lines)


@dataclasses.dataclass(frozen=True)
class InstallManifest:
    """One install environment (`invoke install`), written beside it as torchbuild-install.json."""

    # left out when at their default, as an install without them was written before they existed
    omit_if_none: ClassVar[tuple[str, ...]] = ("comms", "packages", "system_site_packages")

    schema_version: int
    torchbuild_version: str
    run_id: str
    profile: str
    profile_hash: str
    engine: str  # where the environment was made (and runs): native | docker | apptainer
    prefix: str
    python: str  # the interpreter the venv runs on (its sys._base_executable, not a shim on PATH)
    python_version: str
    started: str
    finished: str
    duration_s: float
    wheels: tuple[WheelRecord, ...]
    runtime_env: dict[str, str]
    runtime_packages: tuple[str, ...]
    runtime_modules: tuple[str, ...]
    mpi: Optional[MpiRecord]
    module: str  # name/version
    modulefiles: tuple[str, ...]  # relative to prefix
    frozen: tuple[str, ...]  # pip freeze --all
    size_bytes: int
    kind: str = "install"
    comms: Optional[InstallCommsRecord] = None  # the comms stack the wheel was built with, when it was
    # runtime_packages entries with their own pip options, in the order they were installed
    packages: tuple[PackageInstallRecord, ...] = ()
    system_site_packages: bool = False  # the venv extends its interpreter's packages

    def to_dict(self) -> dict[str, Any]:
        return records.to_dict(self)


def write_install(manifest: InstallManifest, path: Path) -> Path:
    return write(manifest, path)


def read_install(path: Path) -> InstallManifest:
    """The install manifest in path; PathError or ManifestError as read() gives them."""
    data = _read_json(path)
    try:
        schema_of(data)
        if data.get("kind") != "install":
            raise ManifestError("not an install manifest (kind is not install)")
        return records.from_dict(InstallManifest, data, "install manifest", ManifestError, hint=READ_HINT)
    except ManifestError as err:
        raise ManifestError(f"{path}: {err.message}", hint=err.hint) from None


# --------------------------------------------------------------------------- plain data <-> records


def _omitting_none(cls: type[Any]) -> Any:
    """cattrs' unstructure hook for cls, leaving out its `omit_if_none` fields when None (their
    default), as the manifest always has: a native build has no `image` key."""
    omit: dict[str, Any] = {name: override(omit_if_default=True) for name in cls.omit_if_none}
    return make_dict_unstructure_fn(cls, records.converter, **omit)


_structure_image_record = records.converter.get_structure_hook(ImageRecord)


def _structure_image(data: Any, cls: type[ImageRecord]) -> ImageRecord:
    """The image record under its keys of today. Hand-written (a migration, not a conversion):
    a SIF manifest before schema 1 says `image_id` where today's says `id`."""
    if isinstance(data, Mapping):
        data = {ImageRecord.aliases.get(k, k): v for k, v in data.items()}
    record: ImageRecord = _structure_image_record(data, cls)
    return record


for _cls in (
    CcacheRecord,
    CommsRecord,
    ReportRecord,
    Manifest,
    InstallManifest,
):  # the records first: Manifest's hook takes the hook of its fields
    records.converter.register_unstructure_hook(_cls, _omitting_none(_cls))
records.converter.register_structure_hook(ImageRecord, _structure_image)


def schema_of(data: Any) -> int:
    """The schema version of parsed JSON; ManifestError when it is not a torchbuild manifest or
    comes from a newer torchbuild than this one."""
    if not isinstance(data, dict) or "torchbuild_version" not in data or "run_id" not in data:
        raise ManifestError("not a torchbuild manifest (no torchbuild_version and run_id)")
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ManifestError(f"schema_version {json.dumps(version)} is not a version number")
    if version > SCHEMA_VERSION:
        raise ManifestError(
            f"written by torchbuild {data['torchbuild_version']} with manifest schema {version}; "
            f"this torchbuild ({__version__}) reads schema {SCHEMA_VERSION} and older",
            hint="upgrade torchbuild (pip install -U torchbuild) to read it",
        )
    return version


def from_dict(data: Any) -> Manifest:
    """A Manifest from parsed JSON (any schema this torchbuild reads); ManifestError otherwise."""
    version = schema_of(data)
    return _structure({**data, "schema_version": version})


def _structure(data: Mapping[str, Any]) -> Manifest:
    return records.from_dict(Manifest, data, "manifest", ManifestError, hint=READ_HINT)


def for_build(
    spec: BuildSpec,
    *,
    run_id: str,
    provenance: Mapping[str, Any],
    toolchain: Mapping[str, str],
    environment: Mapping[str, str],
    jobs: Mapping[str, Any],
    started: str,
    finished: str,
    seconds: float,
    ccache: tuple[int, int, float],
    log: str,
    report: Mapping[str, Any] | None,
    wheel: Path | None = None,
    preflight: Mapping[str, Any] | None = None,
    companion: Mapping[str, Any] | None = None,
    reproducibility: Mapping[str, Any] | None = None,
    ccache_remote: Mapping[str, Any] | None = None,
    floor: FloorRecord | None = None,
) -> Manifest:
    """The manifest of a build that just finished, from what the build knows.

    provenance: {"source": SourceInfo.to_dict(), "patches": {...}, "image": {...}, "engine": ...}
    (each key optional; engine defaults to native); jobs: {"max_jobs", "final_jobs", "reason",
    "nvcc_threads", "retries": [retry dicts]}; wheel: the finished wheel (name, sha256 and size
    are read here); preflight: {"targets", "canaries": [{"file", "seconds", "peak_rss_bytes"}],
    "configure_s", "targets_s"}. Exactly one of wheel and preflight. ccache_remote: the
    CcacheRemoteRecord's fields, when the profile has a ccache_remote; floor: the wheel's ELF floor."""
    data: dict[str, Any] = {
        **_identity(spec, run_id, kind="wheel" if wheel is not None else "preflight"),
        "engine": "native",
        **provenance,
        "toolchain": dict(toolchain),
        "environment": dict(environment),
        "jobs": dict(jobs),
        "started": started,
        "finished": finished,
        "duration_s": round(seconds, 1),
        "ccache": _ccache_record(ccache, ccache_remote),
        "log": log,
        **_results(report, wheel, preflight, companion=companion, reproducibility=reproducibility, floor=floor),
    }
    return _structure(data)


def _identity(spec: BuildSpec, run_id: str, *, kind: str) -> dict[str, Any]:
    """for_build's first keys: the schema, this torchbuild, the kind, the run and the resolved profile."""
    return {
        "schema_version": SCHEMA_VERSION,
        "torchbuild_version": __version__,
        "kind": kind,
        "run_id": run_id,
        "profile": spec.profile,
        "profile_hash": spec.hash,
        "resolved_profile": spec.to_dict(),
    }


def _ccache_record(ccache: tuple[int, int, float], remote: Mapping[str, Any] | None) -> dict[str, Any]:
    """for_build's ccache record: hits, misses, hit rate (ccache's tuple) and the remote's fields, when there is one."""
    return {
        "hits": ccache[0],
        "misses": ccache[1],
        "hit_rate": round(ccache[2], 4),
        **({"remote": dict(remote)} if remote else {}),
    }


def _results(
    report: Mapping[str, Any] | None,
    wheel: Path | None,
    preflight: Mapping[str, Any] | None,
    *,
    companion: Mapping[str, Any] | None,
    reproducibility: Mapping[str, Any] | None,
    floor: FloorRecord | None,
) -> dict[str, Any]:
    """for_build's last keys: the report, the wheel (read here) or the preflight, and the optional records."""
    return {
        "report": dict(report) if report else None,
        "wheel": records.to_dict(WheelRecord.of(wheel)) if wheel is not None else None,
        "preflight": dict(preflight) if preflight is not None else None,
        **({"companion": dict(companion)} if companion is not None else {}),
        **({"reproducibility": dict(reproducibility)} if reproducibility is not None else {}),
        **({"floor": records.to_dict(floor)} if floor is not None else {}),
    }


# --------------------------------------------------------------------------- files


def installed_packages(logs_dir: Path, name: str, source: Path | None = None) -> dict[str, Any]:
    """In a toolchain image: copy its installed list (source, default INSTALLED_LIST) into
    logs_dir as name and return {"packages": {...}} for the manifest (for_build's provenance);
    {} where there is no list (a native build, an image from before schema 5)."""
    source = Path(INSTALLED_LIST) if source is None else source
    try:
        text = source.read_text(encoding="utf-8")
    except OSError:
        return {}
    lines = canonical_list(text.splitlines())
    with named_os_errors(logs_dir, "copying the image's installed list beside the log"):
        (Path(logs_dir) / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return {
        "packages": {
            "sha256": installed_digest(lines),
            "file": name,
            "dpkg": sum(line.startswith("dpkg ") for line in lines),
            "pip": sum(line.startswith("pip ") for line in lines),
        }
    }


def manifest_path(out_dir: Path, wheel_name: str | None, profile: str, run_id: str) -> Path:
    """`<wheel>.manifest.json` next to the wheel, or `preflight-<profile>-<run_id>.manifest.json`."""
    name = wheel_name if wheel_name is not None else f"preflight-{profile}-{run_id}"
    return Path(out_dir) / f"{name}{SUFFIX}"


def write(manifest: Manifest | InstallManifest, path: Path) -> Path:
    """Write manifest to path atomically (a temporary name in the same directory, then a
    rename): a reader never sees half a manifest, and a failure leaves nothing behind."""
    path = Path(path)
    write_json(path, manifest.to_dict(), "writing the manifest")
    return path


def write_json(path: Path, data: Mapping[str, Any], what: str) -> Path:
    """One JSON record torchbuild writes (a manifest, `<wheel>.verify.json`, torchbuild-comms.json),
    atomically (atomic.atomic_write_text): a reader, or a resume that takes the file as a marker,
    never sees half of one, and a failure leaves the old file as it was. OSError: the named error."""
    # a record is read by others (a wheel's manifest is published with it): no URL's credentials
    atomic_write_text(path, redact(json.dumps(data, indent=2)) + "\n", what=what)
    return Path(path)


def read(path: Path) -> Manifest:
    """The manifest in path: PathError when it cannot be read, ManifestError when it is not
    JSON, not a torchbuild manifest, or from a newer torchbuild."""
    data = _read_json(path)
    try:
        return from_dict(data)
    except ManifestError as err:
        raise ManifestError(f"{path}: {err.message}", hint=err.hint) from None


def _read_json(path: Path) -> Any:
    """The JSON in path, read through safeio: at most MANIFEST_LIMIT bytes of a regular file
    (not /dev/zero, a FIFO or a directory: PathError), strict JSON (no NaN, no nesting deeper
    than safeio.JSON_DEPTH, no number of thousands of digits: ManifestError)."""
    path = Path(path)
    try:
        raw = read_bytes(path, MANIFEST_LIMIT, "reading the manifest")
    except PathError as err:  # missing, a directory, a device, too large, unreadable
        raise type(err)(err.message, hint=READ_HINT) from err.__cause__
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not a manifest (not UTF-8 text)") from None
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(
            f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); truncated?"
        ) from None
    except ValueError as exc:  # safeio's refusals: too deep, too long a number, NaN
        raise ManifestError(f"{path}: not a manifest torchbuild wrote ({exc})") from None


def mentions(path: Path, text: str) -> bool:
    """Whether the manifest file path holds text (a cheap look before parsing it), read up to
    MANIFEST_LIMIT bytes like every manifest: PathError for a larger file, a device or a FIFO."""
    return text.encode() in read_bytes(path, MANIFEST_LIMIT, "reading the manifest")


def find_run(out_dir: Path, run_id: str) -> tuple[Manifest, Path]:
    """The manifest that run run_id wrote in out_dir (the host's view of a container's build)."""
    out_dir = Path(out_dir)
    with named_os_errors(out_dir, "looking for the build's manifest"):
        candidates = sorted(out_dir.glob(f"*{SUFFIX}"))
    for path in candidates:
        if not mentions(path, run_id):
            continue  # another run's; not parsed
        manifest = read(path)
        if manifest.run_id == run_id:
            return manifest, path
    raise BuildFailed(f"the build finished but wrote no manifest for run {run_id} in {out_dir}")


# --------------------------------------------------------------------------- diff


@dataclasses.dataclass(frozen=True)
class Difference:
    path: str  # dotted: resolved_profile.cxxflags, environment.CXXFLAGS, jobs.retries[0].jobs
    a: Any  # ABSENT when only b has it
    b: Any


ABSENT = "(absent)"

# fields that differ between any two runs, compared only with --all ([] stands for any index)
PER_RUN = (
    "run_id",
    "started",
    "finished",
    "duration_s",
    "log",
    "report",
    "preflight.configure_s",
    "preflight.targets_s",
    "preflight.canaries[].seconds",
    "jobs.retries[].seconds",
    "packages.file",
)


def flatten(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) for every leaf; lists of scalars are one value, lists of objects
    are entered by index."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list) and any(isinstance(v, (dict, list)) for v in data):
        for i, value in enumerate(data):
            yield from flatten(value, f"{prefix}[{i}]")
    else:
        yield prefix, data


def per_run(path: str) -> bool:
    generic = re.sub(r"\[\d+\]", "[]", path)
    return any(generic == p or generic.startswith(f"{p}.") or generic.startswith(f"{p}[") for p in PER_RUN)


def diff(a: Manifest, b: Manifest, *, everything: bool = False) -> list[Difference]:
    """The fields that differ between two manifests, in a's order then b's extra ones; the
    fields that differ between any two runs (PER_RUN) only when everything is true."""
    fa, fb = dict(flatten(a.to_dict())), dict(flatten(b.to_dict()))
    paths = list(fa) + [p for p in fb if p not in fa]
    return [
        Difference(p, fa.get(p, ABSENT), fb.get(p, ABSENT))
        for p in paths
        if fa.get(p, ABSENT) != fb.get(p, ABSENT) and (everything or not per_run(p))
    ]


# --------------------------------------------------------------------------- text for people


def _text(value: Any) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value)


def _facts(title: str, rows: Sequence[tuple[str, Any]]) -> str:
    return table(("field", "value"), [(k, _text(v)) for k, v in rows], title=title, header=False)


def _build_rows(m: Manifest) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [
        ("kind", m.kind),
        ("run id", m.run_id),
        ("torchbuild", f"{m.torchbuild_version} (manifest schema {m.schema_version})"),
        ("profile", f"{m.profile} (sha256 {m.profile_hash})"),
        ("engine", m.engine),
        ("started", m.started),
        ("finished", m.finished),
        ("duration", f"{m.duration_s:.1f} s"),
        ("log", m.log),
    ]
    if m.report is not None:
        rows += [(f"report {k}", v) for k, v in records.to_dict(m.report).items() if v and k != "efficiency"]
        e = m.report.efficiency
        if e is not None:
            rows.append(
                (
                    "efficiency",
                    f"wall {e.build_wall_s:.0f} s = {e.ratio:.2f} x the bound {e.bound_s:.0f} s on {e.jobs} jobs "
                    f"(limited by {e.limited_by}; ninja {e.ninja_wall_s:.0f} s)",
                )
            )
    return rows


def _source_rows(m: Manifest) -> list[tuple[str, Any]]:
    s = m.source
    if s is None:
        return [("source", "not recorded")]
    rows: list[tuple[str, Any]] = [(k, v) for k, v in records.to_dict(s).items() if k != "submodules" and v != ""]
    return rows + [(f"submodule {sm.path}", sm.commit) for sm in s.submodules]


def _patches_tables(m: Manifest) -> list[str]:
    p = m.patches
    if p is None or p.series is None:
        return [_facts("patches", [("series", "none for this version" if p else "not recorded")])]
    state = {**dict.fromkeys(p.already_applied, "already in the tree"), **dict.fromkeys(p.applied_now, "applied")}
    return [
        _facts("patches", [("series", p.series), ("series sha256", p.checksum)]),
        table(("patch", "sha256", "state"), [(x.name, x.sha256, state.get(x.name, "-")) for x in p.patches]),
    ]


def _image_rows(m: Manifest) -> list[tuple[str, Any]]:
    i = m.image
    if i is None:
        return [("image", "none (native build)")]
    rows: list[tuple[str, Any]] = [("tag", i.tag), ("id", i.id), ("sif", i.sif), ("profile hash", i.profile_hash)]
    if m.packages is not None:
        p = m.packages
        rows.append(("installed packages", f"sha256 {p.sha256} ({p.dpkg} dpkg, {p.pip} pip; logs/{p.file})"))
    return [r for r in rows if r[1] is not None] + [(f"input {k}", v) for k, v in sorted(i.inputs.items())]


def _result_tables(m: Manifest) -> list[str]:
    if m.wheel is not None:
        w = m.wheel
        return [_facts("wheel", [("name", w.name), ("sha256", w.sha256), ("size", f"{w.size} bytes")])]
    p = m.preflight
    assert p is not None
    out = [
        _facts(
            "preflight",
            [("targets", " ".join(p.targets)), ("configure", p.configure_s), ("targets built in", p.targets_s)],
        )
    ]
    if p.canaries:
        out.append(
            table(
                ("canary", "seconds", "peak RSS"),
                [(c.file, f"{c.seconds:.2f}", f"{c.peak_rss_bytes / 2**20:.0f} MiB") for c in p.canaries],
                justify=("left", "right", "right"),
            )
        )
    return out


def _remote_rows(r: CcacheRemoteRecord | None) -> list[tuple[str, Any]]:
    """The remote compile cache's rows of the jobs table (none without one)."""
    if r is None:
        return []
    failed = f", {r.remote_errors} errors, {r.remote_timeouts} timeouts" if r.remote_errors or r.remote_timeouts else ""
    return [
        ("ccache remote", r.url + (" (read-only)" if r.read_only else "")),
        ("hits local/remote", f"{r.local_hits} / {r.remote_hits} ({r.remote_misses} remote misses{failed})"),
    ]


def _jobs_tables(m: Manifest) -> list[str]:
    j, c = m.jobs, m.ccache
    out = [
        _facts(
            "jobs and ccache",
            [
                ("jobs", j.max_jobs if j.final_jobs == j.max_jobs else f"{j.max_jobs} -> {j.final_jobs}"),
                ("reason", j.reason),
                ("nvcc threads", j.nvcc_threads or "nvcc's default"),
                ("OOM retries", len(j.retries)),
                ("ccache", f"{c.hit_rate:.0%} ({c.hits} hits, {c.misses} misses)"),
                *_remote_rows(c.remote),
            ],
        )
    ]
    if j.retries:
        out.append(
            table(
                ("step", "jobs", "next", "evidence", "peak RSS", "seconds"),
                [
                    (r.step, r.jobs, r.next_jobs, r.evidence, f"{r.peak_rss_bytes / 2**30:.2f} GiB", r.seconds)
                    for r in j.retries
                ],
                justify=("left", "right", "right", "left", "right", "right"),
            )
        )
    return out


def show(m: Manifest) -> str:
    """One build as tables: what it was, its source and patches, every profile key, the image
    and its inputs, tool versions, environment, the result, jobs and ccache."""
    parts = [
        _facts("build", _build_rows(m)),
        _facts("source", _source_rows(m)),
        *_patches_tables(m),
        table(("key", "value"), [(k, _text(v)) for k, v in m.resolved_profile.items()], title="resolved profile"),
        _facts("image", _image_rows(m)),
        table(("tool", "version"), sorted(m.toolchain.items()), title="toolchain"),
        table(("variable", "value"), sorted(m.environment.items()), title="environment"),
        *_result_tables(m),
        *_jobs_tables(m),
        *_rounds_tables(m),
        *(floor_tables(m.floor) if m.wheel is not None else []),
    ]
    return "\n\n".join(parts)


def floor_tables(f: FloorRecord | None) -> list[str]:
    """The wheel's ELF floor (what its shared objects need of glibc and libstdc++, its tag and the
    libraries it takes from outside), as `manifest.show` and `verify` print it."""
    if f is None:
        return [_facts("ELF floor", [("floor", "not recorded (a manifest before schema 8)")])]
    rows: list[tuple[str, Any]] = [
        ("glibc", f.glibc or "none"),
        ("libstdc++ (GLIBCXX)", f.glibcxx or "none"),
        ("C++ ABI (CXXABI)", f.cxxabi or "none"),
        ("earns", f.policy or "no manylinux tag"),
        ("tag", f.tag or "-"),
        *([("why", f.reason)] if f.reason else []),
        ("measured by", f.auditwheel),
    ]
    out = [_facts("ELF floor", rows)]
    if f.libraries:
        out.append(
            table(
                ("library", "found at build time", "from"),
                [(r.soname, r.path or "not found", "the site" if r.site else "the system") for r in f.libraries],
                title="libraries from outside the wheel",
            )
        )
    return out


def _rounds_tables(m: Manifest) -> list[str]:
    """The job rounds that carried the build across walltimes, one row each."""
    if not m.rounds:
        return []
    rows = [(r.round, r.job, r.started, f"{r.seconds:.0f} s", r.ninja_steps, r.ended) for r in m.rounds]
    return [
        table(
            ("round", "job", "started", "ran", "ninja steps", "ended"),
            rows,
            title="job rounds",
            justify=("right", "left", "left", "right", "right", "left"),
        )
    ]


def show_diff(differences: Sequence[Difference], a: Path, b: Path, *, everything: bool = False) -> str:
    """The differences as a table (field, A, B), or "identical"."""
    if not differences:
        return "identical" if everything else f"identical (not compared: {', '.join(PER_RUN)}; --all compares them)"
    rows = [(d.path, _text(d.a), _text(d.b)) for d in differences]
    n = len(differences)
    return (
        f"A: {printable(a)}\nB: {printable(b)}\n"
        + table(("field", "A", "B"), rows)
        + f"\n{n} field{'s' if n > 1 else ''} differ{'' if n > 1 else 's'}"
        + ("" if everything else " (per-run fields not compared; --all compares them)")
    )
