"""`invoke comms` without CUDA or libfabric: NCCL and aws-ofi-nccl stand-ins compiled here by gcc
(a Makefile with a `src.lib` target, an autogen.sh/configure/Makefile plugin linking a fake
libfabric) go through the real fetch, key, step and checks; the plugin's symbols, `ldd`,
ncclGetVersion and the verify checks run against real shared libraries; the SIF, image,
backend and manifest pieces that carry the result are checked as text and data."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import TEST_TORCH, make_wheel

from torchbuild.builder.host import _comms as runner_comms
from torchbuild.comms.host import comms
from torchbuild.comms.step import (
    COMMS_MANIFEST,
    HEADER_LIMIT,
    Part,
    _Step,
    comms_dir,
    comms_key,
    link_env,
    read_manifest,
    version_code,
)
from torchbuild.comms.step import Request as CommsRequest
from torchbuild.core import records
from torchbuild.core.errors import (
    CommsFailed,
    OutOfMemory,
    ProfileError,
    SifError,
    SourceError,
    ToolMissing,
    UsageError,
)
from torchbuild.core.safeio import MANIFEST_LIMIT, sha256_file
from torchbuild.image.host import apt_packages, comms_packages, tree_digest
from torchbuild.profile.config import resolve
from torchbuild.runtime import manifest as mf
from torchbuild.runtime.apptainer import SIF_COMMS, runtime_binds, sif_id
from torchbuild.runtime.backends import Binds, Options, choose, container_view
from torchbuild.runtime.backends.apptainer import ApptainerBackend, run_args, sif_record
from torchbuild.runtime.backends.native import NativeBackend
from torchbuild.runtime.environment import comms_install_env, comms_runtime_env
from torchbuild.runtime.jobs import GiB, HostResources, plan_make
from torchbuild.runtime.libraries import (
    copy_dependencies,
    host_dependencies,
    nccl_version_of,
    plugin_symbols,
    plugin_symbols_in,
    resolved,
    site_dependencies,
    system_dirs,
    unresolvable,
    unresolved,
)
from torchbuild.runtime.steps import run_step
from torchbuild.sif.host import definition, environment_section, runtime_hash
from torchbuild.source.fetch import Source, download, fetch
from torchbuild.verify.host import comms_for_verify
from torchbuild.verify.step import comms_checks

CUDA = [TEST_TORCH, "cuda_version=12.4", 'cuda_arch_list=["9.0"]', "distributed=[gloo, nccl]"]
LINKED = "torch links the NCCL comms built"


# --------------------------------------------------------------------------- building blocks


def _so(path: Path, code: str, *args: str) -> Path:
    """path, a shared library gcc compiles from code (C) with extra link args."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / f"{path.name}.c"
    src.write_text(code)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src), *args], check=True, capture_output=True)
    src.unlink()
    return path


def _libfabric(root: Path, major: int = 2, minor: int = 1, lib: str = "lib") -> Path:
    """A libfabric prefix: include/rdma/fabric.h with its version, lib/libfabric.so(.1)."""
    (root / "include" / "rdma").mkdir(parents=True)
    (root / "include" / "rdma" / "fabric.h").write_text(
        f"#define FI_MAJOR_VERSION {major}\n#define FI_MINOR_VERSION {minor}\nint fi_version(void);\n"
    )
    so = _so(
        root / lib / "libfabric.so.1",
        f"int fi_version(void) {{ return {major * 1000 + minor}; }}\n",
        "-Wl,-soname,libfabric.so.1",
    )
    (root / lib / "libfabric.so").symlink_to(so.name)
    return root


def _cuda_home(root: Path) -> Path:
    """A cuda_home whose bin/nvcc says `release 12.4` (NCCL's make is a stand-in: no nvcc runs)."""
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    return root


def _plugin_c(symbols: tuple[int, ...]) -> str:
    exported = "".join(f"int ncclNetPlugin_v{v} = {v};\n" for v in symbols)
    return f"#include <rdma/fabric.h>\n{exported}int plugin_init(void) {{ return fi_version(); }}\n"


def _nccl_tree(root: Path, code: int) -> Path:
    """NCCL's layout as far as `make src.lib BUILDDIR=...` goes: lib/libnccl.so.2(.x.y) and
    include/nccl.h under BUILDDIR; ncclGetVersion returns code."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "nccl.cc").write_text(f'extern "C" int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n')
    (root / "src" / "nccl.h").write_text("int ncclGetVersion(int *version);\n")
    (root / "Makefile").write_text(
        "BUILDDIR ?= build\n"
        "src.lib:\n"
        '\t@echo "NVCC_GENCODE=$(NVCC_GENCODE)"\n'
        "\tmkdir -p $(BUILDDIR)/lib $(BUILDDIR)/include\n"
        "\t$(CXX) -shared -fPIC -o $(BUILDDIR)/lib/libnccl.so.2.21.5 src/nccl.cc -Wl,-soname,libnccl.so.2\n"
        "\tln -sf libnccl.so.2.21.5 $(BUILDDIR)/lib/libnccl.so.2\n"
        "\tln -sf libnccl.so.2 $(BUILDDIR)/lib/libnccl.so\n"
        "\tcp src/nccl.h $(BUILDDIR)/include/nccl.h\n"
    )
    return root


CONFIGURE = """#!/bin/sh
prefix=/usr/local
libfabric=/usr
for a in "$@"; do
  case "$a" in
    --prefix=*) prefix="${a#--prefix=}" ;;
    --with-libfabric=*) libfabric="${a#--with-libfabric=}" ;;
  esac
done
echo "$@" > config.args
sed -e "s|@prefix@|$prefix|g" -e "s|@libfabric@|$libfabric|g" Makefile.in > Makefile
"""


def _plugin_tree(root: Path, symbols: tuple[int, ...] = (6, 8)) -> Path:
    """aws-ofi-nccl's layout as a GitHub archive has it (autogen.sh, no configure): it links
    -lfabric with $(LDFLAGS), which carries the rpath the step adds, and installs a .la."""
    root.mkdir(parents=True)
    (root / "plugin.c").write_text(_plugin_c(symbols))
    (root / "configure.sh").write_text(CONFIGURE)
    # as in the release archives: no #! line (run with sh)
    (root / "autogen.sh").write_text("cp configure.sh configure && chmod +x configure\n")
    (root / "autogen.sh").chmod(0o755)
    (root / "Makefile.in").write_text(
        "prefix = @prefix@\n"
        "LIBFABRIC = @libfabric@\n"
        "all: libnccl-net.so\n"
        "libnccl-net.so: plugin.c\n"
        "\t$(CC) -shared -fPIC -o libnccl-net.so plugin.c -I$(LIBFABRIC)/include -L$(LIBFABRIC)/lib -lfabric $(LDFLAGS)\n"
        "install: all\n"
        "\tmkdir -p $(DESTDIR)$(prefix)/lib\n"
        "\tcp libnccl-net.so $(DESTDIR)$(prefix)/lib/\n"
        "\techo '# libtool archive' > $(DESTDIR)$(prefix)/lib/libnccl-net.la\n"
    )
    return root


def _tarball(tree: Path, dest: Path) -> tuple[Path, str]:
    """tree as dest (a .tar.gz with tree's name as its top directory) and its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    return dest, sha256_file(dest)


@pytest.fixture(scope="module", autouse=True)
def autotools_on_path(tmp_path_factory) -> Iterator[None]:
    """autoreconf and libtoolize, which the step requires for a tree without configure (the
    stand-in's autogen.sh does not call them): this machine need not have autotools."""
    tools = tmp_path_factory.mktemp("autotools")
    for name in ("autoreconf", "libtoolize"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
        (tools / name).chmod(0o755)
    before = os.environ["PATH"]
    os.environ["PATH"] = f"{tools}:{before}"
    try:
        yield
    finally:
        os.environ["PATH"] = before


@dataclasses.dataclass
class Site:
    """What a profile with NCCL from source and the plugin points at, all under one tmp dir."""

    root: Path
    fabric: Path
    cuda: Path
    cache: Path
    sets: list[str]

    def spec(self, *more: str):
        return resolve("cpu", [*self.sets, *more])


def _site(root: Path, *, nccl_code: int = 22105, symbols: tuple[int, ...] = (6, 8), plugin_version="1.17.1") -> Site:
    fabric = _libfabric(root / "libfabric")
    cuda = _cuda_home(root / "cuda")
    nccl, nccl_sha = _tarball(_nccl_tree(root / "src" / "nccl-2.21.5-1", nccl_code), root / "dl" / "nccl.tar.gz")
    ofi, ofi_sha = _tarball(_plugin_tree(root / "src" / "aws-ofi-nccl-1.17.1", symbols), root / "dl" / "ofi.tar.gz")
    cache = root / "cache"
    sets = [
        *CUDA,
        "nccl=source",
        f"nccl_source={nccl}",
        f"nccl_sha256={nccl_sha}",
        f"aws_ofi_nccl_version={plugin_version}",
        f"aws_ofi_nccl_source={ofi}",
        f"aws_ofi_nccl_sha256={ofi_sha}",
        f"libfabric_prefix={fabric}",
        f"cuda_home={cuda}",
        f"cache_dir={cache}",
    ]
    return Site(root, fabric, cuda, cache, sets)


@dataclasses.dataclass
class Built:
    site: Site
    made: Any  # comms.Comms
    first_output: str


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    """`invoke comms` natively, once for the module: NCCL and the plugin from the stand-ins."""
    site = _site(tmp_path_factory.mktemp("site"))
    spec = site.spec()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # the step's output goes to stdout, as it streams
        made = comms(spec, choose(spec, "native", Options()), out_dir=site.root / "out", out=out)
    return Built(site, made, out.getvalue())


# --------------------------------------------------------------------------- fetch and download


def _archive(tmp_path: Path, name: str = "aws-ofi-nccl-1.17.1", text: str = "plugin\n") -> tuple[Path, str]:
    tree = tmp_path / "trees" / name
    tree.mkdir(parents=True)
    (tree / "README").write_text(text)
    return _tarball(tree, tmp_path / "dl" / f"{name}.tar.gz")


def test_fetch_unpacks_a_tarball_with_its_sha256_into_the_cache(tmp_path):
    tarball, sha = _archive(tmp_path)
    src = fetch("aws_ofi_nccl", str(tarball), "https://unused.invalid/x.tar.gz", sha, tmp_path / "cache", io.StringIO())
    assert src.digest == sha and src.origin == str(tarball)
    assert src.tree.is_relative_to(tmp_path / "cache" / "comms-src")
    assert (src.tree / "README").read_text() == "plugin\n"


def test_fetch_refuses_a_tarball_whose_sha256_differs_and_unpacks_nothing(tmp_path):
    tarball, sha = _archive(tmp_path)
    with pytest.raises(SourceError) as exc:
        fetch("aws_ofi_nccl", str(tarball), "", "0" * 64, tmp_path / "cache", io.StringIO())
    assert "aws_ofi_nccl_source" in exc.value.message and sha in exc.value.message and "0" * 64 in exc.value.message
    assert not (tmp_path / "cache" / "comms-src").exists()


def test_fetch_of_a_path_that_does_not_exist_names_the_key_and_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "nccl.tar.gz"
    with pytest.raises(ProfileError) as exc:
        fetch("nccl", str(missing), "", "", tmp_path / "cache", io.StringIO())
    assert "nccl_source" in exc.value.message and str(missing) in exc.value.message
    assert not (tmp_path / "cache").exists()


def test_fetch_of_a_directory_is_used_in_place_and_its_digest_follows_its_content(tmp_path):
    tree = tmp_path / "nccl"
    tree.mkdir()
    (tree / "Makefile").write_text("all:\n")
    first = fetch("nccl", str(tree), "", "", tmp_path / "cache", io.StringIO())
    assert first.tree == tree and first.digest == tree_digest(tree)
    assert fetch("nccl", str(tree), "", "", tmp_path / "cache", io.StringIO()).digest == first.digest
    (tree / "Makefile").write_text("all:\n\techo changed\n")
    assert fetch("nccl", str(tree), "", "", tmp_path / "cache", io.StringIO()).digest != first.digest
    assert not (tmp_path / "cache").exists()  # nothing copied


def test_fetch_of_a_directory_with_a_sha256_is_refused(tmp_path):
    with pytest.raises(ProfileError) as exc:
        fetch("aws_ofi_nccl", str(tmp_path), "", "a" * 64, tmp_path / "cache", io.StringIO())
    assert "aws_ofi_nccl_source" in exc.value.message and "directory" in exc.value.message
    assert "aws_ofi_nccl_sha256" in exc.value.hint


def test_fetch_of_a_local_tree_named_like_a_git_repository_uses_the_tree(tmp_path):
    tree = tmp_path / "nccl.git"
    tree.mkdir()
    (tree / "Makefile").write_text("all:\n")
    src = fetch("nccl", str(tree), "", "", tmp_path / "cache", io.StringIO())
    assert src.tree == tree and src.digest == tree_digest(tree)


def test_fetch_downloads_a_file_url_checks_it_and_keeps_it_for_the_next_run(tmp_path):
    tarball, sha = _archive(tmp_path)
    cache = tmp_path / "cache"
    out = io.StringIO()
    src = fetch("aws_ofi_nccl", "", tarball.as_uri(), sha, cache, out)
    assert src.digest == sha and src.origin == tarball.as_uri() and (src.tree / "README").is_file()
    assert f"downloading {tarball.as_uri()}" in out.getvalue()
    (kept,) = (cache / "downloads").glob(f"*-{tarball.name}")  # the URL's hash, then its name
    assert sha256_file(kept) == sha
    tarball.unlink()  # the next run needs the kept download only
    again = io.StringIO()
    assert fetch("aws_ofi_nccl", "", tarball.as_uri(), sha, cache, again).tree == src.tree
    assert "downloading" not in again.getvalue()


def test_download_with_a_wrong_sha256_keeps_no_file(tmp_path):
    tarball, sha = _archive(tmp_path)
    downloads = tmp_path / "cache" / "downloads"
    with pytest.raises(SourceError) as exc:
        download(tarball.as_uri(), downloads, "f" * 64, "aws_ofi_nccl_source", io.StringIO())
    assert "aws_ofi_nccl_source" in exc.value.message and sha in exc.value.message
    assert list(downloads.iterdir()) == []


def test_download_with_a_wrong_sha256_names_the_download_not_a_temporary_file(tmp_path):
    tarball, _ = _archive(tmp_path)
    with pytest.raises(SourceError) as exc:
        download(tarball.as_uri(), tmp_path / "downloads", "f" * 64, "aws_ofi_nccl_source", io.StringIO())
    assert exc.value.message.startswith(f"aws_ofi_nccl_source: {tarball.name} has sha256 ") or (
        tarball.as_uri() in exc.value.message
    ), exc.value.message


class _Quiet(http.server.SimpleHTTPRequestHandler):
    served: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.served.append(self.path)
        super().do_GET()


@pytest.fixture
def web(tmp_path) -> Iterator[tuple[str, Path, list[str]]]:
    """An HTTP server on localhost for tmp_path/www: (base URL, its directory, paths requested)."""
    root = tmp_path / "www"
    root.mkdir()
    served: list[str] = []
    handler = type("Handler", (_Quiet,), {"served": served})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root, served
    finally:
        server.shutdown()
        server.server_close()


def test_download_over_http_is_fetched_once(tmp_path, web):
    base, root, served = web
    tarball, sha = _archive(tmp_path)
    (root / "v1.17.1.tar.gz").write_bytes(tarball.read_bytes())
    downloads = tmp_path / "cache" / "downloads"
    got = download(f"{base}/v1.17.1.tar.gz", downloads, sha, "aws_ofi_nccl_source", io.StringIO())
    assert got.parent == downloads and got.name.endswith("-v1.17.1.tar.gz") and sha256_file(got) == sha
    assert download(f"{base}/v1.17.1.tar.gz", downloads, sha, "aws_ofi_nccl_source", io.StringIO()) == got
    assert served == ["/v1.17.1.tar.gz"]
    assert sorted(p.name for p in downloads.iterdir()) == [got.name]


def test_download_of_a_missing_url_is_a_source_error_with_nothing_left(tmp_path, web):
    base, _, _ = web
    downloads = tmp_path / "cache" / "downloads"
    with pytest.raises(SourceError) as exc:
        download(f"{base}/v9.9.9.tar.gz", downloads, "", "nccl_source", io.StringIO())
    assert "nccl_source" in exc.value.message and "not found" in exc.value.message.lower()
    assert list(downloads.iterdir()) == []


def test_download_from_an_unreachable_host_is_one_named_error_and_leaves_nothing(tmp_path):
    downloads = tmp_path / "cache" / "downloads"
    url = "http://127.0.0.1:9/x.tar.gz"
    with pytest.raises(SourceError) as exc:
        download(url, downloads, "", "aws_ofi_nccl_source", io.StringIO())
    err = exc.value
    assert url in err.message and "aws_ofi_nccl_source" in err.message
    assert "\n" not in err.hint and "aws_ofi_nccl_source" in err.hint
    assert err.__cause__ is None and err.__suppress_context__  # `from None`: no chained traceback
    assert list(downloads.iterdir()) == []


def test_two_urls_with_the_same_file_name_are_not_mixed_up(tmp_path, web):
    base, root, served = web
    for project in ("nccl", "aws-ofi-nccl"):
        (root / project).mkdir()
        (root / project / "master.tar.gz").write_bytes(project.encode())
    downloads = tmp_path / "cache" / "downloads"
    first = download(f"{base}/nccl/master.tar.gz", downloads, "", "nccl_source", io.StringIO())
    assert first.read_bytes() == b"nccl"
    second = download(f"{base}/aws-ofi-nccl/master.tar.gz", downloads, "", "aws_ofi_nccl_source", io.StringIO())
    assert second.read_bytes() == b"aws-ofi-nccl", served


# --------------------------------------------------------------------------- the key and the prefix


BASE_SETS = [
    *CUDA,
    "nccl=source",
    "aws_ofi_nccl_version=1.17.1",
    "libfabric_prefix=/opt/cray/libfabric/1.15.2.0",
]
NCCL_SRC = Source(tree=Path("/c/nccl"), origin="nccl.tar.gz", digest="a" * 64)
OFI_SRC = Source(tree=Path("/c/ofi"), origin="ofi.tar.gz", digest="b" * 64)


def _key(
    *sets: str, nccl: Source = NCCL_SRC, plugin: Source = OFI_SRC, image: str = "sha256:1", libfabric: str = ""
) -> str:
    return comms_key(resolve("cpu", [*BASE_SETS, *sets]), nccl, plugin, image, libfabric)


def test_comms_key_is_the_same_for_the_same_inputs():
    assert _key() == _key()
    # where the source was unpacked or found does not matter, only its content
    moved = dataclasses.replace(NCCL_SRC, tree=Path("/elsewhere"), origin="https://x/nccl.tar.gz")
    assert _key(nccl=moved) == _key()


@pytest.mark.parametrize(
    "change",
    [
        {"sets": ["nccl_version=2.22.3-1"]},
        {"nccl": dataclasses.replace(NCCL_SRC, digest="c" * 64)},
        {"plugin": dataclasses.replace(OFI_SRC, digest="d" * 64)},
        {"sets": ['cuda_arch_list=["8.0", "9.0"]']},
        {"sets": ['cuda_arch_list=["9.0+PTX"]']},
        {"sets": ["aws_ofi_nccl_version=1.6.0"]},
        {"sets": ["libfabric_prefix=/opt/cray/libfabric/1.22.0"]},
        {"image": "sha256:2"},
        {"sets": ["compiler_version=13"]},
        {"sets": ["cuda_version=12.6"]},
        {"sets": ["cuda_home=/opt/cuda-12.4"]},
        {"sets": ["env={NCCL_DEBUG_SUBSYS: INIT}"]},
    ],
    ids=lambda c: ",".join(c.get("sets", [])) or next(iter(c)),
)
def test_comms_key_changes_with_what_decides_the_libraries(change):
    assert _key(*change.get("sets", []), **{k: v for k, v in change.items() if k != "sets"}) != _key()


@pytest.mark.parametrize("sets", [["ldflags=[-Wl,-z,now]"], ["cflags=[-O1]"], ["cxxflags=[-O1]"]])
def test_comms_key_changes_with_the_flags_the_plugin_is_built_with(sets):
    """configure and make see the profile's flags: another flag builds another plugin."""
    assert _key(*sets) != _key()


# --------------------------------------------------------------------------- checks before compiling


def _plugin_spec(tmp_path: Path, fabric: Path, version: str):
    return resolve(
        "cpu",
        [*CUDA, f"aws_ofi_nccl_version={version}", f"libfabric_prefix={fabric}", f"cuda_home={tmp_path / 'cuda'}"],
    )


def _step(spec, tmp_path: Path, *, nccl: bool = False, plugin: bool = True) -> _Step:
    """The step of a request for spec, with make (and nothing else) on its PATH."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "make").symlink_to("/bin/true")
    tree = tmp_path / "plugin-tree"
    tree.mkdir(exist_ok=True)
    (tree / "configure").write_text("#!/bin/sh\n")  # a tree with configure needs no autotools
    prefix = tmp_path / "cache" / "comms" / "x"
    req = CommsRequest(
        spec=spec, key="k" * 64, prefix=str(prefix), run_id="r1",
        nccl=Part(tree=str(tmp_path / "nccl-tree"), origin="o", sha256="s") if nccl else None,
        plugin=Part(tree=str(tree), origin="o", sha256="s") if plugin else None,
    )  # fmt: skip
    step = _Step(req)
    assert step.partial == prefix.with_name("x.partial-r1")
    step.env["PATH"] = str(tools)
    return step


def test_no_libfabric_at_the_prefix_names_the_key_and_the_path(tmp_path):
    empty = tmp_path / "opt" / "libfabric"
    empty.mkdir(parents=True)
    with pytest.raises(ProfileError) as exc:
        _step(_plugin_spec(tmp_path, empty, "1.17.1"), tmp_path)._check_before_compiling()
    assert "libfabric_prefix" in exc.value.message and str(empty) in exc.value.message
    assert "include/rdma/fabric.h" in exc.value.message


def test_derechos_plugin_pin_against_libfabric_2_is_refused_naming_the_release_that_builds(tmp_path):
    fabric = _libfabric(tmp_path / "libfabric", 2, 1)
    with pytest.raises(ProfileError) as exc:
        _step(_plugin_spec(tmp_path, fabric, "1.6.0"), tmp_path)._check_before_compiling()
    assert "1.6.0 does not compile against libfabric 2.1" in exc.value.message and "container_of" in exc.value.message
    assert "1.17.1" in (exc.value.hint or "")


def test_a_plugin_tree_without_configure_needs_autotools_where_the_step_runs(tmp_path):
    fabric = _libfabric(tmp_path / "libfabric", 2, 1)
    step = _step(_plugin_spec(tmp_path, fabric, "1.17.1"), tmp_path)
    (tmp_path / "plugin-tree" / "configure").unlink()
    with pytest.raises(ToolMissing) as exc:
        step._check_before_compiling()
    assert "autoreconf" in exc.value.message and "libtoolize" in exc.value.message


@pytest.mark.parametrize(("version", "major", "lib"), [("1.17.1", 2, "lib"), ("1.6.0", 1, "lib64")])
def test_a_plugin_release_that_compiles_against_the_libfabric_passes(tmp_path, version, major, lib):
    fabric = _libfabric(tmp_path / "libfabric", major, 15, lib)
    assert _step(_plugin_spec(tmp_path, fabric, version), tmp_path)._check_before_compiling() == (fabric, (major, 15))


def test_nccl_from_source_needs_nvcc_under_cuda_home(tmp_path):
    spec = resolve("cpu", [*CUDA, "nccl=source", f"cuda_home={tmp_path / 'no-cuda'}"])
    with pytest.raises(ToolMissing, match=re.escape(str(tmp_path / "no-cuda" / "bin" / "nvcc"))):
        _step(spec, tmp_path, nccl=True, plugin=False)._check_before_compiling()


def test_a_fabric_h_larger_than_any_header_is_named_not_read(tmp_path):
    fabric = _libfabric(tmp_path / "libfabric", 2, 1)
    with (fabric / "include" / "rdma" / "fabric.h").open("r+b") as f:
        f.truncate(HEADER_LIMIT + 1)  # sparse: nothing is written
    with pytest.raises(ProfileError, match=r"fabric.h is 4 MiB, more than the 4 MiB"):
        _step(_plugin_spec(tmp_path, fabric, "1.17.1"), tmp_path)._check_before_compiling()


def test_a_comms_manifest_larger_than_any_written_is_named_not_read(tmp_path):
    path = tmp_path / "x" / COMMS_MANIFEST
    path.parent.mkdir()
    with path.open("wb") as f:
        f.truncate(MANIFEST_LIMIT + 1)
    with pytest.raises(CommsFailed, match=r"more than the 64 MiB") as exc:
        read_manifest(path)
    assert f"remove {path.parent}" in (exc.value.hint or "")


def test_a_refused_step_leaves_no_partial_and_no_prefix(tmp_path):
    fabric = _libfabric(tmp_path / "libfabric", 2, 1)
    step = _step(_plugin_spec(tmp_path, fabric, "1.6.0"), tmp_path)
    with pytest.raises(ProfileError):
        run_step("comms", records.to_dict(step.req))
    assert not (tmp_path / "cache" / "comms").exists()


def test_a_comms_request_without_its_keys_is_a_usage_error():
    with pytest.raises(UsageError, match=r"the comms request: .*prefix: missing") as exc:
        run_step("comms", {"spec": resolve("cpu").to_dict(), "key": "k", "run_id": "r"})
    assert "`invoke comms` writes these requests" in (exc.value.hint or "")


# --------------------------------------------------------------------------- the step, end to end with stand-ins


def test_comms_builds_nccl_and_the_plugin_into_the_keyed_prefix(built):
    made, spec = built.made, built.site.spec()
    m = made.manifest
    assert made.built_now and made.view == made.prefix  # natively the step sees host paths
    assert made.prefix.parent == built.site.cache / "comms"
    assert made.prefix.name == comms_dir(spec, m["key"]) and made.prefix.name.startswith("nccl-2.21.5-1-ofi-1.17.1-")
    assert json.loads((made.prefix / COMMS_MANIFEST).read_text()) == m
    assert m["cuda_version"] == "12.4" and m["engine"] == "native" and m["profile"] == spec.profile
    nccl = m["nccl"]
    assert (nccl["version"], nccl["version_code"]) == ("2.21.5-1", 22105)
    assert nccl["gencode"] == "-gencode=arch=compute_90,code=sm_90" and nccl["arch_list"] == ["9.0"]
    assert nccl["library"] == "lib/libnccl.so.2.21.5" and (made.prefix / "include" / "nccl.h").is_file()
    assert nccl["sha256"] == sha256_file(Path(spec.nccl_source))
    plugin = m["plugin"]
    assert plugin["symbols"] == ["ncclNetPlugin_v6", "ncclNetPlugin_v8"] and plugin["library"] == "lib/libnccl-net.so"
    assert plugin["libfabric_version"] == "2.1" and plugin["libfabric_prefix"] == str(built.site.fabric)
    assert f"--with-libfabric={built.site.fabric}" in plugin["configure"]
    assert f"--prefix={made.prefix}" in plugin["configure"]
    # what was built, and nothing of the work: no tree, no libtool archive, no partial
    assert sorted(p.name for p in made.prefix.iterdir()) == ["deps", "include", "lib", COMMS_MANIFEST]
    # the site's libfabric travels with the plugin: deps/lib, its soname a link to the file
    (dep,) = plugin["deps"]
    fabric_so = built.site.fabric / "lib" / "libfabric.so.1"
    assert (dep["name"], dep["from"], dep["sha256"]) == ("libfabric.so.1", str(fabric_so), sha256_file(fabric_so))
    assert sorted(p.name for p in (made.prefix / "deps" / "lib").iterdir()) == ["libfabric.so.1"]
    assert not list((made.prefix / "lib").glob("*.la"))
    assert [p.name for p in (built.site.cache / "comms").iterdir()] == [made.prefix.name]


def test_the_built_plugin_finds_libfabric_through_its_rpath(built):
    lib = built.made.prefix / "lib" / "libnccl-net.so"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ldd = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, env=env, check=True).stdout
    assert f"libfabric.so.1 => {built.site.fabric / 'lib' / 'libfabric.so.1'}" in ldd, ldd
    assert unresolved(lib, env) == []


def test_nccl_is_made_for_the_profiles_archs_only(built):
    assert "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90" in built.first_output


def test_a_rerun_of_the_same_profile_is_a_no_op(built, capsys):
    spec = built.site.spec()
    out = io.StringIO()
    again = comms(spec, choose(spec, "native", Options()), out_dir=built.site.root / "out", out=out)
    assert not again.built_now and again.prefix == built.made.prefix and again.manifest == built.made.manifest
    assert "is up to date" in out.getvalue()
    assert "building" not in capsys.readouterr().out + out.getvalue()


def test_link_env_points_torchs_cmake_at_the_built_nccl(built):
    prefix = str(built.made.view)
    assert link_env(prefix, built.made.manifest) == {
        "USE_SYSTEM_NCCL": "1",
        "NCCL_ROOT": prefix,
        "NCCL_INCLUDE_DIR": f"{prefix}/include",
        "NCCL_LIB_DIR": f"{prefix}/lib",
    }
    assert link_env(prefix, {**built.made.manifest, "nccl": None}) == {}


def test_the_runner_records_what_the_wheel_manifest_keeps_and_it_round_trips(built, tmp_path):
    spec = built.site.spec()
    extra_env, record = runner_comms(spec, choose(spec, "native", Options()), built.site.root / "out", io.StringIO())
    assert extra_env == link_env(str(built.made.view), built.made.manifest)
    assert record is not None and record["prefix"] == str(built.made.prefix)
    assert record["plugin"]["symbols"] == ["ncclNetPlugin_v6", "ncclNetPlugin_v8"]
    wheel = make_wheel(tmp_path, "torch", "2.6.0", salt="comms")
    with_comms = _manifest(spec, wheel, {"engine": "native", "comms": record})
    data = with_comms.to_dict()
    assert data["comms"] == record and data["schema_version"] == mf.SCHEMA_VERSION
    assert mf.from_dict(json.loads(json.dumps(data))) == with_comms
    path = mf.write(with_comms, Path(f"{wheel}{mf.SUFFIX}"))
    assert mf.read(path).comms == with_comms.comms
    # and verify finds the prefix from the wheel's manifest, as the step sees the cache
    found = comms_for_verify(wheel, built.site.cache, Path("/cache"))
    assert found["prefix"] == f"/cache/comms/{built.made.prefix.name}" and found["manifest"] == built.made.manifest


def test_a_failing_build_leaves_no_prefix_and_no_partial(tmp_path, capsys):
    site = _site(tmp_path, nccl_code=22203)  # the tarball says 2.21.5-1, its library 2.22.3
    spec = site.spec()
    with pytest.raises(CommsFailed) as exc:
        comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=io.StringIO())
    assert "22203" in exc.value.message and "22105" in exc.value.message and "2.21.5-1" in exc.value.message
    assert list((site.cache / "comms").iterdir()) == []


def test_a_plugin_without_net_symbols_fails_the_step_and_leaves_nothing(tmp_path, capsys):
    site = _site(tmp_path, symbols=())
    spec = site.spec("nccl=bundled", "nccl_source=", "nccl_sha256=")
    with pytest.raises(CommsFailed, match="exports no ncclNetPlugin_v"):
        comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=io.StringIO())
    assert list((site.cache / "comms").iterdir()) == []


# aws-ofi-nccl's m4/get_version.sh from 1.19.0 on, as AC_INIT runs it (autogen.sh stops when it fails)
GET_VERSION = """#!/bin/sh
if test -f .release_version ; then cat .release_version ; exit 0 ; fi
if git rev-parse --git-dir > /dev/null 2>&1 ; then git describe --tags ; exit 0 ; fi
echo "No version found.  This usually means you are not building from a git repo or existing release
tarball.  Cannot continue." 1>&2
exit 1
"""


def _versioned_plugin_tree(root: Path) -> Path:
    """A 1.19+ tag archive's layout: autogen.sh (autoreconf) runs m4/get_version.sh first."""
    tree = _plugin_tree(root)
    (tree / "m4").mkdir()
    (tree / "m4" / "get_version.sh").write_text(GET_VERSION)
    (tree / "m4" / "get_version.sh").chmod(0o755)
    (tree / "autogen.sh").write_text(
        "m4/get_version.sh > version.txt || exit 1\ncp configure.sh configure && chmod +x configure\n"
    )
    return tree


def test_a_tag_archive_of_the_plugin_from_1_19_is_given_the_version_its_autogen_needs(tmp_path, capsys):
    site = _site(tmp_path, plugin_version="1.21.1")
    tree = _versioned_plugin_tree(tmp_path / "src" / "aws-ofi-nccl-1.21.1")
    ofi, sha = _tarball(tree, tmp_path / "dl" / "ofi-1.21.1.tar.gz")
    spec = site.spec(
        "nccl=bundled", "nccl_source=", "nccl_sha256=", f"aws_ofi_nccl_source={ofi}", f"aws_ofi_nccl_sha256={sha}"
    )
    made = comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=io.StringIO())
    assert made.manifest["plugin"]["version"] == "1.21.1"
    assert "wrote .release_version (1.21.1)" in capsys.readouterr().out
    assert not (tree / ".release_version").exists()  # the step's copy has it, not the unpacked source


def test_a_plugin_tree_with_its_own_version_or_a_git_checkout_is_left_as_it_is(tmp_path):
    from torchbuild.comms.step import _release_version_file

    own = _versioned_plugin_tree(tmp_path / "own")
    (own / ".release_version").write_text("1.20.0\n")
    checkout = _versioned_plugin_tree(tmp_path / "checkout")
    (checkout / ".git").mkdir()
    older = _plugin_tree(tmp_path / "older")  # before 1.19: no get_version.sh
    for tree in (own, checkout, older):
        _release_version_file(tree, "1.21.1")
    assert (own / ".release_version").read_text() == "1.20.0\n"
    assert not (checkout / ".release_version").exists() and not (older / ".release_version").exists()


def test_the_prefix_is_keyed_by_the_image_id_not_the_backends_name(tmp_path, capsys):
    """comms.py: "the image's id, the same for the image and the SIF made from it"."""
    site = _site(tmp_path)
    spec = site.spec("nccl=bundled", "nccl_source=", "nccl_sha256=")

    def prefix_for(name: str, image_id: str) -> Path:
        # the step runs here; check() answers as Apptainer's does, from the SIF's labels
        labels = {"org.torchbuild.sif.image-id": image_id, "org.torchbuild.sif.image": spec.image_tag}
        backend = type(
            "InProcess", (NativeBackend,), {"name": name, "check": lambda self: sif_record(labels, "/x.sif")}
        )
        return comms(spec, backend(spec, Options()), out_dir=tmp_path / "out", out=io.StringIO()).prefix

    assert prefix_for("apptainer", "sha256:aaa") != prefix_for("apptainer", "sha256:bbb")
    assert prefix_for("apptainer", "sha256:aaa") == prefix_for("docker", "sha256:aaa")


# --------------------------------------------------------------------------- jobs: the planner and out-of-memory resumes


def _fake_host(monkeypatch, cores: int, mem_gib: float) -> HostResources:
    """HostResources.detect() answers as an allocation of cores and mem_gib would, wherever it is called."""
    host = HostResources(cores=cores, memory_bytes=int(mem_gib * GiB), memory_source="test allocation")
    monkeypatch.setattr(HostResources, "detect", lambda *a, **k: host)
    return host


def _makes(output: str) -> list[str]:
    """The make commands the step ran (oom.run_watched prints each as `$ make ...`)."""
    return [ln for ln in output.splitlines() if ln.startswith("$ make")]


def test_comms_plans_its_jobs_for_the_allocation_not_the_nodes_cpu_count(tmp_path, monkeypatch):
    """Inside a batch allocation of 2 cores and 3 GiB on a 64-core node: NCCL's nvcc make gets
    what 3 GiB / the CUDA per-job peak allows, the plugin's C++ make what 2 cores allow."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    host = _fake_host(monkeypatch, 2, 3)
    site = _site(tmp_path)
    spec = site.spec()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        made = comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=out)
    nccl_plan = plan_make(spec, host, site.cache, kind="cuda")
    plugin_plan = plan_make(spec, host, site.cache, kind="cxx")
    assert (nccl_plan.jobs, plugin_plan.jobs) == (1, 2)  # 3 GiB / 5 GiB per CUDA job; 2 cores (1.5 GiB a job)
    m = made.manifest
    assert m["nccl"]["jobs"] == {
        "max_jobs": 1,
        "final_jobs": 1,
        "reason": nccl_plan.reason,
        "nvcc_threads": 0,
        "retries": [],
    }
    assert m["plugin"]["jobs"] == {
        "max_jobs": 2,
        "final_jobs": 2,
        "reason": plugin_plan.reason,
        "nvcc_threads": 0,
        "retries": [],
    }
    assert "2 cores" in plugin_plan.reason and "CUDA job" in nccl_plan.reason
    text = out.getvalue()
    assert f"comms: building NCCL with 1 jobs ({nccl_plan.reason})" in text
    assert f"comms: building aws-ofi-nccl with 2 jobs ({plugin_plan.reason})" in text
    compiles = [c for c in _makes(text) if "install" not in c]
    assert len(compiles) == 2 and " -j1 " in compiles[0] + " " and compiles[1].endswith("make -j2")
    assert "-j64" not in text


def test_comms_jobs_option_wins_over_the_plan(tmp_path, monkeypatch):
    _fake_host(monkeypatch, 2, 3)
    site = _site(tmp_path)
    spec = site.spec()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        made = comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=out, jobs=6)
    for part in ("nccl", "plugin"):
        assert made.manifest[part]["jobs"]["max_jobs"] == 6 and made.manifest[part]["jobs"]["reason"] == "--jobs 6"
    assert all(" -j6" in c for c in _makes(out.getvalue()) if "install" not in c)


def _oom_make(tmp_path: Path) -> Path:
    """A make that is OOM-killed as a compiler is (g++'s message, exit 2) when run with more
    than 2 jobs, and is the real make otherwise; each call's arguments go to <tools>/calls."""
    real = shutil.which("make")
    assert real is not None
    tools = tmp_path / "oom-tools"
    tools.mkdir()
    script = tools / "make"
    script.write_text(
        f"""#!{sys.executable}
import os, re, sys
open({str(tools / "calls")!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
jobs = [int(m[1]) for a in sys.argv[1:] for m in [re.fullmatch(r"-j(\\d+)", a)] if m]
if jobs and jobs[0] > 2:
    print("g++: fatal error: Killed signal terminated program cc1plus", flush=True)
    print("make: *** [Makefile:4: all] Error 1", flush=True)
    sys.exit(2)
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""
    )
    script.chmod(0o755)
    return tools


def test_an_oom_killed_make_is_resumed_with_fewer_jobs_and_the_retry_recorded(tmp_path, monkeypatch):
    _fake_host(monkeypatch, 4, 64)  # 4 jobs for each make
    tools = _oom_make(tmp_path)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    site = _site(tmp_path)
    spec = site.spec()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        made = comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=out)
    lines = (tools / "calls").read_text().splitlines()
    # NCCL's make -C <tree> -jN: killed with 4 jobs, resumed with 2
    assert [ln.split()[2] for ln in lines if ln.startswith("-C")] == ["-j4", "-j2"]
    # the plugin's make -jN likewise, then its install
    plugin = [ln.split()[0] for ln in lines if not ln.startswith("-C")]
    assert plugin == ["-j4", "-j2", "install"]
    for part, what in (("nccl", "building NCCL"), ("plugin", "building aws-ofi-nccl")):
        jobs = made.manifest[part]["jobs"]
        assert (jobs["max_jobs"], jobs["final_jobs"]) == (4, 2)
        [retry] = jobs["retries"]
        assert (retry["step"], retry["jobs"], retry["next_jobs"]) == (what, 4, 2)
        assert "Killed signal terminated program cc1plus" in retry["evidence"]
        assert f"torchbuild: out of memory in {what} with 4 jobs" in out.getvalue()
    assert made.built_now and (made.prefix / "lib" / "libnccl-net.so").is_file()


def test_no_retry_fails_at_the_first_oom_kill_and_leaves_nothing(tmp_path, monkeypatch):
    _fake_host(monkeypatch, 4, 64)
    tools = _oom_make(tmp_path)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    site = _site(tmp_path)
    spec = site.spec()
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(OutOfMemory) as exc:
        comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=io.StringIO(), oom_retry=False)
    assert "building NCCL ran out of memory with 4 jobs" in exc.value.message
    assert "--no-retry" in (exc.value.hint or "")
    assert (tools / "calls").read_text().count("-j") == 1
    assert list((site.cache / "comms").iterdir()) == []


# --------------------------------------------------------------------------- plugin_symbols, unresolved, versions


def test_plugin_symbols_are_the_net_plugin_versions_exported_in_order(tmp_path):
    lib = _so(tmp_path / "libnccl-net.so", "int ncclNetPlugin_v8 = 8;\nint ncclNetPlugin_v5 = 5;\nint other = 1;\n")
    assert plugin_symbols(lib) == ["ncclNetPlugin_v5", "ncclNetPlugin_v8"]
    assert plugin_symbols(_so(tmp_path / "libplain.so", "int ncclNet_v8 = 8;\n")) == []


def test_plugin_symbols_of_a_hidden_symbol_are_not_counted(tmp_path):
    lib = _so(tmp_path / "libnccl-net.so", '__attribute__((visibility("hidden"))) int ncclNetPlugin_v6 = 6;\n')
    assert plugin_symbols(lib) == []


def test_unresolved_names_a_dependency_that_is_gone_and_nothing_when_it_is_found(tmp_path):
    dep = _so(tmp_path / "libdep.so", "int dep(void) { return 1; }\n")
    plug = _so(tmp_path / "libplug.so", "int dep(void);\nint f(void) { return dep(); }\n", f"-L{tmp_path}", "-ldep")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    assert unresolved(plug, env) == []
    dep.unlink()
    assert unresolved(plug, env) == ["libdep.so"]


def test_unresolved_of_a_file_that_is_not_a_library_says_so(tmp_path):
    text = tmp_path / "libnccl-net.so"
    text.write_text("not ELF\n")
    (why,) = unresolved(text)
    assert "not a dynamic executable" in why or "ldd" in why


# --------------------------------------------------------------------------- the plugin's site dependencies


def _cc(path: Path, code: str, soname: str, *args: str) -> Path:
    """path, a shared library `cc` compiles from code, soname a link to it (as a site installs it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / f"{soname}.c"
    src.write_text(code)
    cmd = ["cc", "-shared", "-fPIC", "-o", str(path), str(src), f"-Wl,-soname,{soname}", *args]
    subprocess.run(cmd, check=True, capture_output=True)
    src.unlink()
    if soname != path.name:
        (path.parent / soname).symlink_to(path.name)
    return path


@pytest.fixture
def cray_site(tmp_path) -> tuple[Path, Path, Path, dict[str, str]]:
    """(site prefix, site lib64, the plugin, the build's env): a libfabric.so.1 under the prefix
    that links libcxi.so.1 in another site directory (found through LD_LIBRARY_PATH, as on a Cray
    node), and a plugin that links libfabric and the C library."""
    prefix, lib64 = tmp_path / "opt" / "cray" / "libfabric" / "1.15.2.0", tmp_path / "usr-lib64"
    _cc(lib64 / "libcxi.so.1.5.0", "int cxil_open(void) { return 7; }\n", "libcxi.so.1")
    (lib64 / "libcxi.so").symlink_to("libcxi.so.1")
    fabric = "int cxil_open(void);\nint fi_version(void) { return 1015 + cxil_open(); }\n"
    _cc(prefix / "lib" / "libfabric.so.1.18.2", fabric, "libfabric.so.1", f"-L{lib64}", "-lcxi")
    (prefix / "lib" / "libfabric.so").symlink_to("libfabric.so.1")
    plugin_code = "#include <string.h>\nint fi_version(void);\nint ncclNetPlugin_v6 = 6;\n"
    plugin_code += "int probe(const char *s) { return fi_version() + (int)strlen(s); }\n"
    plugin = _cc(tmp_path / "comms" / "lib" / "libnccl-net.so", plugin_code, "libnccl-net.so",
                 f"-L{prefix / 'lib'}", "-lfabric")  # fmt: skip
    env = {**os.environ, "LD_LIBRARY_PATH": f"{prefix / 'lib'}:{lib64}"}
    return prefix, lib64, plugin, env


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd")
def test_the_plugins_site_libraries_are_copied_into_deps_lib_and_it_loads_from_them_alone(tmp_path, cray_site):
    prefix, lib64, plugin, env = cray_site
    deps = site_dependencies(plugin, [prefix], env)
    assert sorted(d.name for d in deps) == ["libcxi.so.1", "libfabric.so.1"]  # not libc.so.6: a system library
    assert "libc.so.6" in {d.name for d in resolved(plugin, env)}
    dest = plugin.parent.parent / "deps" / "lib"
    copied = {d["name"]: d for d in copy_dependencies(deps, dest)}
    assert copied["libfabric.so.1"]["from"] == str(prefix / "lib" / "libfabric.so.1")
    assert copied["libcxi.so.1"]["sha256"] == sha256_file(lib64 / "libcxi.so.1.5.0")
    assert copied["libcxi.so.1"]["size"] == (lib64 / "libcxi.so.1.5.0").stat().st_size
    # the sonames are links to the files, under the files' own names
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        ["libcxi.so.1", "libcxi.so.1.5.0", "libfabric.so.1", "libfabric.so.1.18.2"]
    )
    assert os.readlink(dest / "libfabric.so.1") == "libfabric.so.1.18.2" and not (dest / "libc.so.6").exists()
    # the site gone (a container): with only deps/lib on LD_LIBRARY_PATH the plugin dlopens
    shutil.rmtree(tmp_path / "opt")
    shutil.rmtree(lib64)
    alone = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    assert plugin_symbols_in(plugin, {**alone, "LD_LIBRARY_PATH": str(dest)}) == ["ncclNetPlugin_v6"]
    with pytest.raises(CommsFailed, match=r"libnccl-net.so does not load: .*libfabric.so.1"):
        plugin_symbols_in(plugin, alone)


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd")
def test_the_cuda_driver_and_glibc_are_never_copied_even_from_a_site_directory(tmp_path):
    site = tmp_path / "site"
    _cc(site / "libcuda.so.1", "int cuInit(unsigned f) { return (int)f; }\n", "libcuda.so.1")
    _cc(site / "libnvidia-ml.so.1", "int nvmlInit(void) { return 0; }\n", "libnvidia-ml.so.1")
    code = "int cuInit(unsigned);\nint nvmlInit(void);\nint f(void) { return cuInit(0) + nvmlInit(); }\n"
    libs = [str(site / "libcuda.so.1"), str(site / "libnvidia-ml.so.1"), "-lm"]
    plugin = _cc(tmp_path / "libnccl-net.so", code, "libnccl-net.so", *libs)
    env = {**os.environ, "LD_LIBRARY_PATH": str(site)}
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= {d.name for d in resolved(plugin, env)}
    assert site_dependencies(plugin, [site], env) == []
    assert copy_dependencies([], tmp_path / "deps" / "lib") == [] and not (tmp_path / "deps").exists()


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd")
def test_what_the_sites_libfabric_takes_from_the_hosts_directories_is_found_for_a_container(cray_site):
    """A SIF has the host's libfabric prefix bound but not the host's /usr/lib64: the host side
    copies what libfabric links from outside its prefix (libcxi); in the container
    the loader's missing names are what the step links in from that copy."""
    prefix, lib64, _, env = cray_site
    fabric = prefix / "lib" / "libfabric.so.1"
    assert [(d.name, d.path) for d in host_dependencies(fabric, prefix, env)] == [
        ("libcxi.so.1", lib64 / "libcxi.so.1")
    ]
    # in the container: the prefix is there, the host's directory is not
    inside = {**env, "LD_LIBRARY_PATH": str(prefix / "lib")}
    assert unresolvable(fabric, inside) == ["libcxi.so.1"]
    assert unresolvable(fabric, env) == []
    # a host that does not resolve something (the container may have it) is no failure here
    assert host_dependencies(fabric, prefix, inside) == []


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd")
def test_a_site_dependency_that_does_not_resolve_names_every_missing_library(cray_site):
    prefix, _, plugin, env = cray_site
    with pytest.raises(CommsFailed, match=r"libnccl-net.so cannot load: ldd finds no libcxi.so.1$"):
        site_dependencies(plugin, [prefix], {**env, "LD_LIBRARY_PATH": str(prefix / "lib")})


def test_the_system_directories_are_the_loaders_and_its_caches():
    dirs = system_dirs()
    assert os.path.realpath(os.path.dirname(_libc_path())) in dirs
    assert not any(d.startswith("/tmp") for d in dirs)


def _libc_path() -> str:
    """Where this process's C library is (its /proc/self/maps)."""
    maps = Path("/proc/self/maps").read_text().split()
    return next(p for p in maps if re.search(r"/libc[.-][^/]*so", p))


def test_the_runtime_and_install_env_put_deps_lib_right_after_the_plugins_lib():
    m = {"nccl": {"library": "lib/libnccl.so.2.21.5"}, "plugin": {"library": "lib/libnccl-net.so", "deps": [{}]}}
    assert comms_runtime_env("/p", m) == {"LD_LIBRARY_PATH": "/p/lib:/p/deps/lib"}
    assert comms_install_env("/p", m) == (["/p/lib", "/p/deps/lib"], {"NCCL_NET_PLUGIN": "/p/lib/libnccl-net.so"})
    # a prefix made before deps/lib, or a plugin with nothing to carry: as it was
    bare = {**m, "plugin": {"library": "lib/libnccl-net.so", "deps": []}}
    assert comms_runtime_env("/p", bare) == {"LD_LIBRARY_PATH": "/p/lib"}
    assert comms_install_env("/p", bare)[0] == ["/p/lib"]


def test_nccl_version_of_calls_ncclGetVersion(tmp_path):
    lib = _so(tmp_path / "libnccl.so.2", "int ncclGetVersion(int *v) { *v = 22203; return 0; }\n")
    assert nccl_version_of(lib) == 22203
    bad = _so(tmp_path / "bad" / "libnccl.so.2", "int ncclGetVersion(int *v) { return 5; }\n")
    with pytest.raises(CommsFailed, match="ncclGetVersion failed"):
        nccl_version_of(bad)


@pytest.mark.parametrize(
    ("version", "code"),
    [("2.22.3-1", 22203), ("2.21.5-1", 22105), ("2.8.4-1", 2804), ("2.7.8-1", 2708), ("2.9.6-1", 20906)],
)
def test_version_code_is_ncclGetVersions_scheme(version, code):
    assert version_code(version) == code


# --------------------------------------------------------------------------- verify's checks


def _prefix(root: Path, code: int = 22203, symbols: tuple[int, ...] = (6,)) -> tuple[Path, dict[str, Any]]:
    """A comms prefix: lib/libnccl-net.so with symbols, lib/libnccl.so.2 reporting code."""
    exported = "".join(f"int ncclNetPlugin_v{v} = {v};\n" for v in symbols)
    _so(root / "lib" / "libnccl-net.so", exported or "int nothing = 0;\n")
    _so(
        root / "lib" / "libnccl.so.2",
        f"int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n",
        "-Wl,-soname,libnccl.so.2",
    )
    manifest = {
        "key": "k",
        "nccl": {"version": "2.22.3-1", "version_code": 22203, "library": "lib/libnccl.so.2"},
        "plugin": {"library": "lib/libnccl-net.so", "libfabric_version": "2.1", "symbols": []},
    }
    return root, manifest


def _torch_lib(root: Path, nccl_lib: Path | None, rpath: bool = True) -> Path:
    """root/libtorch_cuda.so, linked against nccl_lib/libnccl.so.2 (with an rpath to it)."""
    args = [f"-L{nccl_lib}", "-l:libnccl.so.2", *([f"-Wl,-rpath,{nccl_lib}"] if rpath else [])] if nccl_lib else []
    _so(
        root / "libtorch_cuda.so",
        "int ncclGetVersion(int *v);\nint t(void) { int v; return ncclGetVersion(&v); }\n"
        if nccl_lib
        else "int t(void) { return 0; }\n",
        *args,
    )
    return root


def _by_name(checks) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_comms_checks_pass_for_a_torch_linked_to_the_built_nccl(tmp_path):
    prefix, m = _prefix(tmp_path / "comms")
    checks = comms_checks(
        _torch_lib(tmp_path / "torch" / "lib", prefix / "lib"), {"prefix": str(prefix), "manifest": m}
    )
    assert [c.status for c in checks] == ["pass", "pass", "pass"], checks
    by = _by_name(checks)
    assert by["nccl plugin: loads, exports ncclNetPlugin_v*"].detail == "ncclNetPlugin_v6"
    assert "22203" in by[LINKED].detail and str(prefix / "lib" / "libnccl.so.2") in by[LINKED].detail


def test_comms_checks_pass_for_the_prefix_invoke_comms_built(built, tmp_path):
    prefix = built.made.prefix
    torch = _torch_lib(tmp_path / "torch" / "lib", prefix / "lib")
    checks = comms_checks(torch, {"prefix": str(prefix), "manifest": built.made.manifest})
    assert [c.status for c in checks] == ["pass", "pass", "pass"], checks


def test_a_torch_linked_to_another_nccl_fails_naming_it(tmp_path):
    prefix, m = _prefix(tmp_path / "comms")
    other, _ = _prefix(tmp_path / "other")
    checks = comms_checks(_torch_lib(tmp_path / "torch" / "lib", other / "lib"), {"prefix": str(prefix), "manifest": m})
    linked = _by_name(checks)[LINKED]
    assert (
        linked.status == "fail"
        and str(other / "lib" / "libnccl.so.2") in linked.detail
        and str(prefix) in linked.detail
    )


def test_an_nccl_reporting_another_version_fails(tmp_path):
    prefix, m = _prefix(tmp_path / "comms", code=22105)
    checks = comms_checks(
        _torch_lib(tmp_path / "torch" / "lib", prefix / "lib"), {"prefix": str(prefix), "manifest": m}
    )
    linked = _by_name(checks)[LINKED]
    assert linked.status == "fail" and "22105" in linked.detail and "2.22.3-1" in linked.detail


def test_a_torch_without_a_libtorch_cuda_or_without_a_shared_nccl_fails(tmp_path):
    prefix, m = _prefix(tmp_path / "comms")
    (tmp_path / "empty").mkdir()
    assert (
        "not a CUDA build"
        in _by_name(comms_checks(tmp_path / "empty", {"prefix": str(prefix), "manifest": m}))[LINKED].detail
    )
    static = _torch_lib(tmp_path / "static", None)
    linked = _by_name(comms_checks(static, {"prefix": str(prefix), "manifest": m}))[LINKED]
    assert linked.status == "fail" and "does not load libnccl.so.2" in linked.detail


def test_a_torch_whose_nccl_is_not_found_says_so(tmp_path):
    prefix, m = _prefix(tmp_path / "comms")
    torch = _torch_lib(tmp_path / "torch" / "lib", prefix / "lib", rpath=False)
    linked = _by_name(comms_checks(torch, {"prefix": str(prefix), "manifest": m}))[LINKED]
    assert linked.status == "fail"
    assert "not found" in linked.detail and "/not," not in linked.detail, linked.detail


def test_a_plugin_that_lost_its_dependency_or_symbols_fails(tmp_path):
    prefix, m = _prefix(tmp_path / "comms", symbols=())
    dep = _so(tmp_path / "gone" / "libfabric.so.1", "int fi(void) { return 0; }\n", "-Wl,-soname,libfabric.so.1")
    _so(
        prefix / "lib" / "libnccl-net.so",
        "int fi(void);\nint g(void) { return fi(); }\n",
        f"-L{dep.parent}",
        "-l:libfabric.so.1",
    )
    dep.unlink()
    checks = _by_name(comms_checks(_torch_lib(tmp_path / "t", prefix / "lib"), {"prefix": str(prefix), "manifest": m}))
    assert checks["nccl plugin: ldd resolves its libraries"].status == "fail"
    assert "libfabric.so.1" in checks["nccl plugin: ldd resolves its libraries"].detail
    assert checks["nccl plugin: loads, exports ncclNetPlugin_v*"].status == "fail"


def test_a_plugin_that_was_removed_fails_both_plugin_checks(tmp_path):
    prefix, m = _prefix(tmp_path / "comms")
    (prefix / "lib" / "libnccl-net.so").unlink()
    checks = _by_name(comms_checks(_torch_lib(tmp_path / "t", prefix / "lib"), {"prefix": str(prefix), "manifest": m}))
    assert checks["nccl plugin: ldd resolves its libraries"].status == "fail"
    assert checks["nccl plugin: loads, exports ncclNetPlugin_v*"].status == "fail"


def test_comms_checks_of_an_error_is_one_failing_check_with_its_words():
    (check,) = comms_checks(None, {"error": "the wheel was built without it"})
    assert check.status == "fail" and check.detail == "the wheel was built without it"


def test_comms_for_verify_explains_what_it_cannot_find(tmp_path):
    cache = tmp_path / "cache"
    wheel = make_wheel(tmp_path / "out", "torch", "2.6.0")
    assert "cannot say which NCCL" in comms_for_verify(wheel, cache, Path("/cache"))["error"]
    spec = resolve("cpu")
    mf.write(_manifest(spec, wheel, {"engine": "native"}), Path(f"{wheel}{mf.SUFFIX}"))
    assert "records no NCCL" in comms_for_verify(wheel, cache, Path("/cache"))["error"]
    gone = {"prefix": str(cache / "comms" / "nccl-x"), "key": "k"}
    mf.write(_manifest(spec, wheel, {"engine": "native", "comms": gone}), Path(f"{wheel}{mf.SUFFIX}"))
    assert "not in the cache" in comms_for_verify(wheel, cache, Path("/cache"))["error"]


# --------------------------------------------------------------------------- runtime environment and the SIF


def test_comms_runtime_env_puts_the_prefix_lib_first_and_names_only_an_ofi_named_plugin():
    assert comms_runtime_env("/p", {"nccl": {}, "plugin": None}) == {"LD_LIBRARY_PATH": "/p/lib"}
    assert comms_runtime_env("/p", {"plugin": {"library": "lib/libnccl-net.so"}}) == {"LD_LIBRARY_PATH": "/p/lib"}
    assert comms_runtime_env("/p", {"plugin": {"library": "lib/libnccl-net-ofi.so"}}) == {
        "LD_LIBRARY_PATH": "/p/lib",
        "NCCL_NET_PLUGIN": "/p/lib/libnccl-net-ofi.so",
    }


OFI_MANIFEST = {"key": "k1", "nccl": {"version": "2.21.5-1"}, "plugin": {"library": "lib/libnccl-net-ofi.so"}}


def test_the_sif_carries_the_comms_prefix_and_sets_its_environment(tmp_path):
    spec = resolve("cpu", CUDA)
    prefix = tmp_path / "cache" / "comms" / "nccl-2.21.5-1-ofi-1.17.1-0123456789ab"
    text = definition(
        spec,
        archive=tmp_path / "image.tar",
        profile_file=tmp_path / "p.yaml",
        image_id="x",
        comms=(prefix, OFI_MANIFEST),
    )
    files = text.split("%files\n", 1)[1].split("\n\n", 1)[0]
    assert f"    {prefix} {SIF_COMMS}" in files.splitlines()
    assert f"org.torchbuild.sif.runtime-hash {runtime_hash(spec, OFI_MANIFEST)}" in text
    # the %environment, run by sh as Apptainer does: the carried lib first, then what was there
    env = text.split("%environment\n", 1)[1].split("\n\n", 1)[0]
    shown = subprocess.run(
        ["sh", "-c", f'{env}\necho "$LD_LIBRARY_PATH"; echo "$NCCL_NET_PLUGIN"'],
        env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/site/lib"},
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert shown == [f"{SIF_COMMS}/lib:/site/lib", f"{SIF_COMMS}/lib/libnccl-net-ofi.so"]
    # a plugin that carries its site libraries: deps/lib right after lib/
    with_deps = {**OFI_MANIFEST, "plugin": {**OFI_MANIFEST["plugin"], "deps": [{"name": "libfabric.so.1"}]}}
    env = environment_section(spec, with_deps)
    shown = subprocess.run(
        ["sh", "-c", f'{env}\necho "$LD_LIBRARY_PATH"'], env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/site/lib"},
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert shown == [f"{SIF_COMMS}/lib:{SIF_COMMS}/deps/lib:/site/lib"]


def test_a_sif_without_comms_names_none_of_it(tmp_path):
    spec = resolve("cpu", CUDA)
    text = definition(spec, archive=tmp_path / "image.tar", profile_file=tmp_path / "p.yaml", image_id="x")
    assert SIF_COMMS not in text and "NCCL_NET_PLUGIN" not in text
    assert environment_section(spec) == environment_section(spec, None)


def test_the_runtime_hash_follows_the_comms_key():
    spec = resolve("cpu", CUDA)
    plain, one = runtime_hash(spec), runtime_hash(spec, OFI_MANIFEST)
    other = runtime_hash(spec, {**OFI_MANIFEST, "key": "k2"})
    assert len({plain, one, other}) == 3
    assert runtime_hash(spec, dict(OFI_MANIFEST)) == one


def test_a_comms_prefix_with_whitespace_cannot_go_into_a_definition(tmp_path):
    with pytest.raises(SifError, match="whitespace") as exc:
        definition(
            resolve("cpu", CUDA),
            archive=tmp_path / "image.tar",
            profile_file=tmp_path / "p.yaml",
            image_id="x",
            comms=(tmp_path / "my cache" / "comms" / "nccl", OFI_MANIFEST),
        )
    assert "my cache" in exc.value.message


# --------------------------------------------------------------------------- the image's packages


def test_comms_packages_follow_what_is_built():
    assert comms_packages(resolve("cpu", CUDA)) == []
    assert comms_packages(resolve("cpu", [*CUDA, "nccl=source"])) == ["make"]
    plugin = set(comms_packages(resolve("cpu", [*CUDA, "aws_ofi_nccl_version=1.17.1"])))
    assert {"make", "autoconf", "automake", "libtool", "libhwloc-dev", "libfabric-dev"} <= plugin
    site = set(comms_packages(resolve("cpu", [*CUDA, "aws_ofi_nccl_version=1.17.1", "libfabric_prefix=/opt/lf"])))
    assert "libfabric-dev" not in site and {"autoconf", "automake", "libtool", "libhwloc-dev"} <= site


def test_the_images_apt_packages_list_each_comms_package_once():
    packages = apt_packages(resolve("cpu", [*CUDA, "nccl=source", "aws_ofi_nccl_version=1.17.1"]))
    assert packages.count("make") == 1 and "libfabric-dev" in packages and "autoconf" in packages


# --------------------------------------------------------------------------- read-only binds


def test_apptainer_binds_read_only_dirs_without_putting_them_on_the_library_path(tmp_path):
    fabric = "/opt/cray/libfabric/1.15.2.0"
    args = run_args(tmp_path / "t.sif", {tmp_path / "cache": "/cache"}, ["x"], read_only=[fabric])
    bind = args[args.index("--bind") + 1].split(",")
    assert bind == [f"{tmp_path / 'cache'}:/cache", f"{fabric}:{fabric}:ro"]
    assert not any(a.startswith("LD_LIBRARY_PATH=") for a in args)
    both = run_args(tmp_path / "t.sif", {}, ["x"], host_mpi=["/opt/mpich/lib"], read_only=[fabric, "/opt/mpich/lib"])
    assert both[both.index("--bind") + 1].split(",") == ["/opt/mpich/lib:/opt/mpich/lib:ro", f"{fabric}:{fabric}:ro"]
    envs = [both[i + 1] for i, a in enumerate(both) if a == "--env"]
    assert "LD_LIBRARY_PATH=/opt/mpich/lib" in envs


def test_read_only_binds_are_kept_by_the_container_view_and_are_not_read_write_mounts(tmp_path):
    binds = Binds(cache=tmp_path / "c", out=tmp_path / "o", read_only=(Path("/opt/lf"),))
    view = container_view(binds)
    assert view.read_only == (Path("/opt/lf"),)
    assert Path("/opt/lf") not in binds.mounts(view)


# --------------------------------------------------------------------------- the manifest's comms record


def _manifest(spec, wheel: Path, provenance: dict[str, Any]) -> mf.Manifest:
    return mf.for_build(
        spec,
        run_id="0123456789ab",
        provenance=provenance,
        toolchain={"cc": "gcc"},
        environment={"USE_SYSTEM_NCCL": "1"},
        jobs={"max_jobs": 2, "final_jobs": 2, "reason": "test"},
        started="2025-01-01T00:00:00+00:00",
        finished="2025-01-01T01:00:00+00:00",
        seconds=3600.0,
        ccache=(1, 2, 0.33),
        log="build.log",
        report=None,
        wheel=wheel,
    )


RECORD = {
    "prefix": "/home/u/.cache/torchbuild/comms/nccl-2.21.5-1-ofi-1.6.0-0123456789ab",
    "key": "f" * 64,
    "nccl": {
        "version": "2.21.5-1",
        "version_code": 22105,
        "sha256": "a" * 64,
        "gencode": "-gencode=arch=compute_80,code=sm_80",
        "library": "lib/libnccl.so.2.21.5",
    },
    "plugin": {
        "version": "1.6.0",
        "sha256": "b" * 64,
        "libfabric_prefix": "/opt/cray/libfabric/1.15.2.0",
        "libfabric_version": "1.15",
        "library": "lib/libnccl-net.so",
        "symbols": ["ncclNetPlugin_v5", "ncclNetPlugin_v6"],
    },
}


def test_a_manifest_with_a_comms_record_round_trips(tmp_path):
    wheel = make_wheel(tmp_path, "torch", "2.6.0")
    m = _manifest(resolve("cpu"), wheel, {"engine": "docker", "comms": RECORD})
    assert (
        m.comms is not None
        and m.comms.plugin is not None
        and m.comms.plugin.symbols == tuple(RECORD["plugin"]["symbols"])
    )
    data = m.to_dict()
    assert data["comms"] == RECORD
    assert mf.from_dict(data) == m and mf.from_dict(data).to_dict() == data
    nccl_only = {k: v for k, v in RECORD.items() if k != "plugin"}
    assert mf.from_dict({**data, "comms": nccl_only}).to_dict()["comms"] == nccl_only


def test_a_manifest_without_comms_has_no_comms_key(tmp_path):
    wheel = make_wheel(tmp_path, "torch", "2.6.0")
    data = _manifest(resolve("cpu"), wheel, {"engine": "native"}).to_dict()
    assert "comms" not in data and mf.from_dict(data).comms is None


def test_a_comms_record_of_the_wrong_shape_is_a_manifest_error(tmp_path):
    wheel = make_wheel(tmp_path, "torch", "2.6.0")
    data = _manifest(resolve("cpu"), wheel, {"engine": "native", "comms": RECORD}).to_dict()
    bad = json.loads(json.dumps(data))
    bad["comms"]["nccl"]["version_code"] = "22105"
    with pytest.raises(mf.ManifestError, match=r"comms\.nccl\.version_code"):
        mf.from_dict(bad)


def test_a_script_without_a_shebang_is_named_as_not_executable_not_as_a_write_problem(tmp_path):
    """What `./autogen.sh` of a release archive did before it was run with sh: ENOEXEC."""
    from torchbuild.core.errors import PathError, named_os_errors

    script = tmp_path / "autogen.sh"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    with pytest.raises(PathError) as exc, named_os_errors(script, "aws-ofi-nccl autogen.sh"):
        subprocess.run([str(script)], check=False)
    assert "cannot be executed here" in exc.value.message and "write" not in (exc.value.hint or "")


def test_the_comms_manifest_is_written_atomically_through_the_manifest_module(tmp_path, monkeypatch):
    """A failed write of torchbuild-comms.json is the named error, leaves no half manifest or
    temporary file, and no prefix is made of the partial one."""
    import errno

    from torchbuild.core.errors import InsufficientSpace

    site = _site(tmp_path)
    spec = site.spec()
    real = os.replace

    def full(src, dst, *a, **kw):
        if Path(dst).name == COMMS_MANIFEST:
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", full)
    with (
        contextlib.redirect_stdout(io.StringIO()),
        pytest.raises(InsufficientSpace, match="writing the comms manifest"),
    ):
        comms(spec, choose(spec, "native", Options()), out_dir=site.root / "out", out=io.StringIO())
    made = [p for p in (site.cache / "comms").rglob("*") if COMMS_MANIFEST in p.name]
    assert made == []
    assert not [p for p in (site.cache / "comms").iterdir() if ".partial-" not in p.name]  # no prefix


# --------------------------------------------------------------------------- the profile's plugin configure options


def test_the_profiles_plugin_configure_options_reach_configure_after_torchbuilds_own(tmp_path):
    site = _site(tmp_path / "site")
    spec = site.spec("aws_ofi_nccl_configure=[--enable-trace, --with-mpi=/opt/mpi]")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        made = comms(spec, choose(spec, "native", Options()), out_dir=site.root / "out", out=out)
    configure = made.manifest["plugin"]["configure"]
    assert configure[-2:] == ["--enable-trace", "--with-mpi=/opt/mpi"]
    assert f"--with-libfabric={site.fabric}" in configure and "--disable-tests" in configure


def test_plugin_configure_options_give_another_comms_key_and_none_keep_the_old_one():
    assert _key("aws_ofi_nccl_configure=[--enable-trace]") != _key()
    assert _key("aws_ofi_nccl_configure=[]") == _key()


# --------------------------------------------------------------------------- the plugin at the site, in a recipe SIF


def _recipe_sif(path: Path, sif_id: bytes) -> Path:
    """A file with a SIF's global header whose ID is sif_id (16 bytes), as each `apptainer build` makes one."""
    path.write_bytes(
        b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\x0001\x00AMD" + sif_id + bytes(64)
    )
    return path


def _in_sif(sif: Path):
    """An ApptainerBackend whose SIF is a recipe SIF (no image id among its labels) and whose
    steps run in this process, as they would in the SIF."""

    def check(self):
        self.sif = sif
        return sif_record({"org.torchbuild.sif.route": "recipe"}, str(sif))

    return type(
        "InRecipeSif",
        (ApptainerBackend,),
        {"check": check, "view": NativeBackend.view, "launch": NativeBackend.launch, "hands_over_file": False},
    )


def test_the_sifs_id_is_read_from_its_header(tmp_path):
    assert sif_id(_recipe_sif(tmp_path / "a.sif", bytes(range(16)))) == bytes(range(16)).hex()


def test_a_recipe_sif_keys_the_prefix_by_its_own_id_and_later_steps_get_the_runtime_binds(tmp_path, capsys):
    """Another SIF (even from the same recipe) builds again; the same one is up to date; the
    build, verify and install steps of the same run then see the prefix at SIF_COMMS and the
    site's libfabric, read-only, as a job running torch in the SIF does."""
    site = _site(tmp_path)
    spec = site.spec("nccl=bundled", "nccl_source=", "nccl_sha256=")
    one, two = _recipe_sif(tmp_path / "one.sif", b"1" * 16), _recipe_sif(tmp_path / "two.sif", b"2" * 16)
    backend = _in_sif(one)(spec, Options())
    first = comms(spec, backend, out_dir=tmp_path / "out", out=io.StringIO())
    assert first.built_now
    assert backend.comms_binds == (f"{first.prefix}:{SIF_COMMS}:ro", f"{site.fabric}:{site.fabric}:ro")
    out = io.StringIO()
    again = comms(spec, _in_sif(one)(spec, Options()), out_dir=tmp_path / "out", out=out)
    assert not again.built_now and again.prefix == first.prefix and "is up to date" in out.getvalue()
    other = comms(spec, _in_sif(two)(spec, Options()), out_dir=tmp_path / "out", out=io.StringIO())
    assert other.built_now and other.prefix != first.prefix


def test_a_site_libfabric_upgraded_in_place_builds_the_plugin_again(tmp_path, capsys):
    site = _site(tmp_path)
    spec = site.spec("nccl=bundled", "nccl_source=", "nccl_sha256=")
    backend = _in_sif(_recipe_sif(tmp_path / "one.sif", b"1" * 16))
    first = comms(spec, backend(spec, Options()), out_dir=tmp_path / "out", out=io.StringIO())
    header = site.fabric / "include" / "rdma" / "fabric.h"
    header.write_text(header.read_text().replace("FI_MINOR_VERSION 1", "FI_MINOR_VERSION 2"))
    upgraded = comms(spec, backend(spec, Options()), out_dir=tmp_path / "out", out=io.StringIO())
    assert upgraded.built_now and upgraded.prefix != first.prefix
    assert upgraded.manifest["plugin"]["libfabric_version"] == "2.2"
    assert _key(libfabric="1.15") != _key(libfabric="1.17") and _key(libfabric="1.15") == _key(libfabric="1.15")


def test_the_step_that_builds_gets_no_comms_bind_and_the_others_do(tmp_path):
    """ApptainerBackend.launch: the comms step runs before its prefix exists; every other step
    gets the prefix at SIF_COMMS and the libfabric once, and says which step it is."""
    calls = []

    class Runner:
        run_flags = ("--userns",)

        def call(self, args, *, paths, out, memory_limit):
            calls.append((args, paths))
            return 0

    fabric = "/opt/cray/libfabric/1.15.2.0"
    spec = resolve("cpu", [*CUDA, "aws_ofi_nccl_version=1.6.0", f"libfabric_prefix={fabric}"])
    backend = ApptainerBackend(spec, Options())
    backend.runner, backend.sif = Runner(), tmp_path / "t.sif"  # type: ignore[assignment]
    backend.comms_binds = (f"/c/comms/ofi-1.6.0-k:{SIF_COMMS}:ro", f"{fabric}:{fabric}:ro")
    binds = Binds(cache=tmp_path / "cache", out=tmp_path / "out", read_only=(Path(fabric),))
    for step in ("comms", "build"):
        backend.launch(step, {}, binds, "/out/x.json")
    (comms_args, _), (build_args, build_paths) = calls
    assert comms_args[comms_args.index("--bind") + 1].split(",")[2:] == [f"{fabric}:{fabric}:ro"]
    assert build_args[build_args.index("--bind") + 1].split(",")[2:] == list(backend.comms_binds)
    assert Path("/c/comms/ofi-1.6.0-k") in build_paths  # the builder container mounts it too
    assert "TORCHBUILD_STEP=comms" in comms_args and "TORCHBUILD_STEP=build" in build_args


def _environment(spec) -> str:
    text = definition(spec, archive=Path("/l/image"), profile_file=Path("/l/p.yaml"), image_id="x")
    return text.split("%environment\n", 1)[1].split("\n\n", 1)[0]


def _source_env(env_text: str, comms_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The %environment run by sh as Apptainer sources it, with SIF_COMMS at comms_dir."""
    script = env_text.replace(SIF_COMMS, str(comms_dir)) + '\necho "$LD_LIBRARY_PATH"; echo "$NCCL_NET_PLUGIN"'
    return subprocess.run(
        ["sh", "-c", script], env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/site/lib", **env},
        capture_output=True, text=True, check=True,
    )  # fmt: skip


def test_a_sif_that_carries_no_comms_finds_them_where_they_are_bound_and_says_when_they_are_not(tmp_path):
    spec = resolve("cpu", [*CUDA, "aws_ofi_nccl_version=1.6.0", "libfabric_prefix=/opt/cray/libfabric/1.15.2.0"])
    env = _environment(spec)
    bound = tmp_path / "bound"
    (bound / "lib").mkdir(parents=True)
    (bound / "lib" / "libnccl-net.so").write_bytes(b"")  # 1.6.0's name
    (bound / "torchbuild-comms.json").write_text("{}")
    done = _source_env(env, bound)
    assert done.stdout.splitlines() == [f"{bound}/lib:/site/lib", f"{bound}/lib/libnccl-net.so"] and not done.stderr
    (bound / "deps" / "lib").mkdir(parents=True)  # the plugin's site libraries: right after its lib/
    assert _source_env(env, bound).stdout.splitlines()[0] == f"{bound}/lib:{bound}/deps/lib:/site/lib"
    (bound / "lib" / "libnccl-net-ofi.so").write_bytes(b"")  # 1.17's name wins where both are
    assert _source_env(env, bound).stdout.splitlines()[1] == f"{bound}/lib/libnccl-net-ofi.so"
    # not bound: NCCL_NET_PLUGIN names the missing file (no silent fallback) and stderr says what to bind
    missing = _source_env(env, tmp_path / "nothing")
    assert missing.stdout.splitlines() == ["/site/lib", f"{tmp_path / 'nothing'}/lib/libnccl-net.so"]
    assert "no NCCL and aws-ofi-nccl plugin" in missing.stderr
    assert "/opt/cray/libfabric/1.15.2.0:/opt/cray/libfabric/1.15.2.0:ro" in missing.stderr
    # torchbuild's own steps (the comms step that builds them) are not warned
    assert _source_env(env, tmp_path / "nothing", TORCHBUILD_STEP="comms").stderr == ""


def test_runtime_binds_are_the_prefix_and_the_sites_libfabric_read_only():
    fabric = "/opt/cray/libfabric/1.15.2.0"
    spec = resolve("cpu", [*CUDA, "aws_ofi_nccl_version=1.6.0", f"libfabric_prefix={fabric}"])
    assert runtime_binds(Path("/c/p"), spec) == [f"/c/p:{SIF_COMMS}:ro", f"{fabric}:{fabric}:ro"]
    assert runtime_binds(Path("/c/p"), resolve("cpu", [*CUDA, "nccl=source"])) == [f"/c/p:{SIF_COMMS}:ro"]


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd")
def test_verify_finds_the_plugins_site_libraries_in_deps_lib_with_the_site_gone(tmp_path, cray_site):
    """`invoke verify` on a node without the site's libfabric module (or in a container): the
    plugin resolves and loads from the deps/lib it carries, as the job's runtime env has it."""
    from torchbuild.verify.step import comms_checks

    prefix, lib64, plugin, env = cray_site
    deps = copy_dependencies(site_dependencies(plugin, [prefix], env), plugin.parent.parent / "deps" / "lib")
    shutil.rmtree(tmp_path / "opt")
    shutil.rmtree(lib64)
    manifest = {"plugin": {"library": "lib/libnccl-net.so", "libfabric_version": "1.15", "deps": deps}}
    checks = {c.name: c for c in comms_checks(None, {"prefix": str(plugin.parent.parent), "manifest": manifest})}
    assert checks["nccl plugin: ldd resolves its libraries"].status == "pass"
    loads = checks["nccl plugin: loads, exports ncclNetPlugin_v*"]
    assert (loads.status, loads.detail) == ("pass", "ncclNetPlugin_v6")
    # without deps/lib recorded, the same plugin is named as not resolving libfabric
    manifest["plugin"]["deps"] = []
    checks = {c.name: c for c in comms_checks(None, {"prefix": str(plugin.parent.parent), "manifest": manifest})}
    assert checks["nccl plugin: ldd resolves its libraries"].status == "fail"
    assert "libfabric.so.1" in checks["nccl plugin: ldd resolves its libraries"].detail
