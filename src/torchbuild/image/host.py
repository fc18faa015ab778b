"""The toolchain image: build args from the BuildSpec, a hashed build context, cache-hit check."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import fnmatch
import functools
import hashlib
import io
import json
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from packaging.requirements import InvalidRequirement, Requirement

from torchbuild import __version__
from torchbuild.core.arch import Arch, binfmt_ready
from torchbuild.core.console import redact
from torchbuild.core.errors import (
    ImageBuildFailed,
    ImageNotFound,
    ImageOutOfDate,
    ProfileError,
    ToolMissing,
    TorchbuildError,
    UsageError,
    named_os_errors,
    writable_dir,
)
from torchbuild.core.glibc import base_family
from torchbuild.core.process import run_captured
from torchbuild.core.safeio import MiB, read_bytes, sha256_file, user_path
from torchbuild.image import lock as lockfile
from torchbuild.image.lock import Lock, LockError
from torchbuild.profile.config import BuildSpec, data_dir, python_source
from torchbuild.runtime.engine import LABEL_PREFIX, Engine, registry_of, split_reference
from torchbuild.runtime.environment import compilers
from torchbuild.runtime.installed import INSTALLED_LIST

DOCKERFILE = "toolchain.Dockerfile"
# the same stages and contract on dnf (RPM) bases: Rocky/Alma/RHEL 8-class, the manylinux_2_28 builder
DNF_DOCKERFILE = "toolchain-dnf.Dockerfile"


def recipe_for(base_image: str) -> str:
    """The toolchain recipe (a file in containers/) for a base image: the dnf one for an RPM
    distribution (glibc.base_family), the apt one otherwise."""
    return DNF_DOCKERFILE if base_family(base_image) == "rpm" else DOCKERFILE


# apt packages per profile choice (Debian and Ubuntu names; nvidia/cuda images are Ubuntu)
BLAS_PACKAGES = {
    "mkl": ["libmkl-dev"],
    "openblas": ["libopenblas-dev"],
    "nvpl": ["nvpl-blas", "nvpl-lapack"],
    "blis": ["libblis-dev"],
    "eigen": ["libeigen3-dev"],
    "generic": [],
}
MPI_PACKAGES = {
    "none": [],
    "openmpi": ["libopenmpi-dev", "openmpi-bin"],
    "mpich": ["libmpich-dev", "mpich"],
    "system": [],
}


# Debian Policy 5.6.1: lower-case letters, digits, '+', '-' and '.', at least two characters,
# starting alphanumeric; apt also accepts name:arch, name=version and name/release.
_APT_NAME_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+|/[A-Za-z0-9.-]+)?")


def _checked_apt_names(key: str, names: Iterable[str]) -> list[str]:
    """names, each a valid Debian package name; ProfileError naming the first that is not."""
    for name in names:
        if not _APT_NAME_RE.fullmatch(name):
            raise ProfileError(
                f"{key}: {name!r} is not a Debian package name",
                hint="apt names use lower-case letters, digits, '+', '-' and '.' (optionally :arch, =version or /release)",
            )
    return list(names)


def comms_packages(spec: BuildSpec) -> list[str]:
    """What `invoke comms` needs in the image: make for NCCL; autotools and hwloc for the
    aws-ofi-nccl plugin (1.17 requires hwloc), and libfabric-dev unless the site's is bound in."""
    packages = ["make"] if spec.nccl == "source" else []
    if spec.aws_ofi_nccl_version:
        packages += ["make", "autoconf", "automake", "libtool", "libhwloc-dev"]
        if not spec.libfabric_prefix:
            packages.append("libfabric-dev")
    return packages


def apt_packages(spec: BuildSpec) -> list[str]:
    """The profile-dependent apt packages, in a stable order without duplicates."""
    cc, cxx = compilers(spec)
    if spec.compiler == "clang":
        compiler = [cc, "libomp-dev"] if not spec.compiler_version else [cc, f"libomp-{spec.compiler_version}-dev"]
    else:
        compiler = [cc, cxx]
    wanted = [
        *compiler,
        *BLAS_PACKAGES[spec.blas],
        *MPI_PACKAGES[spec.mpi],
        *_checked_apt_names("cuda_packages", spec.cuda_packages),
        *comms_packages(spec),
        *_checked_apt_names("apt_packages", spec.apt_packages),
    ]
    return list(dict.fromkeys(wanted))


# The RPM names (EL 8/9 with EPEL and PowerTools/CRB, Fedora) of the apt packages a profile's
# choices install; None where the RPM distributions have no package (MKL comes from Intel's own
# repository, which torchbuild does not add). A table of the choices torchbuild makes, not a
# general apt -> rpm translation: the profile's apt_packages are Debian names written by a
# person, and guessing their RPM names would fail an hour into an image build instead of now,
# so they are refused on a dnf base (ProfileError naming the key; a site adds RPMs by deriving
# its own base image). A new rpm_packages key would mean a new image input, label and lock
# field: left for when a site asks.
RPM_NAMES: dict[str, str | None] = {
    "gcc": "gcc",
    "g++": "gcc-c++",
    "clang": "clang",
    "libomp-dev": "libomp-devel",
    "libmkl-dev": None,
    "libopenblas-dev": "openblas-devel",
    "nvpl-blas": "nvpl-blas",  # NVIDIA's RPM repository uses the same names
    "nvpl-lapack": "nvpl-lapack",
    "libblis-dev": "blis-devel",  # EPEL
    "libeigen3-dev": "eigen3-devel",
    "libopenmpi-dev": "openmpi-devel",
    "openmpi-bin": "openmpi",
    "libmpich-dev": "mpich-devel",
    "mpich": "mpich",
    "make": "make",
    "autoconf": "autoconf",
    "automake": "automake",
    "libtool": "libtool",
    "libhwloc-dev": "hwloc-devel",
    "libfabric-dev": "libfabric-devel",
}


def _rpm_names(key: str, value: str, names: Iterable[str]) -> list[str]:
    """The RPM names of apt names that one profile key chose; ProfileError naming the key where
    an RPM distribution has none."""
    found = []
    for name in names:
        rpm = RPM_NAMES.get(name)
        if rpm is None:
            raise ProfileError(
                f"{key}: {value} has no package on an RPM (dnf) base ({name} is Debian's)",
                hint=f"choose another {key}, or a Debian/Ubuntu base_image",
            )
        found.append(rpm)
    return found


def _rpm_compiler(spec: BuildSpec) -> list[str]:
    """The compiler's RPMs: the distribution's gcc, or gcc-toolset-N (RHEL's devtoolset; the
    recipe links its gcc-N and g++-N onto PATH, the names compilers() gives); clang only unversioned."""
    if spec.compiler == "clang":
        if spec.compiler_version:
            raise ProfileError(
                f"compiler_version: clang {spec.compiler_version} has no versioned package on an RPM (dnf) base",
                hint="leave compiler_version empty (the distribution's clang), or use a Debian/Ubuntu base_image",
            )
        return ["clang", "libomp-devel"]
    if spec.compiler_version:
        return [f"gcc-toolset-{spec.compiler_version}-gcc", f"gcc-toolset-{spec.compiler_version}-gcc-c++"]
    return ["gcc", "gcc-c++"]


def rpm_packages(spec: BuildSpec) -> list[str]:
    """apt_packages' counterpart on a dnf base: the profile-dependent RPMs, in a stable order
    without duplicates. cuda_packages pass as they are (NVIDIA's RPM repository names its
    packages as its apt one does: cuda-toolkit-12-6); apt_packages are refused (see RPM_NAMES)."""
    if spec.apt_packages:
        raise ProfileError(
            f"apt_packages: {', '.join(spec.apt_packages)}: Debian package names, and base_image "
            f"{spec.base_image} is an RPM (dnf) distribution",
            hint="drop apt_packages for this base (build a base_image FROM it with the RPMs the site needs), "
            "or use a Debian/Ubuntu base_image",
        )
    wanted = [
        *_rpm_compiler(spec),
        *_rpm_names("blas", spec.blas, BLAS_PACKAGES[spec.blas]),
        *_rpm_names("mpi", spec.mpi, MPI_PACKAGES[spec.mpi]),
        *_checked_apt_names("cuda_packages", spec.cuda_packages),
        *_rpm_names("aws_ofi_nccl_version", spec.aws_ofi_nccl_version or spec.nccl, comms_packages(spec)),
    ]
    return list(dict.fromkeys(wanted))


def image_packages(spec: BuildSpec) -> list[str]:
    """The packages the profile adds to its base: RPM names on a dnf base, apt ones otherwise."""
    return rpm_packages(spec) if base_family(spec.base_image) == "rpm" else apt_packages(spec)


def python_requirements(spec: BuildSpec) -> list[str]:
    """The profile's python_packages, each checked to be a PEP 508 requirement (`numpy<2`,
    `pkg @ https://...`): a pip option (`--index-url ...`) or a second line cannot slip in."""
    for entry in spec.python_packages:
        try:
            Requirement(entry)
        except InvalidRequirement as exc:
            raise ProfileError(
                f"python_packages: {entry!r} is not a requirement: {str(exc).splitlines()[0]}",
                hint="write each entry as pip's requirement syntax, e.g. numpy<2 or setuptools>=70.1",
            ) from exc
    return list(spec.python_packages)


def python_sources(spec: BuildSpec) -> list[str]:
    """`version url sha256` for each of the image's Pythons that python_sources names (config
    checked the form: an http(s) URL without spaces, 64 hex digits); the Dockerfile builds one
    from it only where the base's apt archive lacks that Python."""
    found = (python_source(spec.python_sources.get(v, "")) for v in spec.pythons)
    return [f"{v} {src[0]} {src[1]}" for v, src in zip(spec.pythons, found) if src]


def build_args(spec: BuildSpec) -> dict[str, str]:
    """The Dockerfile's ARGs: none of them is ever split by a shell (the package lists and apt
    options travel as files in the context, see write_package_lists)."""
    return {
        "BASE_IMAGE": spec.base_image,
        "PYTHON_VERSION": spec.python_version,
        "VENV_FLAGS": "--system-site-packages" if spec.python_system_site_packages else "",
        "TORCHBUILD_CUDA_VERSION": spec.cuda_version,
        "TORCHBUILD_CUDA_HOME": spec.cuda_home,
    }


INPUTS_DIR = "inputs"


@dataclasses.dataclass(frozen=True)
class LockedBy:
    """A lock an image is built from: where it was read, what it pins, the file's sha256."""

    path: Path
    lock: Lock
    sha256: str


def write_package_lists(
    spec: BuildSpec, dest: Path, apt_options: Iterable[str] = (), locked: LockedBy | None = None
) -> None:
    """Write the apt packages, the pip requirements, the Pythons and the apt options into
    dest/inputs/, one entry a line, and with a lock its pins into dest/inputs/lock/. The
    Dockerfile reads them with `mapfile` into bash arrays it expands quoted and with `pip
    install -r`, so no profile or lock value is ever re-parsed by a shell: a specifier such as
    `numpy<2` reaches pip intact, and a value cannot become a redirection or a command. An apt
    option is split like a command line (`-o Acquire::Check-Valid-Until=false`)."""
    apt_options = list(apt_options)
    if apt_options and base_family(spec.base_image) == "rpm":
        raise UsageError(
            f"--apt-option: base_image {spec.base_image} is an RPM (dnf) distribution; apt options do not apply",
            hint="drop --apt-option for this profile",
        )
    lists = {
        # on a dnf base the RPM names (rpm_packages): the file keeps its name, the recipes their inputs
        "apt-packages.txt": image_packages(spec),
        "requirements.txt": python_requirements(spec),
        "pythons.txt": list(spec.pythons),
        "python-sources.txt": python_sources(spec),
        "apt-options.txt": [word for option in apt_options for word in shlex.split(option)],
    }
    inputs = dest / INPUTS_DIR
    inputs.mkdir()
    for name, entries in lists.items():
        (inputs / name).write_text("".join(f"{entry}\n" for entry in entries))
    if locked is not None:
        locked.lock.render(inputs / "lock")
        (inputs / "lock" / "lock.sha256").write_text(f"{locked.sha256}  {locked.path.name}\n")


_SOURCE_PARTS = ("pyproject.toml", "README.md", "src", "configs", "containers", "patches")
# left out of what the image installs (and of its digest); locks beside the profiles reach the
# image as inputs/lock/, not as part of the source
_SOURCE_IGNORED = ("__pycache__", "*.pyc", "*.egg-info", ".*", f"*{lockfile.SUFFIX}")


def _copy_tree(root: Path, dest: Path) -> None:
    """Copy the torchbuild source the image installs, without caches or bytecode."""
    if not (root / "pyproject.toml").is_file():
        raise ImageBuildFailed(
            f"torchbuild source not found at {root} (the image installs torchbuild from a checkout)",
            hint="run `invoke image` from a torchbuild git checkout",
        )
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(*_SOURCE_IGNORED)
    for part in _SOURCE_PARTS:
        src = root / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / part)


@functools.cache
def source_digest() -> str:
    """sha256 of the torchbuild source an image installs (what _copy_tree copies): the image's
    torchbuild runs the steps, so an image from another checkout is out of date even where
    the version number is the same (a resumed build met one that did not know a new profile key)."""
    h = hashlib.sha256()
    for rel, path in source_files(data_dir()):
        h.update(f"{rel}\0".encode())
        h.update(bytes.fromhex(sha256_file(path)))
    return h.hexdigest()


def source_files(root: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of each file _copy_tree copies from root, in a stable order."""
    found = []
    for part in _SOURCE_PARTS:
        base = root / part
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        for path in files:
            rel = path.relative_to(root)
            if not any(fnmatch.fnmatch(name, pattern) for name in rel.parts for pattern in _SOURCE_IGNORED):
                found.append((rel.as_posix(), path))  # the names shutil.ignore_patterns leaves out of the copy
    return found


def tree_digest(root: Path) -> str:
    """sha256 over relative paths, modes and contents: equal trees give equal digests."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        h.update(f"{rel}\0{path.stat().st_mode & 0o111}\0".encode())
        h.update(bytes.fromhex(sha256_file(path)))
    return h.hexdigest()


def make_context(spec: BuildSpec, dest: Path, dockerfile: str = DOCKERFILE, extra: Iterable[str] = ()) -> None:
    """Lay out a docker build context: the Dockerfile, extra files from containers/, site CA
    certificates and torchbuild's source."""
    root = data_dir()
    shutil.copy2(root / "containers" / dockerfile, dest / "Dockerfile")
    for name in extra:
        shutil.copy2(root / "containers" / name, dest / name)
    (dest / ".dockerignore").write_text("**/__pycache__\n**/*.pyc\n")
    certs = dest / "certs"
    certs.mkdir()
    (certs / "README").write_text("CA certificates from the profile's ca_certificates key.\n")
    for i, (src, data) in enumerate(ca_certificates(spec)):
        with named_os_errors(certs, "ca_certificates"):
            (certs / f"{i:02d}-{src.stem}.crt").write_bytes(data)
    _copy_tree(root, dest / "torchbuild-src")


# a bundle of every public root CA is about 220 KiB
CA_LIMIT = 1 * MiB
_BEGIN, _END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
_PEM_HINT = (
    "list PEM certificate files (-----BEGIN CERTIFICATE----- blocks), e.g. /usr/local/share/ca-certificates/site.crt; "
    "convert a DER one with `openssl x509 -inform der -in site.cer -out site.crt`"
)


def ca_certificates(spec: BuildSpec) -> list[tuple[Path, bytes]]:
    """Each ca_certificates file and its bytes: a regular file of at most CA_LIMIT holding PEM
    CERTIFICATE blocks only (anything else, a private key or /etc/passwd, is never put in the
    image's trust store); ProfileError naming the file and the line otherwise."""
    found = []
    for name in spec.ca_certificates:
        src = user_path(name)
        if not src.is_file():
            raise ProfileError(f"ca_certificates: {src} is not a file", hint=_PEM_HINT)
        try:
            data = read_bytes(src, CA_LIMIT, "ca_certificates", ProfileError)
        except ProfileError as exc:
            raise ProfileError(exc.message, hint=_PEM_HINT) from None
        problem = pem_problem(data)
        if problem:
            raise ProfileError(f"ca_certificates: {src} is not a PEM certificate: {problem}", hint=_PEM_HINT)
        found.append((src, data))
    return found


def pem_problem(data: bytes) -> str:
    """Why data is not one or more PEM certificates ('' when it is): outside the blocks only
    blank lines and # comments (as in CA bundles); each block base64 of one DER SEQUENCE."""
    if b"\0" in data or data[:1] == b"\x30":
        return "it is binary (a DER certificate?)"
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return "it is not ASCII text"
    count, start = 0, 0  # start: the line of the open block's BEGIN, 0 outside blocks
    lines: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not start:
            if not line or line.startswith("#"):
                continue
            if line == _BEGIN:
                start, lines = n, []
                continue
            kind = re.fullmatch(r"-----BEGIN ([A-Z0-9 ]{1,40})-----", line)
            if kind:
                return f"line {n} begins a {kind[1]} block; only CERTIFICATE blocks go into a trust store"
            return f"line {n} is not part of a -----BEGIN CERTIFICATE----- block"
        if line == _END:
            problem = _der_problem("".join(lines))
            if problem:
                return f"the block at line {start} {problem}"
            count, start = count + 1, 0
            continue
        lines.append(line)
    if start:
        return f"the block at line {start} has no {_END} line (truncated?)"
    if not count:
        return f"it holds no {_BEGIN} block"
    return ""


def _der_problem(b64: str) -> str:
    """Why b64 is not the base64 of one DER-encoded SEQUENCE (a certificate's outer structure)."""
    try:
        der = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return "is not base64"
    if len(der) < 2 or der[0] != 0x30:
        return "does not hold a DER certificate (no ASN.1 SEQUENCE)"
    size, header = der[1], 2
    if size & 0x80:
        width = size & 0x7F
        if not 1 <= width <= 4 or len(der) < 2 + width:
            return "does not hold a DER certificate (bad length)"
        size, header = int.from_bytes(der[2 : 2 + width], "big"), 2 + width
    if header + size != len(der):
        return f"holds {len(der)} bytes where its DER header says {header + size} (truncated?)"
    return ""


@dataclasses.dataclass(frozen=True)
class ImageResult:
    tag: str
    image_id: str
    cached: bool
    seconds: float
    log: Path | None


# What the image is built from, one label each (org.torchbuild.<name with - for _>), so that
# require_image can name every input that differs from the profile. Only inputs of the image
# count: cxxflags, switches or max_jobs change the build, not the toolchain.
IMAGE_INPUTS = (
    "base_image",
    "base_image_id",
    "python_version",
    "python_versions",
    "compiler",
    "apt_packages",
    "python_packages",
    "python_system_site_packages",
    "ca_certificates",
    "python_sources",
)
_LIST_INPUTS = frozenset({"apt_packages", "python_packages", "ca_certificates", "python_versions"})


def input_label(name: str) -> str:
    return f"{LABEL_PREFIX}.{name.replace('_', '-')}"


def _ca_digests(spec: BuildSpec) -> list[str]:
    """sha256 of each CA file's content: the path differs between hosts, the trust does not."""
    digests = []
    for name in spec.ca_certificates:
        path = user_path(name)
        try:
            digests.append("sha256:" + hashlib.sha256(read_bytes(path, CA_LIMIT, "ca_certificates")).hexdigest())
        except TorchbuildError:
            digests.append(f"unreadable {path}")
    return sorted(digests)


def wanted_inputs(spec: BuildSpec, base_id: str | None = None) -> dict[str, str]:
    """The image inputs spec asks for, as label values (lists as JSON); base_image_id only when
    known (the base image is present on this engine)."""
    compiler = f"{spec.compiler}-{spec.compiler_version}" if spec.compiler_version else spec.compiler
    wanted = {
        "base_image": spec.base_image,
        "python_version": spec.python_version,
        "python_versions": json.dumps(list(spec.pythons[1:])),  # the Pythons besides python_version
        "compiler": compiler,
        "apt_packages": json.dumps(image_packages(spec)),  # RPM names on a dnf base
        "python_packages": json.dumps(python_requirements(spec)),
        "python_system_site_packages": json.dumps(spec.python_system_site_packages),
        "ca_certificates": json.dumps(_ca_digests(spec)),
    }
    sources = python_sources(spec)
    if sources:  # recorded only where used, so images and locks without one stay comparable
        wanted["python_sources"] = json.dumps(sources)
    if base_id:
        wanted["base_image_id"] = base_id
    # labels and locks are read by whoever can list the images: no credential of a requirement's
    # URL (`pkg @ https://user:token@host/...`) goes into them
    return {k: redact(v) for k, v in wanted.items()}


def labels(spec: BuildSpec, inputs_hash: str, base_id: str, lock_sha256: str = "") -> dict[str, str]:
    """The image's labels: what it is, its inputs, and whether it was installed from a lock
    (org.torchbuild.locked, org.torchbuild.lock-sha256: the lock file's sha256)."""
    p = LABEL_PREFIX
    return {
        "org.opencontainers.image.title": "torchbuild toolchain",
        "org.opencontainers.image.base.name": spec.base_image,
        f"{p}.version": __version__,
        f"{p}.source": source_digest(),
        f"{p}.profile": spec.profile,
        f"{p}.profile-hash": spec.hash,
        f"{p}.inputs-hash": inputs_hash,
        f"{p}.torch-version": spec.torch_version,
        f"{p}.arch": spec.arch.value,
        f"{p}.locked": json.dumps(bool(lock_sha256)),
        **({f"{p}.lock-sha256": lock_sha256} if lock_sha256 else {}),
        **{input_label(k): v for k, v in wanted_inputs(spec, base_id).items()},
    }


def _labels_of(attrs: Mapping[str, Any]) -> dict[str, str]:
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def image_inputs(attrs: Mapping[str, Any]) -> dict[str, str]:
    """The inputs an image records in its labels (`docker image inspect` data), by input name;
    inputs it does not record are left out. For the manifest."""
    found = _labels_of(attrs)
    return {name: found[input_label(name)] for name in IMAGE_INPUTS if input_label(name) in found}


def _brief(item: str) -> str:
    return item[:19] + "..." if item.startswith("sha256:") else item


def _items(name: str, text: str | None) -> list[str] | None:
    """A list input's label value as its entries; None for other inputs or a value that is no
    JSON list of strings (an image labelled by something else)."""
    if text is None or name not in _LIST_INPUTS:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return [str(x) for x in value] if isinstance(value, list) else None


def _describe(name: str, image: str | None, profile: str, what: str = "image") -> str:
    """One line for one differing input: `python_version: image 3.13, profile 3.12` (what: the
    thing compared with the profile, an image or a lock)."""
    if image is None:
        return f"{name}: not recorded in the {what}, profile {profile}"
    had, want = _items(name, image), _items(name, profile)
    if had is None or want is None:
        return f"{name}: {what} {image}, profile {profile}"
    parts = [f"profile adds {', '.join(_brief(x) for x in want if x not in had)}"] if set(want) - set(had) else []
    if set(had) - set(want):
        parts.append(f"{what} has {', '.join(_brief(x) for x in had if x not in want)} the profile does not")
    return f"{name}: {'; '.join(parts)}"


def _same(name: str, image: str | None, profile: str) -> bool:
    had, want = _items(name, image), _items(name, profile)
    if had is None or want is None:
        return image == profile
    return sorted(had) == sorted(want)  # the order of a list does not change the image


def input_differences(attrs: Mapping[str, Any], wanted: Mapping[str, str]) -> list[str]:
    """Each input where the image (inspect data) differs from wanted (wanted_inputs), described
    for people; empty when the image is current. The torchbuild version counts too: the build
    request format belongs to one torchbuild version."""
    found = _labels_of(attrs)
    built_with = found.get(f"{LABEL_PREFIX}.version")
    diffs = [] if built_with == __version__ else [f"torchbuild: image {built_with}, this is {__version__}"]
    source = found.get(f"{LABEL_PREFIX}.source")
    if not diffs and source != source_digest():
        diffs.append(
            f"torchbuild source: the image's was {'another checkout' if source else 'not recorded'} (its steps would run other code)"
        )
    recorded = image_inputs(attrs)
    diffs += [_describe(k, recorded.get(k), v) for k, v in wanted.items() if not _same(k, recorded.get(k), v)]
    return diffs


# keys that decide the image or its tag: the ones an `invoke image` hint must repeat from --set
_IMAGE_KEYS = (
    "base_image",
    "python_version",
    "python_versions",
    "compiler",
    "compiler_version",
    "apt_packages",
    "python_packages",
    "python_system_site_packages",
    "ca_certificates",
    "blas",
    "mpi",
    "cuda_packages",
    "image_name",
    "torch_version",
    "cache_dir",
)


def _set_value(value: object) -> str:
    if isinstance(value, tuple):
        text = ",".join(value)
        return json.dumps(list(value)) if any("," in v or ";" in v for v in value) else text
    if isinstance(value, bool):
        return json.dumps(value)
    return str(value)


def image_command(spec: BuildSpec) -> str:
    """The exact `invoke image` command that builds spec's image (its --set image keys repeated),
    quoted for a POSIX shell."""
    profile_file = Path(spec.origins.get("profile", spec.profile))
    shipped = profile_file.parent == data_dir() / "configs" / "profiles" or not profile_file.is_file()
    words = ["invoke", "image", "--profile", spec.profile if shipped else str(profile_file), "--arch", spec.arch.value]
    for key in _IMAGE_KEYS:
        if spec.origins.get(key) == "--set":
            words += ["--set", f"{key}={_set_value(getattr(spec, key))}"]
    return shlex.join(words)


def inputs_hash(arch: Arch, context: Path, args: dict[str, str], base_id: str) -> str:
    """Everything that decides the image's content; equal hash means the image is current."""
    blob = json.dumps(
        {"args": args, "base_id": base_id, "context": tree_digest(context), "platform": arch.docker_platform},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def require_emulation(arch: Arch) -> None:
    """A foreign-arch image builds only where the host can run its binaries (qemu-user binfmt)."""
    if not binfmt_ready(arch):
        raise ToolMissing(
            f"cannot build a {arch} image on this {Arch.host()} host: no {arch.qemu_binfmt} binfmt entry",
            hint="apt-get install qemu-user-static binfmt-support && update-binfmts --enable (see `invoke doctor`)",
        )


def check_platform(engine: Engine, ref: str, arch: Arch) -> None:
    attrs = engine.image_attrs(ref)
    got = attrs.get("Architecture") if attrs else None
    if got != arch.docker_arch:
        raise ImageBuildFailed(
            f"{ref} is {got}, not {arch.docker_arch} ({arch.value})",
            hint=f"use a base image for {arch.docker_platform}, or build one with `invoke base-image --arch {arch}`",
        )


def image_context(spec: BuildSpec, dest: Path, apt_options: Iterable[str] = (), locked: LockedBy | None = None) -> None:
    """The toolchain image's build context: make_context plus the package lists (and the lock's)."""
    make_context(spec, dest, dockerfile=recipe_for(spec.base_image), extra=(CUDA_CHECK,))
    write_package_lists(spec, dest, apt_options, locked)


# --------------------------------------------------------------------------- locks


def default_lock_path(spec: BuildSpec) -> Path:
    """Where spec's lock lives: beside its profile file, `<profile>.<arch>.lock`, so that it is
    versioned, reviewed and copied with the profile it pins (one per arch: the pins differ)."""
    profile_file = Path(spec.origins.get("profile", spec.profile))
    return profile_file.with_name(f"{spec.profile}.{spec.arch.value}{lockfile.SUFFIX}")


_JSON_INPUTS = _LIST_INPUTS | {"python_system_site_packages"}


def lock_inputs(spec: BuildSpec) -> dict[str, Any]:
    """The image inputs a lock is made from and checked against (wanted_inputs without the
    base image's local id), as plain YAML values."""
    return {k: json.loads(v) if k in _JSON_INPUTS else v for k, v in wanted_inputs(spec).items()}


def _label_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def lock_differences(lock: Lock, spec: BuildSpec) -> list[str]:
    """Where a lock was made for something else than spec asks for (profile, arch, an image
    input, the Pythons it pins), described for people; empty when it fits."""
    diffs = [
        f"{name}: lock {had}, profile {want}"
        for name, had, want in (("profile", lock.profile, spec.profile), ("arch", lock.arch, spec.arch.value))
        if had != want
    ]
    wanted = {k: _label_text(v) for k, v in lock_inputs(spec).items()}
    recorded = {k: _label_text(v) for k, v in lock.inputs.items()}
    diffs += [_describe(k, recorded.get(k), v, "lock") for k, v in wanted.items() if not _same(k, recorded.get(k), v)]
    if not diffs and list(lock.pip) != list(spec.pythons):
        diffs.append(f"pip: lock pins Pythons {', '.join(lock.pip)}, profile has {', '.join(spec.pythons)}")
    return diffs


def _lock_command(spec: BuildSpec, path: Path, *flags: str) -> str:
    command = image_command(spec)
    given = [] if path == default_lock_path(spec) else ["--lock-file", str(path)]
    return shlex.join([*shlex.split(command), *flags, *given])


def require_apt_base(spec: BuildSpec) -> None:
    """LockError on a dnf base: a lock pins dpkg packages (record/dpkg-base.txt, lock/apt.txt);
    pinning RPMs (rpm -qa, dnf install name-version) is not made yet, so the dnf recipe and this
    refuse a lock rather than build an image the lock does not describe."""
    if base_family(spec.base_image) == "rpm":
        raise LockError(
            f"locks are made for apt bases only, and base_image {spec.base_image} is an RPM (dnf) distribution",
            hint="build this profile's image without a lock (`invoke image` without --lock; remove its .lock file)",
        )


def read_lock(spec: BuildSpec, path: Path) -> LockedBy:
    """The lock in path, checked to fit spec; LockError naming each difference otherwise."""
    require_apt_base(spec)
    lock, sha256 = lockfile.read(path)
    diffs = lock_differences(lock, spec)
    if diffs:
        raise LockError(
            f"the lock {path} was made for other inputs than profile {spec.profile} asks for: {'; '.join(diffs)}",
            hint=f"refresh it with `{_lock_command(spec, path, '--lock')}`",
        )
    return LockedBy(path, lock, sha256)


def find_lock(spec: BuildSpec, path: Path | None = None) -> LockedBy | None:
    """spec's lock: the one in path (which must exist), else the one at default_lock_path when
    there is one; None when spec is not locked."""
    if path is not None:
        if not path.is_file():
            raise LockError(
                f"no lock at {path}", hint=f"write it with `{_lock_command(spec, path, '--lock')}`, or fix the path"
            )
        return read_lock(spec, path)
    default = default_lock_path(spec)
    return read_lock(spec, default) if default.is_file() else None


def _lock_failure(spec: BuildSpec, locked: LockedBy, log: Path, err: ImageBuildFailed) -> TorchbuildError:
    """LockError when the build log shows a locked install step failed; err otherwise."""
    try:
        steps, errors = lockfile.install_failures(log.read_text(errors="replace"))
    except OSError:
        return err
    if not steps:
        return err
    why = "; ".join(errors[:4]) or "see the log"
    return LockError(
        f"the lock {locked.path} no longer installs: the locked {', '.join(steps)} packages did not install "
        f"({why}) (full log: {log})",
        hint=f"refresh it (resolving every package afresh) with `{_lock_command(spec, locked.path, '--lock', '--rebuild')}`",
    )


CUDA_CHECK = "cuda-check.sh"  # containers/: cuda_version against the image's nvcc
# the lines the recipe prints before it stops on a profile value: the key it names and what to do
_PROFILE_STOPS = (
    (  # cuda-check.sh: cuda_version is not the image's nvcc's release
        re.compile(r"torchbuild-cuda: (cuda_version is .*)"),
        "cuda_version",
        "set cuda_version to the CUDA the base image (or cuda_packages) provides, or a base_image of that CUDA",
    ),
    (  # a Python the base lacks: no python_sources entry, another sha256, a source that did not build
        re.compile(r"torchbuild-python: (.*)"),
        "python_version",
        "choose a Python the base's archive has, or name its CPython source tarball with its sha256 in "
        'python_sources (python.org\'s, e.g. --set \'python_sources={"3.12": "URL#sha256=HEX"}\')',
    ),
)


def _profile_stop(spec: BuildSpec, log: Path, err: ImageBuildFailed) -> TorchbuildError:
    """ProfileError when the build stopped at one of _PROFILE_STOPS' lines; err otherwise."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return err
    for pattern, key, hint in _PROFILE_STOPS:
        found = pattern.search(text)
        if found is not None:
            return ProfileError(f"{spec.origins.get(key, key)}: {found.group(1).strip()} (full log: {log})", hint=hint)
    return err


def read_image_files(engine: Engine, image: str, paths: Iterable[str]) -> dict[str, bytes]:
    """The regular files at paths in image (a directory's files by name; a missing path is left
    out), read from a container that is created but never started (so a foreign-arch image
    needs no emulation)."""
    import docker.errors

    found: dict[str, bytes] = {}
    container = engine.client.containers.create(image, command=["true"])
    try:
        for path in paths:
            try:
                stream, _ = container.get_archive(path)
            except docker.errors.NotFound:
                continue
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                for member in tar.getmembers():
                    data = tar.extractfile(member) if member.isfile() else None
                    if data is not None:
                        found[Path(member.name).name] = data.read()
    finally:
        container.remove(force=True)
    return found


@dataclasses.dataclass(frozen=True)
class LockOutcome:
    unlocked: ImageResult  # the image the lock was made from
    locked: ImageResult  # the image built from the new lock (same tag)
    path: Path
    sha256: str
    size: int
    apt: int
    pip: int


def lock_image(
    spec: BuildSpec,
    engine: Engine,
    *,
    path: Path,
    logs_dir: Path,
    rebuild: bool = False,
    pull: bool = False,
    apt_options: Iterable[str] = (),
    out: TextIO = sys.stdout,
) -> LockOutcome:
    """`invoke image --lock`: build spec's image without a lock (rebuild: resolving everything
    afresh, without Docker's layer cache), pin what it installed, build the image again from
    those pins, and write the lock to path only when both images list the same packages."""
    require_apt_base(spec)
    writable_dir(path.parent, "the lock's directory")
    unlocked = build_image(
        spec, engine, logs_dir=logs_dir, rebuild=rebuild, pull=pull, apt_options=apt_options, out=out, locked=None
    )
    lock, installed = _pins_of(spec, engine, unlocked.image_id)
    raw = lock.dump().encode()
    locked_by = LockedBy(path, lock, hashlib.sha256(raw).hexdigest())
    apt, pip = lock.counts()
    print(f"pinned {apt} apt and {pip} pip packages; building {spec.image_tag} from them", file=out, flush=True)
    locked = build_image(
        spec, engine, logs_dir=logs_dir, rebuild=rebuild, apt_options=apt_options, out=out, locked=locked_by
    )
    _check_same_packages(engine, locked.image_id, installed, path)
    sha256, size = lockfile.write(lock, path)
    assert sha256 == locked_by.sha256
    return LockOutcome(unlocked, locked, path, sha256, size, apt, pip)


def _pins_of(spec: BuildSpec, engine: Engine, image_id: str) -> tuple[Lock, list[str]]:
    """The lock of the image built without one (from what it recorded), and its installed list."""
    records = read_image_files(engine, image_id, [lockfile.RECORD_DIR, INSTALLED_LIST])
    listed = records.pop(Path(INSTALLED_LIST).name, None)
    if listed is None:
        raise LockError(f"{spec.image_tag} has no {INSTALLED_LIST}: it was not built by this torchbuild")
    installed = listed.decode().splitlines()
    base_id = str((engine.image_attrs(spec.base_image) or {}).get("Id", ""))
    lock = lockfile.from_records(
        records,
        installed,
        profile=spec.profile,
        arch=spec.arch.value,
        pythons=spec.pythons,
        inputs=lock_inputs(spec),
        base_image_id=base_id,
        torchbuild_version=__version__,
    )
    return lock, installed


def _check_same_packages(engine: Engine, image_id: str, installed: list[str], path: Path) -> None:
    """LockError (and no lock written) when the image built from the pins lists other packages than installed."""
    again = read_image_files(engine, image_id, [INSTALLED_LIST])
    relisted = again.get(Path(INSTALLED_LIST).name, b"").decode().splitlines()
    differences = lockfile.list_differences(installed, relisted)
    if differences:
        raise LockError(
            f"the image built from the pins differs from the one they were taken from ({', '.join(differences[:6])}); "
            f"no lock was written to {path}",
            hint="report it: a lock must reproduce the image's packages exactly",
        )


# --------------------------------------------------------------------------- build


def build_image(
    spec: BuildSpec,
    engine: Engine,
    *,
    logs_dir: Path,
    rebuild: bool = False,
    pull: bool = False,
    apt_options: Iterable[str] = (),
    out: TextIO = sys.stdout,
    locked: LockedBy | None = None,
) -> ImageResult:
    """Build (or find current) the toolchain image for spec, from the lock when one is given;
    a rerun with nothing changed is a hit."""
    start = time.monotonic()
    platform = spec.arch.docker_platform
    packages = image_packages(spec)
    _check_inputs(spec)
    base_id = _base_image_id(spec, engine, pull, out)
    args = build_args(spec)
    with tempfile.TemporaryDirectory(prefix="torchbuild-ctx-") as tmp:
        ctx = Path(tmp)
        image_context(spec, ctx, apt_options, locked)
        digest = inputs_hash(spec.arch, ctx, args, base_id)
        current = engine.image_attrs(spec.image_tag)
        if not rebuild and current and _labels_of(current).get(f"{LABEL_PREFIX}.inputs-hash") == digest:
            return ImageResult(spec.image_tag, current["Id"], True, time.monotonic() - start, None)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log = logs_dir / f"image-{spec.profile}-{spec.arch.value}-{stamp}.log"
        _announce(spec, packages, locked, out)
        try:
            image_id = engine.build(
                ctx,
                tag=spec.image_tag,
                buildargs=args,
                labels=labels(spec, digest, base_id, locked.sha256 if locked else ""),
                platform=platform,
                nocache=rebuild,
                log=log,
                out=out,
            )
        except ImageBuildFailed as err:
            named = _named_failure(spec, locked, log, err)
            if named is err:
                raise
            raise named from err
    check_platform(engine, spec.image_tag, spec.arch)
    return ImageResult(spec.image_tag, image_id, False, time.monotonic() - start, log)


def _check_inputs(spec: BuildSpec) -> None:
    """Refuse, before anything is pulled or built, a bad python requirement, a CA file that is no PEM certificate
    and a foreign arch without emulation."""
    python_requirements(spec)  # a bad entry is refused before anything is pulled or built
    ca_certificates(spec)  # and so is a CA file that is not a PEM certificate
    require_emulation(spec.arch)


def _named_failure(spec: BuildSpec, locked: LockedBy | None, log: Path, err: ImageBuildFailed) -> TorchbuildError:
    """What a failed build means: a lock that does not fit (_lock_failure), a profile value the build stopped at
    (_profile_stop), else err itself."""
    named = _lock_failure(spec, locked, log, err) if locked else err
    return _profile_stop(spec, log, err) if named is err else named


def _base_image_id(spec: BuildSpec, engine: Engine, pull: bool, out: TextIO) -> str:
    """The base image's id, pulled first when asked to or absent, refused when it is of another
    architecture than spec's."""
    if pull or engine.image_attrs(spec.base_image) is None:
        engine.pull(spec.base_image, spec.arch.docker_platform, out=out)
    check_platform(engine, spec.base_image, spec.arch)
    return str((engine.image_attrs(spec.base_image) or {}).get("Id", ""))


def _announce(spec: BuildSpec, packages: list[str], locked: LockedBy | None, out: TextIO) -> None:
    """What is about to be built: the tag, platform and base, the apt packages, the Pythons and the lock."""
    print(f"building {spec.image_tag} for {spec.arch.docker_platform} from {spec.base_image}", file=out, flush=True)
    kind = "dnf" if base_family(spec.base_image) == "rpm" else "apt"
    print(f"  {kind} packages: {' '.join(packages) or '(none beyond the base set)'}", file=out, flush=True)
    if len(spec.pythons) > 1:
        print(f"  Pythons: {', '.join(spec.pythons)} (/opt/venv is {spec.python_version})", file=out, flush=True)
    if locked is None:
        print(f"  lock: none (`invoke image --lock` writes {default_lock_path(spec)})", file=out, flush=True)
    else:
        apt, pip = locked.lock.counts()
        print(
            f"  lock: {locked.path} (sha256 {locked.sha256[:16]}...): {apt} apt and {pip} pip pins",
            file=out,
            flush=True,
        )


def _out_of_date(spec: BuildSpec, engine: Engine, attrs: Mapping[str, Any], command: str) -> ImageOutOfDate | None:
    """ImageOutOfDate naming each input where the image (inspect data) differs from spec, or None."""
    base = engine.image_attrs(spec.base_image)  # its id is compared only where the base is present
    diffs = input_differences(attrs, wanted_inputs(spec, base["Id"] if base else None))
    if not diffs:
        return None
    return ImageOutOfDate(
        f"toolchain image {spec.image_tag} was built from other inputs than profile {spec.profile} asks for: "
        + "; ".join(diffs),
        hint=f"rebuild it with `{command}`",
    )


def require_image(
    spec: BuildSpec, engine: Engine, *, rebuild: bool = False, out: TextIO = sys.stdout
) -> dict[str, object]:
    """The inspect data of spec's toolchain image when it exists and was built from the inputs
    spec asks for. Otherwise ImageNotFound, or ImageOutOfDate naming each differing input, with
    the exact `invoke image` command as hint; with rebuild=True the image is built instead."""
    attrs = engine.image_attrs(spec.image_tag)
    command = image_command(spec)
    problem: ImageNotFound | ImageOutOfDate | None
    if attrs is None:
        problem = ImageNotFound(f"toolchain image {spec.image_tag} does not exist", hint=f"build it with `{command}`")
    else:
        problem = _out_of_date(spec, engine, attrs, command)
        if problem is None:
            return attrs
    if not rebuild:
        raise problem
    print(f"{problem}: building it", file=out, flush=True)
    logs = user_path(spec.cache_dir) / "logs"
    build_image(spec, engine, logs_dir=logs, out=out, locked=find_lock(spec))
    return engine.image_attrs(spec.image_tag) or {}


def manifest_commands(specs: list[BuildSpec], insecure: bool = False) -> list[list[str]]:
    """docker CLI calls that publish one manifest list over the pushed per-arch images."""
    tags = [s.image_tag for s in specs]
    target = specs[0].manifest_tag
    flag = ["--insecure"] if insecure else []
    cmds = [["docker", "manifest", "create", *flag, "--amend", target, *tags]]
    for s in specs:
        cmds.append(
            ["docker", "manifest", "annotate", "--os", "linux", "--arch", s.arch.docker_arch, target, s.image_tag]
        )
    cmds.append(["docker", "manifest", "push", *flag, "--purge", target])
    return cmds


def registry_is_insecure(engine: Engine, image_name: str) -> bool:
    """True when the engine talks plain HTTP to the image's registry (127.0.0.0/8 by default)."""
    import ipaddress

    host = registry_of(image_name)
    if not host:
        return False  # Docker Hub
    config = engine.client.info().get("RegistryConfig") or {}
    index = (config.get("IndexConfigs") or {}).get(host)
    if index is not None:
        return not index.get("Secure", True)
    name = host.rsplit(":", 1)[0]
    if name == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(c) for c in config.get("InsecureRegistryCIDRs") or [])


def push_images(engine: Engine, specs: list[BuildSpec], out: TextIO = sys.stdout) -> str:
    """Push each per-arch image, then a manifest list naming them all; returns the list's tag."""

    hint = "set image_name to a registry path (registry.example.org/group/toolchain) and `docker login` to it"
    for s in specs:
        repo, tag = split_reference(s.image_tag)
        print(f"pushing {s.image_tag}", file=out, flush=True)
        for chunk in engine.client.api.push(repo, tag=tag, stream=True, decode=True):
            if isinstance(chunk, dict) and "error" in chunk:
                raise ImageBuildFailed(f"pushing {s.image_tag} failed: {chunk['error']}", hint=hint)
    for cmd in manifest_commands(specs, insecure=registry_is_insecure(engine, specs[0].image_name)):
        print(f"$ {' '.join(cmd)}", file=out, flush=True)
        proc = run_captured(cmd)
        if proc.returncode != 0:
            raise ImageBuildFailed(f"{' '.join(cmd[:3])} failed: {proc.stderr.strip()[-300:]}", hint=hint)
    return specs[0].manifest_tag
