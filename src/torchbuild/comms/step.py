"""The communication stack a Slingshot (or EFA) site needs under torch: NCCL built from source
for the profile's GPUs only, and the aws-ofi-nccl network plugin built against the site's
libfabric (`invoke comms`; `invoke build` runs it first when the profile has nccl: source).

On the host: everything that can be checked here (libfabric_prefix, which is bound at its own
path; natively also nvcc, make and autotools) is checked, every problem named at once; then the
sources are fetched (source/fetch.py's `fetch`: a download is checked against its sha256 before it is
unpacked) and unpacked into the cache. The prefix they are built into,
<cache>/comms/<key>, is named by a hash of everything that decides the result (versions, source
digests, arch list, libfabric, compilers, the image), so a rerun is a no-op.

The step, where the backend runs it (image, SIF or natively): checks libfabric and the tools
before anything compiles (all failures in one error), builds NCCL with `make src.lib` and
NVCC_GENCODE from cuda_arch_list, builds the plugin with autotools (`make install DESTDIR=`, an rpath to libfabric)
(each `make -j` planned where the step runs, as torch's build is, and resumed with fewer jobs
after an out-of-memory kill: oom.run_compile), checks what
it built (the plugin's ncclNetPlugin_v* symbols, `ldd`, ncclGetVersion) and writes
torchbuild-comms.json. All of it happens in <prefix>.partial-<run>, renamed to the prefix at the
end: a failure or an interrupt leaves no prefix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torchbuild.comms.nccl_arch import gencode, nccl_release
from torchbuild.comms.table import PLUGIN_LIBFABRIC_SOURCE, older, plugin_libfabric_min
from torchbuild.core.errors import (
    CommsFailed,
    ProfileError,
    ToolMissing,
    named_os_errors,
)
from torchbuild.core.problems import Problems
from torchbuild.core.process import QUERY_TIMEOUT, Finished, run_captured
from torchbuild.core.safeio import MANIFEST_LIMIT, MiB, read_bytes, read_json, user_path
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime import compile_job
from torchbuild.runtime.compile_job import CompileJob, into_place, now_utc
from torchbuild.runtime.environment import COMMS_DEPS, build_env, compile_env
from torchbuild.runtime.jobs import JobPlan
from torchbuild.runtime.libraries import (
    copy_dependencies,
    nccl_version_of,
    plugin_symbols_in,
    site_dependencies,
    unresolvable,
)
from torchbuild.runtime.manifest import write_json
from torchbuild.source.fetch import Source

COMMS_MANIFEST = "torchbuild-comms.json"
NCCL_ARCHIVE = "https://github.com/NVIDIA/nccl/archive/refs/tags/v{version}.tar.gz"
OFI_ARCHIVE = "https://github.com/aws/aws-ofi-nccl/archive/refs/tags/v{version}.tar.gz"
# sha256 of the release tags' archives as GitHub serves them (checked against the tarballs)
# (1.6.0 and 1.17.1 downloaded; the others computed from aws/aws-ofi-nccl's tags as GitHub makes
# its tag archives, `git archive --format=tar --prefix=aws-ofi-nccl-V/ vV | gzip -n -9`, which gives
# the two downloaded ones byte for byte; aws_ofi_nccl_sha256 overrides a pin)
OFI_PINS = {
    "1.6.0": "276f800583aa132f7f8a4d4a17795a1da228529d6e04eee6bd312b90b91487ad",
    "1.17.1": "4f6e0d0eb81d9c255a4f2f67f4934fcdffb15c854b932a6b806be6b1cecb7f80",
    "1.18.0": "5e3523bb6be7e23bbcd397f60165313f1a6a22c9d591b5733ba2d23b7c0791e9",
    "1.19.0": "65f31361f306e282e600d378d340a29a1002c005bf01eb0f68342fbd2fc9e94f",
    "1.19.1": "ae8c6a3e513511fb7c06494c5f90c2f150efdc9aa3f12fdecfc99ebab70c8b00",
    "1.19.2": "bea71ec6c954dc2eaeb97ddb9b13ee6c16202e4eb124d10a2396e7f95c1290e5",
    "1.20.0": "7a2c0ea48e8a1a72b310e11880cc7a31a5bef02207445ecae747599cd6e2c948",
    "1.21.0": "9f17e780958e9a77b298bf8e006dabbd21ba74758afb01b75ac28a1bde56267b",
    "1.21.1": "1612462f1cb8bad97d9cbe1e891a07c6f240d1746e1c5bfbe1b6196f24014f2a",
}
# plugin releases that do not compile against a newer libfabric major: 1.6.0 uses
# container_of, which libfabric 1.x defined in rdma/fabric.h and 2.0 no longer does
OFI_LIBFABRIC_MAX = {"1.6.0": 1}
HEADER_LIMIT = 4 * MiB  # rdma/fabric.h is some 30 KiB


# --------------------------------------------------------------------------- host side


def comms_key(
    spec: BuildSpec,
    nccl: Source | None,
    plugin: Source | None,
    image: str,
    libfabric_version: str = "",
    host_libs: str = "",
) -> str:
    """A hash of what decides the built libraries: a change of any gives another prefix. image:
    the image's id (the same for the SIF converted from it), a recipe SIF's own ID, or the
    host natively; libfabric_version: the site's libfabric at libfabric_prefix, read on the host
    (a site upgrading it in place rebuilds the plugin); host_libs: the digest of what that
    libfabric takes from the host's own directories, for a step in a container (comms/host.py)."""
    env = build_env(spec, cache_root="/cache", jobs=1)
    data: dict[str, object] = {
        "nccl": {"version": spec.nccl_version, "source": nccl.digest, "gencode": gencode(spec.cuda_arch_list)}
        if nccl
        else None,
        "plugin": {
            "version": spec.aws_ofi_nccl_version,
            "source": plugin.digest,
            "libfabric": spec.libfabric_prefix,
            **({"libfabric_version": libfabric_version} if libfabric_version else {}),
        }
        if plugin
        else None,
        "cuda_home": spec.cuda_home,
        "cuda_version": spec.cuda_version,
        # what configure and make see of the toolchain
        "toolchain": {k: env.get(k, "") for k in ("CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS")},
        "env": dict(spec.env),
        "image": image,
    }
    if spec.aws_ofi_nccl_configure and plugin:  # only when set: the keys of other profiles stay as they were
        data["plugin_configure"] = list(spec.aws_ofi_nccl_configure)
    if host_libs and plugin:
        data["host_libs"] = host_libs
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def comms_dir(spec: BuildSpec, key: str) -> str:
    """The prefix's directory name: readable versions, then the key."""
    parts = []
    if spec.nccl == "source":
        parts.append(f"nccl-{spec.nccl_version}")
    if spec.aws_ofi_nccl_version:
        parts.append(f"ofi-{spec.aws_ofi_nccl_version}")
    return "-".join(parts) + f"-{key[:12]}"


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        data = read_json(path, MANIFEST_LIMIT, "the comms manifest", CommsFailed)
    except CommsFailed as exc:
        raise CommsFailed(exc.message, hint=f"remove {path.parent} and run `invoke comms` again") from None
    if not isinstance(data, dict):
        raise CommsFailed(f"{path} is not a comms manifest", hint=f"remove {path.parent} and run `invoke comms` again")
    return data


def link_env(prefix: str, manifest: Mapping[str, Any]) -> dict[str, str]:
    """What PyTorch's CMake needs to link the built NCCL (FindNCCL reads these)."""
    if not manifest.get("nccl"):
        return {}
    return {
        "USE_SYSTEM_NCCL": "1",
        "NCCL_ROOT": prefix,
        "NCCL_INCLUDE_DIR": f"{prefix}/include",
        "NCCL_LIB_DIR": f"{prefix}/lib",
    }


# --------------------------------------------------------------------------- the step


@dataclasses.dataclass(frozen=True)
class Part:
    """A source tree the step builds (NCCL's, the plugin's) as the step sees it."""

    tree: str
    origin: str  # the URL or path it came from
    sha256: str  # its digest (Source.digest)

    @classmethod
    def of(cls, source: Source, tree: Path) -> Part:
        return cls(tree=str(tree), origin=source.origin, sha256=source.digest)


@dataclasses.dataclass(frozen=True)
class Request:
    """The comms step's request (plain data, as a backend hands it over)."""

    spec: BuildSpec
    key: str  # comms_key: names the prefix
    prefix: str  # where the step installs, as it sees it
    run_id: str  # its partial is <prefix>.partial-<run_id>
    nccl: Part | None = None
    plugin: Part | None = None
    image: Mapping[str, Any] | None = None
    engine: str = "native"
    jobs: int = 0  # --jobs; 0: planned where the step runs
    oom_retry: bool = True
    # the host's libraries the site's libfabric links, copied for a step in a container ("": none)
    host_libs: str = ""

    @property
    def partial(self) -> Path:
        prefix = Path(self.prefix)
        return prefix.with_name(f"{prefix.name}.partial-{self.run_id}")


def run_comms_step(req: Request) -> int:
    """The `comms` step (steps.STEPS parses what the backend hands over into req); a failure or
    an interrupt leaves no partial prefix."""
    try:
        _Step(req).run()
    except BaseException:
        shutil.rmtree(req.partial, ignore_errors=True)
        raise
    return 0


def libfabric_root(spec: BuildSpec) -> Path:
    return Path(spec.libfabric_prefix or "/usr")


def no_libfabric(message: str) -> ProfileError:
    return ProfileError(
        message,
        hint="set libfabric_prefix to the directory holding include/rdma/fabric.h and lib/libfabric.so "
        "(`module show libfabric`), or add libfabric-dev to the image",
    )


def check_libfabric(spec: BuildSpec) -> tuple[Path, tuple[int, int]]:
    """The libfabric the plugin is built against (libfabric_prefix, else /usr where the step
    runs) and its version; ProfileError when it is not there, or too old or too new for the plugin."""
    root = libfabric_root(spec)
    where = "libfabric_prefix" + ("" if spec.libfabric_prefix else " (empty: the image's own, /usr)")
    if not root.is_dir():
        raise no_libfabric(f"{where}: no libfabric at {root} (not a directory)")
    header = root / "include" / "rdma" / "fabric.h"
    library = find_library(root, "libfabric.so") or find_library(root, "libfabric.so.1")
    if not header.is_file() or library is None:
        lacking = "include/rdma/fabric.h" if not header.is_file() else "lib/libfabric.so"
        raise no_libfabric(f"{where}: no libfabric at {root} (no {lacking})")
    version = libfabric_version(header)
    oldest = plugin_libfabric_min(spec.aws_ofi_nccl_version)
    if older(f"{version[0]}.{version[1]}", oldest):
        raise ProfileError(
            f"aws_ofi_nccl_version: {spec.aws_ofi_nccl_version}'s configure needs libfabric >= {oldest}; the one at "
            f"{root} is {version[0]}.{version[1]} ({PLUGIN_LIBFABRIC_SOURCE})",
            hint=f"point libfabric_prefix at a libfabric {oldest} or newer",
        )
    newest = OFI_LIBFABRIC_MAX.get(spec.aws_ofi_nccl_version)
    if newest is not None and version[0] > newest:
        raise ProfileError(
            f"aws_ofi_nccl_version: {spec.aws_ofi_nccl_version} does not compile against libfabric "
            f"{version[0]}.{version[1]} at {root} (it needs libfabric {newest}.x: it uses container_of, "
            f"which libfabric 2.0 removed from rdma/fabric.h)",
            hint="use aws_ofi_nccl_version 1.17.1 (libfabric >= 1.18), or a libfabric 1.x libfabric_prefix",
        )
    return root, version


def plugin_needs_autotools(spec: BuildSpec) -> bool | None:
    """Whether the plugin's source has no configure script (autogen.sh then needs autotools):
    True for a release's tag archive (the default source), a local tree's own answer, None
    (not known before it is fetched) for any other source; False without a plugin."""
    if not spec.aws_ofi_nccl_version:
        return False
    if not spec.aws_ofi_nccl_source:
        return True
    tree = user_path(spec.aws_ofi_nccl_source)
    return not (tree / "configure").exists() if tree.is_dir() else None


def tool_problems(spec: BuildSpec, nccl: bool, autotools: bool | None, path: str | None) -> list[ToolMissing]:
    """What the step lacks to compile: nvcc (for NCCL), make, and autoreconf and libtoolize
    when the plugin's tree has no configure script."""
    problems = []
    nvcc = Path(spec.cuda_home) / "bin" / "nvcc"
    if nccl and not nvcc.exists():
        problems.append(
            ToolMissing(f"nvcc is not at {nvcc} (cuda_home): NCCL's device code needs it", hint="set cuda_home")
        )
    tools = ["make", *(["autoreconf", "libtoolize"] if autotools else [])]
    missing = [t for t in tools if shutil.which(t, path=path) is None]
    if missing:
        problems.append(
            ToolMissing(
                f"{', '.join(missing)} not found where comms runs",
                hint="install them, or rebuild the image (`invoke image`: a profile with a plugin adds autoconf, "
                "automake, libtool)",
            )
        )
    return problems


def libfabric_version(header: Path) -> tuple[int, int]:
    """FI_MAJOR_VERSION and FI_MINOR_VERSION from rdma/fabric.h."""
    text = read_bytes(header, HEADER_LIMIT, "libfabric_prefix: rdma/fabric.h", ProfileError).decode(errors="replace")
    found = [re.search(rf"#define\s+FI_{part}_VERSION\s+(\d+)", text) for part in ("MAJOR", "MINOR")]
    if not all(found):
        raise ProfileError(f"libfabric_prefix: {header} does not define FI_MAJOR_VERSION", hint="point it at libfabric")
    return int(found[0][1]), int(found[1][1])  # type: ignore[index]


def find_library(root: Path, name: str) -> Path | None:
    """root/lib, lib64 or the Debian multiarch directory holding name."""
    for sub in ("lib", "lib64", f"lib/{_multiarch()}"):
        candidate = root / sub / name
        if candidate.exists():
            return candidate
    return None


def _multiarch() -> str:
    return {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(os.uname().machine, "")


# the file `make dist` writes, which m4/get_version.sh reads first (aws-ofi-nccl 1.19.0 and later)
RELEASE_VERSION_FILE = ".release_version"


def _release_version_file(tree: Path, version: str) -> None:
    """From 1.19.0 the plugin's configure.ac takes its version from m4/get_version.sh (AC_INIT): a
    git checkout's tag, else the .release_version of a `make dist` tarball, else it stops ("No
    version found ... Cannot continue."). GitHub's tag archive, the default source, has neither:
    write aws_ofi_nccl_version there, as `make dist` would. A git checkout (.git) keeps its own."""
    if not (tree / "m4" / "get_version.sh").is_file():
        return
    if (tree / RELEASE_VERSION_FILE).exists() or (tree / ".git").exists():
        return
    with named_os_errors(tree, "the plugin's source copy"):
        (tree / RELEASE_VERSION_FILE).write_text(version + "\n")
    print(f"comms: wrote {RELEASE_VERSION_FILE} ({version}) for the plugin's m4/get_version.sh", flush=True)


def version_code(version: str) -> int:
    major, minor, patch = nccl_release(version)
    return major * 1000 + minor * 100 + patch if (major, minor) <= (2, 8) else major * 10000 + minor * 100 + patch


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class _Stdout:
    """oom.run_compile's sink for the step: its output streams to stdout, as the step's does."""

    path = Path("the output above")

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def line(self, text: str = "") -> None:
        print(text, flush=True)


class _Step:
    def __init__(self, req: Request) -> None:
        self.req, self.spec = req, req.spec
        self.prefix, self.partial = Path(req.prefix), req.partial
        # NCCL's make compiles device code with nvcc (the CUDA per-job peak), the plugin's is C++;
        # both planned where the step runs (its cores and memory: an allocation's, a container's)
        # unless --jobs fixed them
        self.cache_root = str(self.prefix.parent.parent)
        self.plans = {
            part: compile_job.plan(self.spec, self.cache_root, req.jobs, kind=kind)
            for part, kind in (("nccl", "cuda"), ("plugin", "cxx"))
            if getattr(req, part) is not None
        }
        # the step's environment (configure, checks) has the smallest plan's jobs; each make its own
        smallest = min(self.plans.values(), key=lambda p: p.jobs, default=JobPlan(1, "no make"))
        self.env_vars = compile_env(self.spec, smallest, self.cache_root)
        self.env = {**os.environ, **self.env_vars}
        self.started, self.t0 = now_utc(), time.monotonic()

    def run(self) -> None:
        lf = self._check_before_compiling()
        with named_os_errors(self.partial, "the comms prefix"):
            shutil.rmtree(self.partial, ignore_errors=True)
            self.partial.mkdir(parents=True)
        nccl = self._nccl() if self.req.nccl else None
        plugin = self._plugin(lf) if self.req.plugin else None
        shutil.rmtree(self.partial / "work", ignore_errors=True)
        step = CompileJob(
            self.spec, JobPlan(0, ""), self.env_vars, self.env, _Stdout(), started=self.started, t0=self.t0
        )
        record = step.record()  # times, toolchain, ccache's figures, torchbuild's version
        manifest = {
            "schema_version": 1,
            "torchbuild_version": record["torchbuild_version"],
            "profile": self.spec.profile,
            "key": self.req.key,
            "prefix": str(self.prefix),
            "engine": self.req.engine,
            "image": dict(self.req.image) if self.req.image is not None else None,
            "cuda_version": self._nvcc_version(),
            "compiler": self.env.get("CXX", ""),
            "nccl": nccl,
            "plugin": plugin,
            **{k: record[k] for k in ("started", "finished", "duration_s", "toolchain", "ccache")},
        }
        write_json(self.partial / COMMS_MANIFEST, manifest, "writing the comms manifest")
        # another run that finished the same key meanwhile keeps its prefix
        into_place(self.partial, self.prefix, "the comms prefix", keep_existing=True)

    # -- checks before anything compiles

    def _check_before_compiling(self) -> tuple[Path, tuple[int, int]] | None:
        """Every tool and libfabric check, all failures named at once, before anything compiles."""
        problems = Problems()
        plugin = self.req.plugin
        # a release archive of a git tag has no configure: autogen.sh needs autotools
        autotools = plugin is not None and not (Path(plugin.tree) / "configure").exists()
        for problem in tool_problems(self.spec, self.req.nccl is not None, autotools, self.env.get("PATH")):
            problems.add(problem)
        lf = problems.check(lambda: check_libfabric(self.spec)) if plugin else None
        problems.raise_any()
        return lf

    # -- NCCL

    def _nccl(self) -> dict[str, Any]:
        src = self.req.nccl
        assert src is not None
        t0 = time.monotonic()
        work = self.partial / "work" / "nccl"
        shutil.copytree(src.tree, work, symlinks=True)
        build = self.partial / "work" / "nccl-build"
        cuda_lib = find_library(Path(self.spec.cuda_home), "libcudart_static.a")
        flags = gencode(self.spec.cuda_arch_list)
        args = [
            "src.lib",
            f"BUILDDIR={build}",
            f"CUDA_HOME={self.spec.cuda_home}",
            f"NVCC_GENCODE={flags}",
            f"CXX={self.env.get('CXX', 'g++')}",
        ]
        if cuda_lib is not None:
            args.append(f"CUDA_LIB={cuda_lib.parent}")
        print(f"building NCCL {self.spec.nccl_version} for {', '.join(self.spec.cuda_arch_list)} ({flags})", flush=True)
        used = self._compile(
            lambda n: ["make", "-C", str(work), f"-j{n}", *args], "building NCCL", self.plans["nccl"], work, self.env
        )
        for sub in ("include", "lib"):
            shutil.copytree(build / sub, self.partial / sub, symlinks=True, dirs_exist_ok=True)
        library = self.partial / "lib" / "libnccl.so.2"
        code = self._nccl_version_code(library, src.origin)
        return {
            "version": self.spec.nccl_version,
            "version_code": code,
            "source": src.origin,
            "sha256": src.sha256,
            "gencode": flags,
            "arch_list": list(self.spec.cuda_arch_list),
            "library": "lib/" + library.resolve().name,
            "jobs": used,
            "seconds": round(time.monotonic() - t0, 1),
            "size_bytes": _size(self.partial / "lib") + _size(self.partial / "include"),
        }

    def _nccl_version_code(self, library: Path, origin: str) -> int:
        """The version code of the NCCL built from origin; CommsFailed unless it is nccl_version's."""
        code = nccl_version_of(library)
        if code != version_code(self.spec.nccl_version):
            raise CommsFailed(
                f"the NCCL built from {origin} reports version code {code}, not "
                f"{version_code(self.spec.nccl_version)} (nccl_version {self.spec.nccl_version})",
                hint="set nccl_version to the release of nccl_source",
            )
        return code

    # -- the plugin

    def _plugin(self, lf: tuple[Path, tuple[int, int]] | None) -> dict[str, Any]:
        assert lf is not None
        root, version = lf
        src = self.req.plugin
        assert src is not None
        t0 = time.monotonic()
        work = self.partial / "work" / "aws-ofi-nccl"
        shutil.copytree(src.tree, work, symlinks=True)
        if not (work / "configure").exists():
            _release_version_file(work, self.spec.aws_ofi_nccl_version)
            # autogen.sh has no #! line in the release archives: run it with sh
            self._call(["sh", "./autogen.sh"], "aws-ofi-nccl autogen.sh", cwd=work)
        args = self._configure_args(root)
        env, lib_dirs = self._libfabric_env(root)
        self._call(["./configure", *args], "aws-ofi-nccl configure", cwd=work, env=env)
        used = self._compile(lambda n: ["make", f"-j{n}"], "building aws-ofi-nccl", self.plans["plugin"], work, env)
        library = self._install_plugin(work, env)
        deps = self._plugin_deps(library, root, lib_dirs)
        # dlopen'ed as NCCL does, with what it carries: its lib/ and deps/lib alone on top
        symbols = plugin_symbols_in(library, self._ld_env(str(self.partial / COMMS_DEPS)))
        if not symbols:
            raise CommsFailed(f"{library.name} exports no ncclNetPlugin_v* symbol: NCCL would not use it")
        return {
            "version": self.spec.aws_ofi_nccl_version,
            "source": src.origin,
            "sha256": src.sha256,
            "libfabric_prefix": str(root),
            "libfabric_version": f"{version[0]}.{version[1]}",
            "configure": args,
            "library": f"lib/{library.name}",
            "symbols": symbols,
            "deps": deps,
            "jobs": used,
            "seconds": round(time.monotonic() - t0, 1),
            "size_bytes": sum(
                p.stat().st_size for p in (self.partial / "lib").glob("libnccl-*") if p.is_file() and not p.is_symlink()
            ),
        }

    def _configure_args(self, root: Path) -> list[str]:
        """The plugin's configure options: the prefix, the site's libfabric at root, CUDA, then the profile's own."""
        args = [f"--prefix={self.prefix}", "--disable-tests", "--disable-platform-aws"]
        # their configure adds -isystem <path>/include: never /usr, which breaks g++'s <cstdlib>
        if str(root) != "/usr":
            args.append(f"--with-libfabric={root}")
        args.append(f"--with-cuda={self._cuda_for_configure()}")
        args += self.spec.aws_ofi_nccl_configure  # the profile's own options, validated by config
        return args

    def _libfabric_env(self, root: Path) -> tuple[dict[str, str], list[str]]:
        """The plugin build's environment, linking the site's libfabric (at root) with an rpath to it, and the
        library directories it needs: libfabric's own, then the links to host libraries it lacks (_from_host)."""
        env = dict(self.env)
        lib_dir = self._libfabric_dir(root)
        if lib_dir is not None:
            env["LDFLAGS"] = f"{env.get('LDFLAGS', '')} -Wl,-rpath,{lib_dir}".strip()
        lib_dirs = [str(d) for d in (lib_dir, self._from_host(lib_dir)) if d is not None]
        if len(lib_dirs) > 1:  # the linker must find what libfabric links, as the loader will
            env["LDFLAGS"] = f"{env['LDFLAGS']} -Wl,-rpath-link,{lib_dirs[1]}"
            env["LD_LIBRARY_PATH"] = ":".join(p for p in (*lib_dirs, env.get("LD_LIBRARY_PATH", "")) if p)
        return env, lib_dirs

    def _libfabric_dir(self, root: Path) -> Path | None:
        """The directory of the site's libfabric.so (None: /usr's, or none found)."""
        lib = find_library(root, "libfabric.so") or find_library(root, "libfabric.so.1")
        return lib.parent if lib is not None and str(root) != "/usr" else None

    def _install_plugin(self, work: Path, env: Mapping[str, str]) -> Path:
        """`make install` into the partial prefix (without libtool's .la files); the plugin library."""
        stage = self.partial / "work" / "stage"
        self._call(["make", "install", f"DESTDIR={stage}"], "installing aws-ofi-nccl", cwd=work, env=env)
        shutil.copytree(stage / str(self.prefix).lstrip("/"), self.partial, symlinks=True, dirs_exist_ok=True)
        for la in self.partial.glob("lib/*.la"):
            la.unlink()
        for name in ("libnccl-net-ofi.so", "libnccl-net.so"):
            if (self.partial / "lib" / name).exists():
                return self.partial / "lib" / name
        raise CommsFailed(f"aws-ofi-nccl {self.spec.aws_ofi_nccl_version} installed no libnccl-net*.so")

    def _from_host(self, lib_dir: Path | None) -> Path | None:
        """A directory of links to the host's libraries (req.host_libs) that libfabric links and
        this container does not have (Cray's libcxi); None when it lacks nothing."""
        if lib_dir is None or not self.req.host_libs:
            return None
        library = find_library(lib_dir.parent, "libfabric.so.1") or lib_dir / "libfabric.so"
        lacking = unresolvable(library, self._ld_env(str(lib_dir)))
        if not lacking:
            return None
        links = self.partial / "work" / "host-libs"
        links.mkdir(parents=True, exist_ok=True)
        host = Path(self.req.host_libs)
        for name in lacking:
            if not (host / name).exists():
                raise CommsFailed(
                    f"libfabric at {self.spec.libfabric_prefix} needs {name}, found neither in the container "
                    "nor on the host",
                    hint="load the site's libfabric module (its dependencies on LD_LIBRARY_PATH) and run again",
                )
            (links / name).symlink_to(host / name)
        print(f"comms: libfabric links {', '.join(lacking)} from the host (not in this container)", flush=True)
        return links

    def _plugin_deps(self, library: Path, root: Path, lib_dirs: Sequence[str]) -> list[dict[str, Any]]:
        """The plugin's site dependencies copied into <prefix>/deps/lib, so that it loads where
        the site's libraries are not (a container): every library of its closure, as the loader
        resolves it here, under libfabric_prefix or outside the system's library directories
        (libraries.site_dependencies). The loader looks in libfabric's directory too, as the
        site's libfabric module has it. A dependency that does not resolve is CommsFailed."""
        env = self._ld_env(*lib_dirs)
        deps = site_dependencies(library, [root] if str(root) != "/usr" else [], env)
        with named_os_errors(self.partial / COMMS_DEPS, "copying the plugin's site dependencies"):
            copied = copy_dependencies(deps, self.partial / COMMS_DEPS)
        if copied:
            print(f"comms: {library.name} carries {', '.join(d['name'] for d in copied)} in {COMMS_DEPS}", flush=True)
        return copied

    def _cuda_for_configure(self) -> str:
        """--with-cuda: cuda_home, but Debian's /usr layout as /usr/lib/cuda (configure would add
        -isystem /usr/include and look for libraries in /usr/lib64)."""
        home = Path(self.spec.cuda_home)
        if str(home) == "/usr" and Path("/usr/lib/cuda").is_dir():
            return "/usr/lib/cuda"
        return str(home)

    def _ld_env(self, *more: str) -> dict[str, str]:
        """The step's environment, the partial prefix's lib/ (then more) first on LD_LIBRARY_PATH."""
        env = dict(self.env)
        dirs = (str(self.partial / "lib"), *more, env.get("LD_LIBRARY_PATH", ""))
        env["LD_LIBRARY_PATH"] = ":".join(p for p in dirs if p)
        return env

    def _nvcc_version(self) -> str:
        nvcc = Path(self.spec.cuda_home) / "bin" / "nvcc"
        if not nvcc.exists():
            return ""
        proc = run_captured([str(nvcc), "--version"], timeout=QUERY_TIMEOUT)
        found = re.search(r"release (\d+\.\d+)", proc.stdout)
        return found[1] if found else ""

    def _compile(
        self, cmd_for: Callable[[int], Sequence[str]], what: str, plan: JobPlan, cwd: Path, env: Mapping[str, str]
    ) -> dict[str, Any]:
        """A make -j of plan.jobs in cwd, resumed with fewer jobs after an out-of-memory kill (make
        keeps what it built) unless --no-retry; what it used, as a build manifest's jobs record."""
        print(f"comms: {what} with {plan.jobs} jobs ({plan.reason})", flush=True)
        job = CompileJob(self.spec, plan, self.env_vars, dict(env), _Stdout(), self.req.oom_retry)

        def failed(done: Finished) -> CommsFailed:
            return CommsFailed(f"{what} failed (exit {done.returncode}): {' '.join(cmd_for(job.jobs.current)[:4])}")

        with named_os_errors(cwd, what):
            job.compile(cmd_for, cwd=str(cwd), what=what, failure=failed)
        return job.jobs_record()

    def _call(
        self, cmd: Sequence[str], what: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        from torchbuild.core.process import run_streamed

        def line(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        with named_os_errors(cwd or cmd[0], what):
            done = run_streamed(list(cmd), on_line=line, env=dict(env or self.env), cwd=str(cwd) if cwd else None)
        if done.returncode != 0:
            raise CommsFailed(f"{what} failed (exit {done.returncode}): {' '.join(cmd[:4])}")
