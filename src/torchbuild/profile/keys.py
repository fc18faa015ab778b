"""The profile's keys: each declared once, here, with its type, default, doc, checks and scope,
in one group per feature (what to build, the toolchain image, CUDA, ... the batch job, after the
build). BuildSpec (config.py) is made of these groups, so a key's typed field, its JSON Schema
(configs/profile.schema.json), configs/defaults.yaml, the docs' key reference, `invoke config
--keys` and the task flags that set it (`invoke submit --account`) all derive from its one
`key(...)` line. A new key is that line in its group; tests/unit/profile/test_config_schema.py fails,
naming the command, until the two generated files are written again:

    python -m torchbuild.profile.keys > configs/defaults.yaml
    python -m torchbuild.profile.config > configs/profile.schema.json

Kept as dataclass fields with metadata rather than a settings library's models (pydantic,
attrs validators): the checks are a JSON Schema (jsonschema) and the rules between keys, both
in config.py, and a frozen dataclass is what every step already takes and cattrs structures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union

import yaml

from torchbuild.core.arch import Arch

StrMap = Mapping[str, str]

SCOPES = ("build", "job", "runtime")
TYPES = ("str", "int", "bool", "number", "list", "requirements", "packages", "map", "jobs", "cuda_arch_list")
# a key's type where its annotation says it (the others name theirs: key(..., type=...))
_TYPE_OF = {"str": "str", "Arch": "str", "int": "int", "bool": "bool", "float": "number", "tuple[str, ...]": "list"}
_TYPE_OF["StrMap"] = "map"


@dataclasses.dataclass(frozen=True)
class KeySpec:
    name: str
    type: str
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    key_pattern: str | None = None
    # int, number and jobs keys: the range a value must lie in (a typo of 10^23 jobs, or .inf
    # GiB per job, is named here, not an OverflowError in the planner)
    minimum: float | None = None
    maximum: float | None = None
    # a host path (or a list or map of them): ~user must name a user of this host
    path: bool = False
    # build: decides what is built (hashed); job: how a batch job asks for a node; runtime: how
    # the built torch is installed and run (runtime environment, packages, modules, host MPI)
    scope: str = "build"
    # the help of the task flag of the same name that sets this key (`invoke submit --account`:
    # a --set of it); "" for none. Tasks take these flags from here (flag_keys): a text flag
    # through their keys parameter (runtime/flags.py), a bool key's switch as a model's
    # key_option field (submit's --module-purge, in JobHow).
    flag: str = ""


def key(
    default: Any,
    doc: str,
    *,
    type: str = "",
    choices: Sequence[str] = (),
    pattern: str | None = None,
    key_pattern: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    path: bool = False,
    scope: str = "build",
    flag: str = "",
) -> Any:
    """A profile key: a field of its group whose metadata is the key's declaration. default is
    the value as a profile writes it (a list, a mapping); resolve checks and freezes it."""
    decl = {"default": default, "doc": doc, "type": type, "choices": tuple(choices), "pattern": pattern}
    decl.update(key_pattern=key_pattern, minimum=minimum, maximum=maximum, path=path, scope=scope, flag=flag)
    return dataclasses.field(metadata={"key": decl})


@dataclasses.dataclass(frozen=True)
class RuntimePackage:
    """A runtime_packages entry written as a mapping: a requirement installed on its own, with
    its pip options (PIP_OPTIONS' allow-list) and variables, then check run in the environment."""

    requirement: str
    pip_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # (name, value) pairs, in the profile's order
    check: tuple[str, ...] = ()  # argv, no shell; empty: no check

    @property
    def environ(self) -> dict[str, str]:
        return dict(self.env)

    def as_data(self) -> dict[str, Any]:
        """The entry as a profile writes it (only the fields it sets besides requirement)."""
        data: dict[str, Any] = {"requirement": self.requirement}
        if self.pip_args:
            data["pip_args"] = list(self.pip_args)
        if self.env:
            data["env"] = dict(self.env)
        if self.check:
            data["check"] = list(self.check)
        return data


PackageEntry = Union[str, RuntimePackage]


# --------------------------------------------------------------------------- the keys


@dataclasses.dataclass(frozen=True)
class Named:
    """The profile's name (its file's stem), first in a BuildSpec; no key sets it."""

    profile: str


@dataclasses.dataclass(frozen=True)
class WhatToBuild:
    """What to build"""

    description: str = key(
        "",
        "One line saying what the profile is for; shown by `invoke config`.",
    )
    torch_version: str = key(
        "2.15.0",
        "PyTorch release to build (default: the current release, the newest line torchbuild knows); names the "
        "image tag, PYTORCH_BUILD_VERSION and the patch series.",
        pattern=r"\d+\.\d+(\.\d+)?([a-z0-9.]*)?",
    )
    torch_repo: str = key(
        "https://github.com/pytorch/pytorch.git",
        "Git URL of the PyTorch source (a site mirror works too).",
    )
    torch_ref: str = key(
        "",
        "Git tag, branch or commit to build; empty means v<torch_version>.",
    )
    local_version: str = key(
        "",
        "Local version suffix appended as +<local_version> (e.g. gh200 gives 2.15.0+gh200).",
        pattern="[A-Za-z0-9]+([.][A-Za-z0-9]+)*|",
    )
    patches: str = key(
        "auto",
        "Patch series; auto = patches/pytorch/<torch_version>/, none = no patches, or a directory path.",
        path=True,
    )
    torch_sha256: str = key(
        "",
        (
            "sha256 of the PyTorch source archive (--source a tarball or .dsc), checked before it is unpacked: "
            "an air-gapped site's copy of a release is the one it names; empty: not checked. A git or directory "
            "source with it set is refused (a commit pins those)."
        ),
        pattern="([0-9a-f]{64})?",
    )


@dataclasses.dataclass(frozen=True)
class ToolchainImage:
    """Toolchain image"""

    arch: Arch = key(
        "host",
        "Target CPU architecture; host means the machine running torchbuild.",
        choices=["host", "x86_64", "aarch64"],
    )
    base_image: str = key(
        "ubuntu:24.04",
        "Base image of the toolchain image; any apt-based image (ubuntu, debian, nvidia/cuda devel).",
    )
    glibc_floor: str = key(
        "",
        (
            'Oldest glibc the wheel must run on, as the site\'s OS has it ("2.31": SLES 15 SP4+); empty: none.'
            " Quote it (2.30 unquoted is the number 2.3). Before compiling, the build refuses a toolchain "
            "whose glibc is newer and names a base that fits; `invoke verify` fails a wheel that needs more; "
            "a wheel that meets it and needs no library outside the manylinux whitelist but the site's (MPI, "
            "NCCL, the OFI plugin, CUDA) is tagged with the manylinux_2_X it earns. Every manifest records "
            "the wheel's floor, with or without this key."
        ),
        pattern=r"2\.[0-9]{1,3}|",
    )
    libstdcxx_floor: str = key(
        "",
        (
            'Oldest libstdc++ the wheel must run with, as its GLIBCXX_ symbol version ("3.4.28" is GCC 10\'s, '
            '"3.4.30" GCC 12\'s); empty: not checked, for a site whose GCC module brings its own libstdc++ at '
            "run time. Checked as glibc_floor is: the toolchain's libstdc++ before compiling, the wheel's "
            "needs in `invoke verify`."
        ),
        pattern=r"3\.4\.[0-9]{1,3}|",
    )
    python_version: str = key(
        "3.12",
        ("Python the wheel is built for; python<version>, -dev and -venv must be installable with apt in the base."),
        pattern=r"3\.\d+",
    )
    python_versions: tuple[str, ...] = key(
        [],
        (
            "More Pythons the image provides (each with the same python_packages, in /opt/venv-<version>); "
            "`invoke build --python 3.13,3.14` builds one wheel per version from one tree and ccache. "
            "python_version is always provided."
        ),
        pattern=r"3\.\d+",
    )
    python_sources: StrMap = key(
        {},
        (
            "Where the image gets a Python its base's apt archive lacks (Python 3.12 on a glibc 2.31 base "
            "such as debian bullseye): version -> the CPython source tarball's URL with its sha256, "
            "`URL#sha256=HEX` (python.org's Python-3.12.12.tar.xz, or a mirror of it). The image builds it "
            "into /opt/python<version> (static libpython, as PyTorch's manylinux builders do) and refuses a "
            "download whose sha256 differs. A Python the archive has is taken from apt even when named here."
        ),
        key_pattern=r"3\.[0-9]{1,2}",
    )
    compiler: str = key(
        "gcc",
        "C/C++ compiler family.",
        choices=["gcc", "clang"],
    )
    compiler_version: str = key(
        "",
        "Compiler major version (13 gives gcc-13/g++-13); empty means the base's default compiler.",
        pattern=r"\d+|",
    )
    compilers: StrMap = key(
        {},
        (
            "The compiler executables the build runs, by role (cc, cxx, fc: CC, CXX, FC), e.g. {cc: cc, cxx: "
            "CC, fc: ftn} for Cray's wrappers; each a plain program name found on PATH or an absolute path. A"
            " role left out comes from compiler and compiler_version (FC is then not set). Native builds "
            "only: in the image or the SIF the compiler family's executables run (the image's packages follow"
            " compiler), as a site's wrappers exist on its own nodes."
        ),
        key_pattern="cc|cxx|fc",
    )
    apt_packages: tuple[str, ...] = key(
        [],
        "Extra Debian/Ubuntu packages installed in the toolchain image.",
    )
    python_packages: tuple[str, ...] = key(
        [
            "numpy",
            "pyyaml",
            "setuptools",
            "wheel",
            "scikit-build-core",
            "packaging",
            "typing-extensions",
            "sympy",
            "filelock",
            "networkx",
            "jinja2",
            "fsspec",
            "build",
        ],
        (
            "Python packages installed in the image's build venv (PyTorch's build requirements; scikit-build-core is "
            "the backend of PyTorch main, which has no setup.py since pytorch/pytorch#189758)."
        ),
    )
    python_system_site_packages: bool = key(
        False,
        (
            "Let the image's build venv see the distribution's Python packages (for de-vendored sources built"
            " against apt packages)."
        ),
    )
    ca_certificates: tuple[str, ...] = key(
        [],
        ("PEM CA files (host paths) added to the image's trust store, for sites behind a TLS-inspecting proxy."),
        path=True,
    )
    image_name: str = key(
        "torchbuild/toolchain",
        "Repository part of the toolchain image tag; the tag is <profile>-<torch_version>-<arch>.",
    )
    sif_builder_base: str = key(
        "debian:sid",
        (
            "Base of the apptainer-builder image that `invoke sif` uses on hosts without Apptainer; needs "
            "apptainer in apt (Debian sid)."
        ),
    )
    sif_bootstrap: str = key(
        "docker",
        (
            "Where `invoke sif --from-recipe` (Apptainer alone, no Docker) gets the base system: docker pulls"
            " base_image through a registry (docker://); debootstrap installs a Debian or Ubuntu suite from a"
            " package mirror, for sites without a registry (needs the caller in /etc/subuid, or root)."
        ),
        choices=["docker", "debootstrap"],
    )
    sif_suite: str = key(
        "",
        (
            "debootstrap suite; empty: the one base_image names (debian:trixie or debian:13 gives trixie, "
            "ubuntu:24.04 gives noble, torchbuild/base:trixie-x86_64 gives trixie)."
        ),
        pattern="[a-z]+|",
    )
    sif_mirror: str = key(
        "",
        (
            "debootstrap mirror URL; empty: http://deb.debian.org/debian for Debian suites, "
            "http://archive.ubuntu.com/ubuntu (http://ports.ubuntu.com/ubuntu-ports on aarch64) for Ubuntu "
            "ones."
        ),
        pattern=r"(https?|file)://\S+|",
    )
    sif_components: tuple[str, ...] = key(
        [],
        (
            "Archive components apt uses in a debootstrapped SIF; empty means main contrib non-free (Debian),"
            " main universe (Ubuntu)."
        ),
        pattern="[a-z][a-z0-9-]*",
    )


@dataclasses.dataclass(frozen=True)
class Cuda:
    """CUDA"""

    cuda_version: str = key(
        "",
        "CUDA version (e.g. 12.6); empty builds without CUDA (USE_CUDA=0).",
        pattern=r"\d+\.\d+|",
    )
    cuda_arch_list: tuple[str, ...] = key(
        [],
        ('GPU architectures (TORCH_CUDA_ARCH_LIST), e.g. ["8.0", "9.0"]; suffix a for arch-specific, +PTX for PTX.'),
        type="cuda_arch_list",
    )
    cuda_home: str = key(
        "/usr/local/cuda",
        "CUDA installation prefix inside the image (CUDA_HOME); Debian's packaged toolkit uses /usr.",
    )
    cuda_packages: tuple[str, ...] = key(
        [],
        "Apt packages that provide CUDA in the image; empty when the base image ships CUDA (nvidia/cuda).",
    )
    cuda_flags: tuple[str, ...] = key(
        [],
        "Extra nvcc flags (TORCH_NVCC_FLAGS).",
    )
    nvcc_threads: int = key(
        0,
        (
            "nvcc --threads per compile job; 0 lets the planner choose (cores left over per job while memory "
            "covers them, at most 4)."
        ),
        maximum=64,
    )


@dataclasses.dataclass(frozen=True)
class Libraries:
    """Libraries"""

    blas: str = key(
        "openblas",
        "BLAS/LAPACK implementation (PyTorch's BLAS variable); the image gets its packages.",
        choices=["mkl", "openblas", "nvpl", "blis", "eigen", "generic"],
    )
    mkl_threading: str = key(
        "",
        "MKL threading layer (MKL_THREADING), only with blas mkl; empty leaves PyTorch's default.",
        choices=["", "SEQ", "OMP", "TBB"],
    )
    mpi: str = key(
        "none",
        ("MPI in the image; mpich is ABI-compatible with cray-mpich and Intel MPI; system means provided by the host."),
        choices=["none", "openmpi", "mpich", "system"],
    )
    distributed: tuple[str, ...] = key(
        ["gloo"],
        "Distributed backends to build; empty builds without torch.distributed.",
        choices=["gloo", "nccl", "mpi", "ucc"],
    )
    nccl: str = key(
        "bundled",
        (
            "Where torch's NCCL comes from: bundled (PyTorch's own copy), system (the image's or the site's, "
            "USE_SYSTEM_NCCL=1) or source (built by `invoke comms` from nccl_source for cuda_arch_list only, "
            "then linked)."
        ),
        choices=["bundled", "system", "source"],
    )
    nccl_version: str = key(
        "2.21.5-1",
        "NCCL release built with nccl source, as NVIDIA tags it (v2.21.5-1 is 2.21.5-1).",
        pattern=r"\d+\.\d+\.\d+-\d+",
    )
    nccl_source: str = key(
        "",
        (
            "NCCL source with nccl source: a git URL, a local tree, a tarball (path or https URL) or a Debian"
            " .dsc; empty means NVIDIA's release archive of nccl_version from github.com/NVIDIA/nccl."
        ),
        path=True,
    )
    nccl_sha256: str = key(
        "",
        ("sha256 of the nccl_source tarball (or archive), checked before anything is unpacked; empty checks nothing."),
        pattern="([0-9a-f]{64})?",
    )
    aws_ofi_nccl_version: str = key(
        "",
        (
            "aws-ofi-nccl, NCCL's libfabric network plugin (Slingshot, EFA), built by `invoke comms` against "
            "libfabric_prefix; empty builds no plugin."
        ),
        pattern=r"(\d+\.\d+\.\d+)?",
    )
    aws_ofi_nccl_source: str = key(
        "",
        (
            "The plugin's source: a tarball (path or https URL) or a local tree; empty means the release "
            "archive of aws_ofi_nccl_version from github.com/aws/aws-ofi-nccl, checked against torchbuild's "
            "pinned sha256."
        ),
        path=True,
    )
    aws_ofi_nccl_sha256: str = key(
        "",
        (
            "sha256 of the aws_ofi_nccl_source tarball; empty uses torchbuild's pin for a release archive, "
            "else checks nothing."
        ),
        pattern="([0-9a-f]{64})?",
    )
    aws_ofi_nccl_configure: tuple[str, ...] = key(
        [],
        (
            "More options for the plugin's ./configure (e.g. --enable-trace), after the ones torchbuild "
            "passes (--prefix, --with-libfabric, --with-cuda, --disable-tests, --disable-platform-aws, which "
            "it refuses here); needs aws_ofi_nccl_version."
        ),
        pattern=r"--[a-z][a-z0-9-]*(=[^\s]*)?",
    )
    libfabric_prefix: str = key(
        "",
        (
            "The libfabric the plugin is built against and loads (include/rdma/fabric.h, lib/libfabric.so), "
            "e.g. the site's /opt/cray/libfabric/1.15.2.0; empty means the image's own (Debian's "
            "libfabric-dev under /usr)."
        ),
        pattern="(/[^:,]*)?",
    )


@dataclasses.dataclass(frozen=True)
class Companions:
    """Companion libraries (torchvision, torchaudio, torchtext)"""

    companions: tuple[str, ...] = key(
        [],
        (
            "Domain libraries `invoke build` builds after torch, against the torch just built, with the same "
            "local version; the torch/companion pairs come from torchbuild's companion table (torchtext only "
            "for torch <= 2.3; docs: For PyTorch developers)."
        ),
        choices=["torchvision", "torchaudio", "torchtext"],
    )
    companion_repos: StrMap = key(
        {},
        (
            "Where a companion's source comes from, per library: a git URL (a site mirror), an archive URL or"
            " file, or a local tree; default the library's github.com/pytorch repository."
        ),
        key_pattern="torchvision|torchaudio|torchtext",
        path=True,
    )
    companion_refs: StrMap = key(
        {},
        (
            "The git ref of a companion, per library; default the tag of its line with torch's patch number "
            "(torch 2.6.0: v0.21.0, v2.6.0), main when torch_ref is main."
        ),
        key_pattern="torchvision|torchaudio|torchtext",
    )
    companion_sha256: StrMap = key(
        {},
        "sha256 of a companion's archive (companion_repos), checked before it is unpacked.",
        key_pattern="torchvision|torchaudio|torchtext",
    )
    companion_env: StrMap = key(
        {},
        (
            "Variables for the companions' builds, over torchbuild's defaults (torchaudio BUILD_SOX=0 and "
            "USE_FFMPEG=0: both download third-party code at build time; set them to 1 where that works)."
        ),
        key_pattern="[A-Za-z_][A-Za-z0-9_]*",
    )
    switches: StrMap = key(
        {},
        "USE_*/BUILD_* variables passed to the build as they are; they win over values derived above.",
        key_pattern="(USE|BUILD)_[A-Z0-9_]+",
    )


@dataclasses.dataclass(frozen=True)
class CompilerFlags:
    """Flags"""

    cflags: tuple[str, ...] = key(
        [],
        "Extra C compiler flags (CFLAGS).",
    )
    cxxflags: tuple[str, ...] = key(
        [],
        "Extra C++ compiler flags (CXXFLAGS, the initial CMAKE_CXX_FLAGS).",
    )
    ldflags: tuple[str, ...] = key(
        [],
        "Extra linker flags (LDFLAGS).",
    )
    env: StrMap = key(
        {},
        (
            "Any other environment variables for the build; applied last. ${NAME} in a value is NAME of the "
            "environment the build step runs in (a module's MKLROOT), filled in by torchbuild, not a shell; "
            "unset there, the variable is left out."
        ),
        key_pattern="[A-Za-z_][A-Za-z0-9_]*",
    )


@dataclasses.dataclass(frozen=True)
class Preflight:
    """Preflight"""

    preflight_targets: tuple[str, ...] = key(
        ["c10"],
        "CMake targets `invoke build --preflight` configures and builds before a long build.",
    )
    canaries: tuple[str, ...] = key(
        [],
        (
            "Source files (relative to the tree) preflight compiles alone, timed, because they break first on"
            " this platform."
        ),
    )
    heavy_units: tuple[str, ...] = key(
        [],
        (
            "Globs of memory-heavy source files (relative to the tree; * also crosses /) compiled in a ninja "
            "pool of their own whose depth follows memory (memory / mem_per_heavy_job_gb), while the other "
            "compiles use every core; canaries that measured above mem_per_job_gb join them."
        ),
    )


@dataclasses.dataclass(frozen=True)
class Resources:
    """Resources and caches"""

    max_jobs: Union[str, int] = key(
        "auto",
        (
            "Parallel compile jobs (MAX_JOBS); auto plans from cores and memory. With submit --nodes, a "
            "number caps each node's compiles (its distcc slots)."
        ),
        type="jobs",
        maximum=4096,
    )
    mem_per_job_gb: float = key(
        1.5,
        (
            "Peak memory of one C++ compile job in GiB, used by the auto jobs planner until preflight "
            "canaries measure one."
        ),
        minimum=0.1,
        maximum=4096,
    )
    mem_per_cuda_job_gb: float = key(
        5.0,
        (
            "Peak memory of one CUDA compile job in GiB (flash-attention kernels need about 5), used for CUDA"
            " builds until a .cu canary measures one."
        ),
        minimum=0.1,
        maximum=4096,
    )
    mem_per_heavy_job_gb: float = key(
        4.0,
        "Peak memory of one heavy_units compile in GiB, until a canary among them measures one.",
        minimum=0.1,
        maximum=4096,
    )
    cache_dir: str = key(
        "~/.cache/torchbuild",
        (
            "Host directory for ccache, pip cache, source mirrors, logs and base-image rootfs. Where "
            "XDG_CACHE_HOME is set, the default is $XDG_CACHE_HOME/torchbuild instead (the XDG base directory"
            " rule, through platformdirs)."
        ),
        path=True,
    )
    ccache_size: str = key(
        "20G",
        "ccache size limit (CCACHE_MAXSIZE).",
        pattern=r"\d{1,6}(\.\d{1,3})?[KMGT]?",
    )
    ccache_remote: str = key(
        "",
        (
            "A compile cache shared by a site's builds, behind the local one (ccache >= 4.7 remote storage, "
            "CCACHE_REMOTE_STORAGE): a redis://host[:port][/db] or http(s)://host[:port]/path URL, without "
            "credentials (profiles are recorded in manifests and images). A storage that is down or refuses "
            "writes only slows the build to local-only, with one warning. '' uses the local cache alone. Not "
            "hashed: it does not change what is built."
        ),
        scope="job",
    )
    ccache_remote_readonly: bool = key(
        False,
        (
            "Only read ccache_remote (ccache's read-only attribute): a user's build takes what the site's "
            "builds stored and adds nothing."
        ),
        scope="job",
    )
    build_venv: bool = key(
        True,
        (
            "Natively (--engine native), build in a venv torchbuild makes and reuses under cache_dir/buildenv"
            " (keyed by the Python, the tree's requirements.txt and pyproject.toml, the cmake/ninja/MKL pins,"
            " arch and blas) with cmake and ninja from PyPI, the tree's build requirements and, for blas mkl "
            "on x86_64, mkl-static and mkl-include; false builds with the host's Python and tools as they are"
            " (a site's prepared conda env). Images and SIFs bring their own."
        ),
    )


@dataclasses.dataclass(frozen=True)
class BatchJob:
    """Batch jobs (`invoke submit`)

    scope: job keys say how the job asks for a node, not what is built: they are left out of
    the profile's hash, so the same build submitted with another account is the same build."""

    scheduler: str = key(
        "slurm",
        "Batch system `invoke submit` uses; slurm (sbatch) or pbs (PBS Professional's qsub).",
        choices=["slurm", "pbs"],
        scope="job",
        flag="slurm (sbatch) or pbs (qsub); default: the profile's `scheduler`",
    )
    account: str = key(
        "",
        (
            "Project the job is charged to (sbatch --account, qsub -A); empty takes $SLURM_ACCOUNT or "
            "$PBS_ACCOUNT, else the site's default."
        ),
        pattern="[A-Za-z0-9][A-Za-z0-9_.@+-]*|",
        scope="job",
        flag="project to charge (default: the profile's, else $SLURM_ACCOUNT / $PBS_ACCOUNT)",
    )
    partition: str = key(
        "",
        "Slurm partition (--partition) or PBS queue (-q); empty leaves the site's default.",
        pattern="[A-Za-z0-9][A-Za-z0-9_.,-]*|",
        scope="job",
        flag="Slurm partition or PBS queue (default: the profile's, else the site's)",
    )
    qos: str = key(
        "",
        "Slurm quality of service (--qos); PBS has no QoS (use directives, e.g. -l job_priority=...).",
        pattern="[A-Za-z0-9][A-Za-z0-9_.-]*|",
        scope="job",
        flag="Slurm QoS (default: the profile's)",
    )
    walltime: str = key(
        "04:00:00",
        (
            "Time limit of the job in Slurm's forms: HH:MM:SS, D-HH[:MM[:SS]], MM:SS or minutes (the "
            "Alliance's 0-03:00 is three hours; sbatch --time, qsub -l walltime in HH:MM:SS); a resubmitted "
            "job resumes where it stopped."
        ),
        pattern=r"\d+-\d+(:[0-5]?\d){0,2}|\d+(:[0-5]?\d){0,2}",
        scope="job",
        flag="time limit in Slurm's forms: HH:MM:SS, D-HH[:MM[:SS]], MM:SS, minutes (default: the profile's)",
    )
    job_rounds: int = key(
        0,
        (
            "Allocations a build may take when it outlives one walltime (0: one job, as before). With N > 0 "
            "the job stops the build job_round_warning_s before its walltime, keeps the tree, and goes on in "
            "a new allocation by itself (Slurm: --signal=B:USR1 and scontrol requeue, the same job id; PBS: "
            "its own timer and qsub of the kept script), at most N rounds, each round in the job log and the "
            "manifest; a round that finishes no build step stops the job (NoProgress)."
        ),
        minimum=0,
        maximum=100,
        scope="job",
    )
    job_round_warning_s: int = key(
        600,
        (
            "Seconds before the walltime a job round stops the build (job_rounds > 0); below the walltime, "
            "enough to stop and requeue."
        ),
        minimum=10,
        maximum=86400,
        scope="job",
    )
    cpus: int = key(
        16,
        (
            "Cores the job asks for (sbatch --cpus-per-task, PBS select ncpus); the planner runs its compile "
            "jobs on these."
        ),
        minimum=1,
        maximum=4096,
        scope="job",
        flag="cores per node (default: the profile's `cpus`)",
    )
    mem: str = key(
        "",
        (
            "Memory the job asks for, e.g. 64G (sbatch --mem, PBS select mem); empty leaves the site's "
            "default. The planner keeps under it."
        ),
        pattern=r"[1-9]\d*[KMGT]?|",
        scope="job",
        flag="memory per node, e.g. 64G (default: the profile's `mem`, else the site's)",
    )
    gpus: int = key(
        0,
        (
            "GPUs the job asks for (sbatch --gres=gpu:N, PBS select ngpus); compiling CUDA needs none, only "
            "running it does. With the SIF, N > 0 adds --nv."
        ),
        maximum=64,
        scope="job",
        flag="GPUs per node (default: the profile's `gpus`)",
    )
    gpu_type: str = key(
        "",
        (
            "GPU model the job asks for, e.g. a100 (Slurm --gres=gpu:a100:N, PBS ngpus=N:gpu_type=a100); "
            "empty takes any."
        ),
        pattern="[A-Za-z0-9][A-Za-z0-9_.-]*|",
        scope="job",
        flag="GPU model, e.g. a100 (default: the profile's `gpu_type`)",
    )
    constraint: str = key(
        "",
        (
            "Node features; Slurm --constraint (e.g. avx512), PBS extra resources of the select chunk (e.g. "
            "gpu_type=a100)."
        ),
        pattern=r"[A-Za-z0-9_.,:&|!*=\[\]()-]+|",
        scope="job",
        flag="Slurm --constraint, or PBS select resources name=value[:...] (default: the profile's)",
    )
    reservation: str = key(
        "",
        (
            "Reservation the job runs in, e.g. a training event's or a maintenance window's (sbatch --reservation; "
            "PBS: the reservation's queue, qsub -q R1234.server, in the place of partition); empty: none."
        ),
        pattern="[A-Za-z0-9][A-Za-z0-9_.-]*|",
        scope="job",
    )
    modules: tuple[str, ...] = key(
        [],
        "Environment modules the job loads, in order, before the build (module load NAME ...).",
        pattern="[A-Za-z0-9_][A-Za-z0-9_.+@/-]*",
        scope="job",
    )
    torch_version_modules: StrMap = key(
        {},
        (
            "Environment modules that depend on the torch version: a release line (2.4) or release (2.4.0, "
            "which wins over its line) -> modules, space-separated, added to modules and runtime_modules when"
            ' torch_version is that release (e.g. {"2.3": cudnn/8.8.1.3-12, "2.4": cudnn/9.2.0.82-12}).'
        ),
        key_pattern=r"\d+\.\d+(\.\d+)?",
        scope="job",
    )
    module_purge: bool = key(
        False,
        (
            "Run `module purge` in the job before loading `modules` (sites whose login environment would leak"
            " into the build)."
        ),
        scope="job",
        flag="`module purge` in the job before loading the modules",
    )
    module_purge_force: bool = key(
        False,
        (
            "Purge with `module --force purge` (implies module_purge): sticky modules go too (a Cray site's "
            "ncarenv or PrgEnv), as derecho-pytorch-mpi's config_env.sh purges; `modules` must then load them"
            " again. Lmod's syntax."
        ),
        scope="job",
    )
    job_python: str = key(
        "",
        (
            "The Python a batch job runs torchbuild with: the absolute path of a venv's python holding "
            "torchbuild for the nodes' arch, on a file system they mount, or a name on the node's PATH once "
            "modules are loaded. Empty: the Python running `invoke submit`, which a node of another arch "
            "cannot run (Bede's ppc64le login nodes, aarch64 GH200 nodes): submit then asks for it."
        ),
        pattern="[A-Za-z0-9_][A-Za-z0-9_.+-]*|/[A-Za-z0-9_.+/-]+|",
        scope="job",
    )
    required: StrMap = key(
        {},
        (
            "Keys only the user can fill in, each with what to give, e.g. {cache_dir: a directory of your "
            "project on /work}: `invoke submit` refuses a build job while one is still at its default, with "
            "that text as the hint."
        ),
        key_pattern="[a-z][a-z0-9_]*",
        scope="job",
    )
    unmounted_dirs: tuple[str, ...] = key(
        [],
        (
            "Directories the compute nodes do not mount (ARCHER2: /home): `invoke submit` refuses a job whose"
            " cache_dir, source tree, --out, working directory, run script or wheelhouse, or the Python and "
            "torchbuild it runs, is under one."
        ),
        pattern=r"/[^\n\r]*",
        scope="job",
    )
    export_env: bool = key(
        True,
        (
            "Slurm only; false submits with --export=NONE (on the sbatch command line), so the job starts "
            "from a clean login environment. PBS never exports it."
        ),
        scope="job",
    )
    directives: tuple[str, ...] = key(
        [],
        (
            "Further scheduler directives, one option each, written as they are after #SBATCH or #PBS (e.g. "
            "--reservation=R, -l job_priority=regular)."
        ),
        pattern=r"-[^\n\r]*",
        scope="job",
    )
    launcher: str = key(
        "",
        (
            "How `invoke verify --nodes N` starts its ranks across the job's nodes: srun (Slurm), mpiexec "
            "(MPICH's Hydra, Cray PALS: -n TOTAL -ppn PER_NODE) or mpirun (Open MPI: -np TOTAL --map-by "
            "ppr:PER_NODE:node); empty takes the scheduler's own, srun for slurm, mpiexec for pbs."
        ),
        choices=["", "srun", "mpiexec", "mpirun"],
        scope="job",
    )
    run_job: StrMap = key(
        {},
        (
            "What a `submit --run` job asks for where it is not the build's job, by key (cpus, mem, gpus, "
            "gpu_type, walltime, each as that key takes it), e.g. the Alliance's pytorch-test.sh {cpus: 6, "
            "mem: 32000M, gpus: 1, gpu_type: '', walltime: 0-03:00}; a key left out is the build's. submit's "
            "--cpus, --mem... with --run set these."
        ),
        key_pattern="cpus|mem|gpus|gpu_type|walltime",
        scope="job",
    )


@dataclasses.dataclass(frozen=True)
class AfterTheBuild:
    """After the build (`invoke install`, `invoke wheelhouse`, the SIF's %environment)

    scope: runtime keys say how the built torch is installed and run, not what is built: they
    are left out of the profile's hash too."""

    verify_tests: tuple[str, ...] = key(
        ["test_torch.py", "test_autograd.py", "test_nn.py"],
        (
            "PyTorch's own tests `invoke verify` runs against the wheel after a build (pytest node ids under "
            "the source's test/): tensors, autograd and nn modules by default, what every model uses; a site "
            "with more cores adds test_ops.py::TestCommonCPU and test_linalg.py. [] runs none; a source "
            "without them is a skip."
        ),
        pattern=r"[A-Za-z0-9_./-]+\.py(::[A-Za-z0-9_\[\].-]+)*",
        scope="runtime",
    )
    verify_tests_timeout_s: int = key(
        3600,
        ("Time bound of verify_tests, the whole run; at it pytest is stopped, reports what ran, and the check fails."),
        minimum=60,
        maximum=172800,
        scope="runtime",
    )
    verify_tests_max_failures: int = key(
        0,
        "Failure budget of verify_tests (failures and errors); more fails `invoke verify`.",
        minimum=0,
        maximum=100000,
        scope="runtime",
    )
    verify_tests_skip: StrMap = key(
        {},
        (
            "Tests left out of verify_tests on one arch (a known upstream failure there): arch -> node ids, "
            "space-separated, passed to pytest --deselect and recorded in the verify report."
        ),
        key_pattern="x86_64|aarch64",
        scope="runtime",
    )
    runtime_env: StrMap = key(
        {},
        (
            "Variables the jobs that run torch need (e.g. NCCL_* and FI_* for Slingshot); set by the "
            "install's activate script and modulefiles and by the SIF's %environment, apart from the build's "
            "env. Values are literal."
        ),
        key_pattern="[A-Za-z_][A-Za-z0-9_]*",
        scope="runtime",
    )
    runtime_packages: tuple[PackageEntry, ...] = key(
        [],
        (
            "Pip requirements `invoke install` puts beside torch (e.g. horovod, numpy<2); from the index, or "
            "with --no-index from --find-links only. An entry may be a mapping {requirement, pip_args, env, "
            "check}: installed on its own after mpi4py with those pip options (an allow-list: "
            "--no-build-isolation, --no-cache-dir...) and variables, then check (a command, no shell) run in "
            "the environment; its failure fails the install."
        ),
        type="packages",
        scope="runtime",
    )
    install_python: str = key(
        "",
        (
            "The interpreter `invoke install` makes the venv from, e.g. python3 of a loaded module "
            "(cray-python); its version must be the one the wheels were built for. Empty means python3.X on "
            "PATH for the wheels' cp3X tag. --python wins."
        ),
        pattern="[A-Za-z0-9_][A-Za-z0-9_.+-]*|/[A-Za-z0-9_.+/-]+|",
        scope="runtime",
    )
    install_system_site_packages: bool = key(
        False,
        (
            "Make the install's venv with --system-site-packages, so it extends the interpreter's own "
            "packages (numpy, mpi4py of a site's Python module) as a venv over cray-python does."
        ),
        scope="runtime",
    )
    runtime_modules: tuple[str, ...] = key(
        [],
        (
            "Environment modules a job that runs torch needs; the install's modulefiles load them (Lmod "
            "depends_on, Tcl module load)."
        ),
        pattern="[A-Za-z0-9_][A-Za-z0-9_.+@/-]*",
        scope="runtime",
    )
    mpicc: str = key(
        "",
        (
            "MPI compiler wrapper mpi4py is built with (MPICC), e.g. cc on Cray; empty means mpicc. mpi4py is"
            " built when the profile has MPI (mpi not none) or mpicc is set."
        ),
        pattern="[A-Za-z0-9_./+-]+|",
        scope="runtime",
    )
    host_mpi: tuple[str, ...] = key(
        [],
        (
            "Host directories holding the MPI library (e.g. cray-mpich's lib); bound into the SIF at the same"
            " path and put first on LD_LIBRARY_PATH, so jobs use the host's MPI through its ABI."
        ),
        pattern=r"/[^:,\s]*",
        scope="runtime",
    )


GROUPS = (
    WhatToBuild,
    ToolchainImage,
    Cuda,
    Libraries,
    Companions,
    CompilerFlags,
    Preflight,
    Resources,
    BatchJob,
    AfterTheBuild,
)


# --------------------------------------------------------------------------- derived


def _spec_of(group: type, field: dataclasses.Field[Any]) -> KeySpec:
    decl = dict(field.metadata["key"])
    kind = decl.pop("type") or _TYPE_OF.get(str(field.type), "")
    if kind not in TYPES or decl["scope"] not in SCOPES:
        raise TypeError(f"{group.__name__}.{field.name}: type {kind!r} (one of {TYPES}), scope {decl['scope']!r}")
    return KeySpec(name=field.name, type=kind, **decl)


def declared() -> dict[str, KeySpec]:
    """Every key in the groups' order (not yet checked: config.schema() checks the defaults)."""
    return {f.name: _spec_of(g, f) for g in GROUPS for f in dataclasses.fields(g)}


def flag_keys() -> dict[str, KeySpec]:
    """The keys a task flag of the same name sets (key(..., flag=HELP))."""
    return {name: spec for name, spec in declared().items() if spec.flag}


def key_option(name: str) -> Any:
    """An option model's field (core/options.py) that is the switch of the bool key `name`,
    declared there with flag=HELP: its help is that flag's, its default False (not given: the
    profile's value stands); the task sets the key true where it is given. So the switch stands
    in its model's place among a task's flags, and its help is declared once, with the key."""
    from torchbuild.core.options import option

    spec = declared()[name]
    if spec.type != "bool" or not spec.flag:
        raise TypeError(f"key_option({name!r}): only a bool key declared with flag=HELP is a switch")
    return option(False, spec.flag, flag=name)  # the key's name is the flag's, whatever the field is called


DEFAULTS_COMMAND = "python -m torchbuild.profile.keys > configs/defaults.yaml"
_DEFAULTS_HEADER = f"""\
# Every profile key, generated from src/torchbuild/profile/keys.py (edit them there) by
# `{DEFAULTS_COMMAND}`.
# Profiles (configs/profiles/*.yaml) and `--set key=value` may only set these keys.
#
# Types: str, int, bool, number, list (of strings), requirements (list of pip requirements), map (string -> string),
# packages (list of pip requirements, each as text or as a mapping with per-package pip options),
# jobs ("auto" or an integer >= 1), cuda_arch_list (list like ["8.0", "9.0a", "9.0+PTX"]).
# `choices` restricts a str (or each item of a list); `pattern` is a regex the value
# (or each item) must match in full; `min` and `max` bound an int, number or jobs value;
# `path: true` marks host paths (~user must name a user of this host).
"""


def _entry(spec: KeySpec) -> dict[str, Any]:
    """A key as defaults.yaml writes it."""
    entry: dict[str, Any] = {"type": spec.type, "default": spec.default}
    optional: dict[str, Any] = {"choices": list(spec.choices), "pattern": spec.pattern}
    optional.update({"key_pattern": spec.key_pattern, "min": spec.minimum, "max": spec.maximum, "path": spec.path})
    entry.update({k: v for k, v in optional.items() if v is not None and v is not False and v != []})
    if spec.scope != "build":
        entry["scope"] = spec.scope
    entry["doc"] = spec.doc
    return entry


class _Dumper(yaml.SafeDumper):
    """defaults.yaml's style: each key a block mapping, a short list on one line ([gloo, nccl]), a long one a
    block sequence (a flow list PyYAML wraps is indented as yamllint's indentation rule refuses), its items
    indented under their key as yamllint asks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


_FLOW_WIDTH = 70  # a list whose items take more than this is written one item a line


def _flow_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    short = len(", ".join(map(str, data))) <= _FLOW_WIDTH
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=short)


_Dumper.add_representer(list, _flow_list)


def _defaults_lines() -> Iterator[str]:
    keys = declared()
    for group in GROUPS:
        title, _, rest = (group.__doc__ or "").partition("\n")
        yield f"\n# --- {title.strip()} " + "-" * max(3, 90 - len(title))
        yield from (f"# {line.strip()}".rstrip() for line in rest.strip().splitlines())
        for field in dataclasses.fields(group):
            entry = {field.name: _entry(keys[field.name])}
            yield yaml.dump(entry, Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True).rstrip("\n")


def defaults_yaml_text() -> str:
    """configs/defaults.yaml as the keys declare it (DEFAULTS_COMMAND writes it)."""
    return _DEFAULTS_HEADER + "\n".join(_defaults_lines()) + "\n"


if __name__ == "__main__":  # DEFAULTS_COMMAND
    print(defaults_yaml_text(), end="")
