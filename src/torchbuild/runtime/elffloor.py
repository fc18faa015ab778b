"""A wheel's ELF floor, measured with auditwheel: the glibc, libstdc++ and C++ ABI versions its
shared objects need, the libraries it takes from outside itself, and the manylinux tag it earns.

auditwheel (PyPA) is the tool made for this, and the analysis is its own: the wheel unpacked, each
ELF file's versioned symbols and DT_NEEDED resolved as the loader would (RPATH, RUNPATH,
ld.so.conf), the manylinux policies' symbol versions and library whitelists. It is called as a
library here, and only here, because its API is not stable: `analyze_wheel_abi` and
`get_wheel_elfdata` changed their parameters between 6.4 (the last release for Python 3.9, which
the toolchain image may run) and 6.8 (`args_ldpaths` added without a default, keywords made
keyword-only), and the pure-wheel exception was renamed (NonPlatformWheel, NonPlatformWheelError).
`_elfdata` passes what the installed release takes; both releases pass tests/unit/runtime/test_elffloor.py.

What torchbuild decides, not auditwheel: a site library (MPI, NCCL, the OFI plugin, the CUDA
driver and toolkit: SITE_LIBRARIES) is never bundled, so it does not keep a wheel from a
manylinux tag (`auditwheel repair --exclude`); any other library outside the policy's whitelist
does (it would have to be bundled, and torchbuild does not graft). The ISA-extension check is not
made: a site's profile may build for its own CPUs (x86-64-v3 at the Alliance) on purpose.

Bounds: the wheel is opened only if it is at most WHEEL_LIMIT bytes with at most MEMBERS_LIMIT
members that unpack to at most UNPACKED_LIMIT bytes (its central directory says so before
auditwheel unpacks it); libstdc++ is read for its version definitions only below LIB_LIMIT.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import inspect
import re
import shlex
import tempfile
import typing
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from torchbuild.core import glibc
from torchbuild.core.atomic import atomic_writer
from torchbuild.core.errors import FloorError, WheelError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.runtime.manifest import FloorRecord, LibraryRecord

if typing.TYPE_CHECKING:
    from torchbuild.profile.config import BuildSpec

WHEEL_LIMIT = 16 << 30  # a CUDA torch wheel is 1-3 GB
UNPACKED_LIMIT = 64 << 30
MEMBERS_LIMIT = 200_000
LIB_LIMIT = 256 << 20  # libstdc++.so.6 is ~2.5 MB

# sonames (fnmatch) that come from the site at run time and are never bundled into a wheel
SITE_LIBRARIES: tuple[str, ...] = (
    "libmpi*.so*",  # Open MPI, MPICH, cray-mpich (libmpi_cray), libmpicxx
    "libmpich*.so*",
    "libfabric.so*",
    "libpmi*.so*",
    "libucp.so*",
    "libucs.so*",
    "libnccl.so*",
    "libnccl-net*.so*",  # the aws-ofi-nccl plugin
    "libcuda.so*",  # the driver
    "libnvidia-ml.so*",
    "libcudart.so*",
    "libcublas*.so*",
    "libcufft*.so*",
    "libcurand.so*",
    "libcusolver*.so*",
    "libcusparse*.so*",
    "libcudnn*.so*",
    "libnvrtc*.so*",
    "libnvToolsExt.so*",
    "libnvJitLink.so*",
    "libcupti.so*",
    "libcufile*.so*",
    "libnvshmem*.so*",
)

_LOADER = re.compile(r"ld-linux.*|ld64\.so\.[12]")


def is_site_library(soname: str) -> bool:
    return any(fnmatch.fnmatchcase(soname, p) for p in SITE_LIBRARIES)


def check_bounds(wheel: Path) -> list[str]:
    """The wheel's member names, after its size, member count and unpacked size are checked
    against the limits (WheelError beyond them): what auditwheel then unpacks is bounded."""
    with named_os_errors(wheel, "reading the wheel for its ELF floor"):
        size = wheel.stat().st_size
        if size > WHEEL_LIMIT:
            raise WheelError(f"{wheel.name}: {size} bytes, more than the {WHEEL_LIMIT >> 30} GiB a wheel may have")
        try:
            with zipfile.ZipFile(wheel) as z:
                infos = z.infolist()
        except zipfile.BadZipFile as exc:
            raise WheelError(f"{wheel.name}: not a wheel (zip archive): {exc}") from None
    if len(infos) > MEMBERS_LIMIT or sum(i.file_size for i in infos) > UNPACKED_LIMIT:
        raise WheelError(
            f"{wheel.name}: {len(infos)} members, {sum(i.file_size for i in infos)} bytes unpacked: "
            f"beyond {MEMBERS_LIMIT} members or {UNPACKED_LIMIT >> 30} GiB"
        )
    return [i.filename for i in infos]


def _elfdata(wheel: Path) -> Any:
    """auditwheel's ELF data of the wheel (its versioned symbols, each ELF file's tree), with the
    parameters the installed release takes; None for a wheel without ELF files."""
    from auditwheel import error
    from auditwheel.wheel_abi import get_wheel_elfdata

    # a pure wheel: NonPlatformWheel in 6.4, NonPlatformWheelError from 6.5 on
    pure = getattr(error, "NonPlatformWheelError", None) or error.NonPlatformWheel
    params = inspect.signature(get_wheel_elfdata).parameters
    extra: dict[str, Any] = {"args_ldpaths": None} if "args_ldpaths" in params else {}
    try:
        return get_wheel_elfdata(None, None, wheel, frozenset(), **extra)
    except pure:
        return None
    except RuntimeError as exc:  # auditwheel's "shared library in purelib" refusal
        raise WheelError(f"{wheel.name}: {str(exc).splitlines()[0]}") from None


def auditwheel_version() -> str:
    from importlib.metadata import version

    return f"auditwheel {version('auditwheel')}"


@contextlib.contextmanager
def _unpacking_in(workdir: Path | None) -> Iterator[None]:
    """auditwheel unpacks the wheel with tempfile (a CUDA torch wheel: gigabytes) and takes no
    directory: within this block tempfile's default is workdir (the build's TMPDIR in its cache,
    not a node's small /tmp), restored after."""
    if workdir is None:
        yield
        return
    before = tempfile.tempdir
    tempfile.tempdir = str(workdir)
    try:
        yield
    finally:
        tempfile.tempdir = before


def analyse(wheel: Path, workdir: Path | None = None) -> FloorRecord:
    """The wheel's ELF floor and the manylinux tag it earns without bundling (FloorRecord.policy;
    "" with FloorRecord.reason saying why not). workdir: where auditwheel unpacks it (default
    the system's temporary directory)."""
    wheel = Path(wheel)
    members = check_bounds(wheel)
    with _unpacking_in(workdir):
        data = _elfdata(wheel)
    tool = auditwheel_version()
    if data is None:
        return FloorRecord(auditwheel=tool, reason="no ELF file in the wheel: it runs on any glibc")
    symbols: dict[str, set[str]] = {k: set(v) for k, v in data.versioned_symbols.items()}
    every = [v for vs in symbols.values() for v in vs]
    libraries = _libraries(data.full_elftree.values(), {Path(m).name for m in members})
    policy, reason = _earned(data.policies, symbols, libraries, wheel)
    return FloorRecord(
        glibc=glibc.newest(every, "GLIBC_"),
        glibcxx=glibc.newest(every, "GLIBCXX_"),
        cxxabi=glibc.newest(every, "CXXABI_"),
        libraries=tuple(libraries),
        policy=policy,
        reason=reason,
        auditwheel=tool,
    )


def _libraries(trees: Iterable[Any], inside: set[str]) -> list[LibraryRecord]:
    """Each library the wheel's ELF files need that the wheel does not hold, once, with the path
    it resolved to here ("" where it was not found) and whether it is a site library."""
    found: dict[str, LibraryRecord] = {}
    for tree in trees:
        for soname in tree.needed:
            if soname in inside or soname in found or _LOADER.fullmatch(soname):
                continue
            lib = tree.libraries.get(soname)
            path = str(lib.realpath) if lib is not None and lib.realpath is not None else ""
            found[soname] = LibraryRecord(soname=soname, path=path, site=is_site_library(soname))
    return sorted(found.values(), key=lambda r: r.soname)


def _earned(
    policies: Any, symbols: Mapping[str, set[str]], libraries: list[LibraryRecord], wheel: Path
) -> tuple[str, str]:
    """The manylinux policy the wheel's symbol versions meet, if every library it needs is in
    that policy's whitelist or a site library; else ("", why not)."""
    best = policies.versioned_symbols_policy(dict(symbols))
    if best.priority == 0:  # linux: no manylinux policy auditwheel knows allows these versions
        every = [v for vs in symbols.values() for v in vs]
        needs = ", ".join(f"{p}{glibc.newest(every, p)}" for p in ("GLIBC_", "GLIBCXX_") if glibc.newest(every, p))
        return "", f"its symbol versions ({needs}) are newer than any manylinux policy of {auditwheel_version()}"
    outside = [r.soname for r in libraries if not r.site and r.soname not in best.whitelist]
    if outside:
        return "", (
            f"it needs {', '.join(outside)}: outside the {best.name} whitelist and not a site library "
            "(bundling them is not torchbuild's to do)"
        )
    plats = set(platform_tags(wheel.name))
    machine = best.name.split("_", 3)[-1]  # manylinux_2_31_x86_64 -> x86_64
    if f"linux_{machine}" not in plats and best.name not in plats:
        return "", f"its platform tag ({', '.join(sorted(plats))}) is not linux_{machine}, its ELF files' machine"
    return best.name, ""


# --------------------------------------------------------------------------- the wheel's tag


def platform_tags(wheel_name: str) -> list[str]:
    return sorted({t.platform for t in parse_wheel_filename(wheel_name)[3]})


def tagged_name(wheel_name: str, policy: str) -> str:
    """The wheel's file name with its linux_<arch> platform tag replaced by policy
    (manylinux_2_31_x86_64)."""
    stem = wheel_name[: -len(".whl")]
    head, _, plats = stem.rpartition("-")
    kept = [p for p in plats.split(".") if not p.startswith("linux_")]
    return f"{head}-{'.'.join(sorted({*kept, policy}))}.whl"


# --------------------------------------------------------------------------- the toolchain


def libstdcxx_version(path: Path) -> str:
    """The newest GLIBCXX_ version the libstdc++ at path defines ("3.4.32"), read with pyelftools
    (auditwheel's ELF reader) from its version definitions; "" where it has none."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection

    with named_os_errors(path, "reading libstdc++ for its version"):
        if path.stat().st_size > LIB_LIMIT:
            raise FloorError(f"{path}: larger than {LIB_LIMIT >> 20} MiB; not read as libstdc++")
        with path.open("rb") as f:
            try:
                elf = ELFFile(f)
                names = [
                    aux.name
                    for section in elf.iter_sections()
                    if isinstance(section, GNUVerDefSection)
                    for _, auxiliaries in section.iter_versions()
                    for aux in auxiliaries
                ]
            except ELFError as exc:
                raise FloorError(f"{path}: not an ELF shared object ({exc})") from None
    return glibc.newest(names, "GLIBCXX_")


def retag(wheel: Path, policy: str) -> Path:
    """The wheel with its linux_<arch> tag replaced by policy, in its WHEEL file's Tag lines, its
    RECORD and its file name, as `auditwheel addtag` did: every other member copied as it was
    (names, times, modes, compression), so a canonical zip stays canonical. Written beside the
    wheel under its new name (the old file removed); the new path."""
    new = wheel.with_name(tagged_name(wheel.name, policy))
    if new == wheel:
        return wheel
    with named_os_errors(wheel, "re-tagging the wheel"), zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        dist_info = _dist_info(infos, wheel)
        wheel_meta = _retagged_wheel_file(src.read(f"{dist_info}/WHEEL").decode("utf-8"), policy)
        record = _retagged_record(src.read(f"{dist_info}/RECORD").decode("utf-8"), f"{dist_info}/WHEEL", wheel_meta)
        # fsync'd before the rename: the original is removed next, so a crash must leave one whole wheel
        with atomic_writer(new) as f, zipfile.ZipFile(f, "w") as dst:
            for info in infos:
                replaced = {f"{dist_info}/WHEEL": wheel_meta, f"{dist_info}/RECORD": record}.get(info.filename)
                if replaced is not None:
                    dst.writestr(info, replaced.encode("utf-8"), compress_type=info.compress_type)
                    continue
                with src.open(info) as data, dst.open(info, "w") as out:
                    while chunk := data.read(1 << 20):
                        out.write(chunk)
    wheel.unlink()
    return new


def _dist_info(infos: list[zipfile.ZipInfo], wheel: Path) -> str:
    found = {i.filename.split("/")[0] for i in infos if re.fullmatch(r"[^/]+\.dist-info/WHEEL", i.filename)}
    if len(found) != 1:
        raise WheelError(f"{wheel.name}: {len(found)} .dist-info/WHEEL files; a wheel has one")
    return found.pop()


def _retagged_wheel_file(text: str, policy: str) -> str:
    """WHEEL's text with each `Tag: py-abi-linux_<arch>` line replaced by the same with policy."""
    lines = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Tag" and value.strip().rsplit("-", 1)[-1].startswith("linux_"):
            line = f"Tag: {value.strip().rsplit('-', 1)[0]}-{policy}"
        if line not in lines or not line.startswith("Tag:"):
            lines.append(line)
    return "\n".join(lines) + "\n"


def _retagged_record(text: str, name: str, content: str) -> str:
    import base64
    import hashlib

    digest = base64.urlsafe_b64encode(hashlib.sha256(content.encode("utf-8")).digest()).rstrip(b"=").decode()
    out = []
    for line in text.splitlines():
        if line.split(",", 1)[0] == name:
            line = f"{name},sha256={digest},{len(content.encode('utf-8'))}"
        out.append(line)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- after the build


def measure(
    wheel: Path, glibc_floor: str, say: Callable[[str], None], workdir: Path | None = None
) -> tuple[Path, FloorRecord]:
    """The wheel's floor, and the wheel re-tagged with the manylinux policy it earns where the
    profile names a glibc_floor (the site said which systems it is for); said in one line. A
    floor that cannot be measured (auditwheel missing, an ELF file it cannot read) is recorded
    as such, and the wheel keeps its tag: the build made it, `invoke verify` judges it."""
    try:
        floor = analyse(wheel, workdir)
    except ImportError as exc:
        floor = FloorRecord(reason=f"not measured: auditwheel is not installed here ({exc.name})")
    except WheelError as err:
        floor = FloorRecord(reason=f"not measured: {err.message}")
    except Exception as exc:  # auditwheel's or pyelftools' own on an ELF file they cannot read
        floor = FloorRecord(reason=f"not measured: auditwheel: {type(exc).__name__}: {exc}")
    if floor.policy and not glibc_floor:
        floor = dataclasses.replace(
            floor, reason=f"keeps its tag: the profile names no glibc_floor (it earns {floor.policy})"
        )
    elif floor.policy:
        wheel = retag(wheel, floor.policy)
    floor = dataclasses.replace(floor, tag=".".join(platform_tags(wheel.name)))
    say(f"torchbuild: ELF floor of {wheel.name}: {floor.summary()}")
    return wheel, floor


def problems(floor: FloorRecord | None, glibc_floor: str, libstdcxx_floor: str) -> list[str]:
    """What in the wheel's floor is above the profile's (or a wheelhouse's) floors, one line each."""
    if not glibc_floor and not libstdcxx_floor:
        return []
    if floor is None or floor.reason.startswith("not measured"):
        return [f"its ELF floor is not known ({floor.reason if floor else 'no floor in its manifest'})"]
    out = []
    if glibc.above(floor.glibc, glibc_floor):
        out.append(f"needs GLIBC_{floor.glibc}, above the glibc_floor {glibc_floor}")
    if glibc.above(floor.glibcxx, libstdcxx_floor):
        out.append(f"needs GLIBCXX_{floor.glibcxx}, above the libstdcxx_floor {libstdcxx_floor}")
    return out


# --------------------------------------------------------------------------- before the build


def toolchain_libstdcxx(cxx: str, env: Mapping[str, str]) -> Path | None:
    """The libstdc++.so.6 the C++ compiler links against (`CXX -print-file-name=`), None where it
    does not say (a bare name back)."""
    argv = [*shlex.split(cxx), "-print-file-name=libstdc++.so.6"]
    try:
        done = run_captured(argv, env=env, timeout=QUERY_TIMEOUT)  # None: stopped at the deadline
    except OSError:
        return None
    path = Path(done.stdout.strip())
    return path if done.returncode == 0 and path.is_absolute() and path.is_file() else None


def check_toolchain(spec: BuildSpec, env: Mapping[str, str], where: str) -> str:
    """Refuse (FloorError) a toolchain whose glibc or libstdc++ is newer than the profile's floor,
    before anything compiles: every object it builds could need its newer symbols. where: "this
    host" or the image's base. The line to log when it passes ("" without a floor)."""
    if not spec.glibc_floor and not spec.libstdcxx_floor:
        return ""
    own = glibc.host_glibc()
    if spec.glibc_floor and glibc.above(own, spec.glibc_floor):
        raise FloorError(
            f"the toolchain's glibc is {own} ({where}), newer than the profile's glibc_floor {spec.glibc_floor} "
            f"({spec.origins.get('glibc_floor', 'the profile')}): the wheel would need GLIBC_{own} and fail to "
            "import on the site",
            hint=_fitting(spec),
        )
    said = [f"glibc {own or 'unknown'} <= {spec.glibc_floor}"] if spec.glibc_floor else []
    if spec.libstdcxx_floor:
        cxx = env.get("CXX") or spec.compilers.get("cxx") or "c++"
        lib = toolchain_libstdcxx(cxx, env)
        if lib is None:
            raise FloorError(
                f"{cxx} does not say which libstdc++ it links (-print-file-name=libstdc++.so.6): "
                f"the libstdcxx_floor {spec.libstdcxx_floor} cannot be checked",
                hint="set CXX to the compiler of the build, or leave libstdcxx_floor empty",
            )
        version = libstdcxx_version(lib)
        if glibc.above(version, spec.libstdcxx_floor):
            raise FloorError(
                f"the toolchain's libstdc++ ({lib}) defines GLIBCXX_{version}, newer than the profile's "
                f"libstdcxx_floor {spec.libstdcxx_floor}: the wheel could need it and fail to import on the site",
                hint=_fitting(spec),
            )
        said.append(f"GLIBCXX {version} <= {spec.libstdcxx_floor}")
    return f"torchbuild: toolchain meets the site's floor ({', '.join(said)})"


def _fitting(spec: BuildSpec) -> str:
    where = glibc.base_advice(spec.glibc_floor, spec.libstdcxx_floor)
    return f"{where}, or build natively on the site; or empty the floor (--set glibc_floor=) for a wheel for this base only"


# --------------------------------------------------------------------------- before an install


def recorded_or_measured(wheel: Path) -> FloorRecord:
    """The wheel's floor from its manifest beside it (`<wheel>.manifest.json`, schema 8 on) where
    that measured it and records this wheel's sha256; else measured now (auditwheel reads a CPU
    torch wheel in about a minute, hashing it takes seconds)."""
    from torchbuild.core.safeio import sha256_file
    from torchbuild.runtime import manifest

    path = Path(f"{wheel}{manifest.SUFFIX}")
    if path.is_file():
        m = manifest.read(path)
        recorded = m.floor
        if (
            recorded is not None
            and not recorded.reason.startswith("not measured")
            and m.wheel is not None
            and m.wheel.sha256 == sha256_file(wheel)
        ):
            return recorded
    return analyse(wheel)


def check_host(wheels: Iterable[Path], host: str | None = None) -> None:
    """FloorError naming each wheel whose shared objects need a newer glibc than this host's
    (host: its version, default the running one): `import` would fail there with
    `version 'GLIBC_2.xx' not found`. Nothing where the host's glibc is unknown (musl)."""
    own = glibc.host_glibc() if host is None else host
    if not own:
        return
    above = [(w, f.glibc) for w in wheels for f in (recorded_or_measured(w),) if glibc.above(f.glibc, own)]
    if above:
        names = ", ".join(f"{w.name} needs GLIBC_{v}" for w, v in above)
        fits = glibc.bases_meeting(own)
        raise FloorError(
            f"{names}; this host's glibc is {own}: importing it here would fail "
            f"(version 'GLIBC_{above[0][1]}' not found)",
            hint=(
                f'build it for this host: glibc_floor: "{own}" in the profile and a base that meets it'
                + (f" ({fits[0]})" if fits else "")
                + ", or install with --engine docker or apptainer (the image's glibc)"
            ),
        )
