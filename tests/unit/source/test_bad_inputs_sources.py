"""Bad inputs to the source side: patches that reach outside the tree, broken archives,
unusable destinations. Each case says what the user gave and what they must see."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from torchbuild.core.errors import (
    InsufficientSpace,
    PatchConflict,
    PathError,
    ProfileError,
    SourceError,
    UnsafePatch,
    UsageError,
)
from torchbuild.profile.config import resolve
from torchbuild.runtime.compile_job import pip_wheel
from torchbuild.source.fetch import get_source, unpack_archive
from torchbuild.source.patches import apply_series, load_series

OUTSIDE_TEXT = "outside a\n"


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _edit(old: str, new: str, body_old: str = "outside a", body_new: str = "changed") -> str:
    return f"diff --git a/{old} b/{new}\n--- a/{old}\n+++ b/{new}\n@@ -1 +1 @@\n-{body_old}\n+{body_new}\n"


def _plain(old: str, new: str) -> str:
    return f"--- a/{old}\n+++ b/{new}\n@@ -1 +1 @@\n-outside a\n+changed\n"


def _rename(old: str, new: str) -> str:
    return f"diff --git a/{old} b/{new}\nsimilarity index 100%\nrename from {old}\nrename to {new}\n"


def _symlink(path: str, target: str) -> str:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 120000\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1 @@\n+{target}\n\\ No newline at end of file\n"
    )


def _create(path: str) -> str:
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+new\n"


# (what the patch does, its text, the path the message must name)
UNSAFE_PATCHES = [
    ("edits a file through a symlink leading out", _edit("lnk/f.txt", "lnk/f.txt"), "lnk/f.txt"),
    ("plain diff through a symlink leading out", _plain("lnk/f.txt", "lnk/f.txt"), "lnk/f.txt"),
    ("edits ../ outside the tree", _edit("../outside/f.txt", "../outside/f.txt"), "../outside/f.txt"),
    ("plain diff with ../", _plain("../outside/f.txt", "../outside/f.txt"), "../outside/f.txt"),
    ("renames a tree file out through the symlink", _rename("src/a.txt", "lnk/a.txt"), "lnk/a.txt"),
    ("renames an outside file in", _rename("lnk/f.txt", "src/stolen.txt"), "lnk/f.txt"),
    ("creates a file through the symlink", _create("lnk/new.txt"), "lnk/new.txt"),
    ("creates a file in ../", _create("../outside/new.txt"), "../outside/new.txt"),
    ("creates a symlink leading out", _symlink("src/esc", "../../outside/f.txt"), "src/esc"),
    ("creates an absolute symlink", _symlink("src/esc", "/etc/passwd"), "src/esc"),
]


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A tree with src/a.txt and lnk -> ../outside (a directory holding f.txt)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text(OUTSIDE_TEXT)
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src/a.txt").write_text("outside a\n")
    (tree / "lnk").symlink_to(outside)
    return tree, outside


@pytest.mark.parametrize(("what", "text", "named"), UNSAFE_PATCHES, ids=[c[0] for c in UNSAFE_PATCHES])
def test_patch_reaching_outside_the_tree_is_refused(layout, tmp_path, monkeypatch, what, text, named):
    tree, outside = layout
    series_dir = tmp_path / "series"
    series_dir.mkdir()
    (series_dir / "01-evil.patch").write_text(f"{what}\n\n{text}")
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch_root))
    monkeypatch.setattr("tempfile.tempdir", None)
    before_tree, before_out = tree_digest(tree), sorted(os.listdir(outside))
    before_names = sorted(str(p) for p in tree.rglob("*"))
    with pytest.raises(UnsafePatch) as exc:
        apply_series(tree, load_series(str(series_dir), "2.6.0"))
    assert "01-evil.patch" in exc.value.message and named in exc.value.message
    assert tree_digest(tree) == before_tree and sorted(str(p) for p in tree.rglob("*")) == before_names
    assert sorted(os.listdir(outside)) == before_out and (outside / "f.txt").read_text() == OUTSIDE_TEXT
    assert not (tmp_path / "new.txt").exists()
    copied = [p for p in scratch_root.rglob("*") if p.is_file()]
    assert copied == [], f"an outside file was copied to the temp dir: {copied}"


def test_plain_unified_diff_applies_like_a_git_one(tmp_path):
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src/a.txt").write_text("outside a\n")
    series_dir = tmp_path / "series"
    series_dir.mkdir()
    (series_dir / "01-plain.patch").write_text("A patch made by diff -u.\n\n" + _plain("src/a.txt", "src/a.txt"))
    series = load_series(str(series_dir), "2.6.0")
    assert apply_series(tree, series).applied == ("01-plain.patch",)
    assert (tree / "src/a.txt").read_text() == "changed\n"
    assert apply_series(tree, series).skipped == ("01-plain.patch",)  # a rerun sees it applied


def test_file_that_is_no_patch_is_a_conflict_naming_it(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    series_dir = tmp_path / "series"
    series_dir.mkdir()
    (series_dir / "01-notes.patch").write_text("just some notes, no diff\n")
    with pytest.raises(PatchConflict, match=r"01-notes\.patch is not a patch git understands"):
        apply_series(tree, load_series(str(series_dir), "2.6.0"))


# --------------------------------------------------------------------------- archives


def _tarball(tmp: Path, name: str, mode: str) -> Path:
    tree = tmp / "pytorch-src"
    tree.mkdir(exist_ok=True)
    (tree / "setup.py").write_text("# x\n")
    (tree / "big.bin").write_bytes(os.urandom(64 * 1024))
    path = tmp / name
    with tarfile.open(path, mode) as tar:
        tar.add(tree, arcname="pytorch-src")
    return path


def _truncated(mode: str, suffix: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = _tarball(tmp, f"pytorch{suffix}", mode)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path

    return make


def _file(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / name
        path.write_bytes(data)
        return path

    return make


# (what the user passed as an archive, how to make it)
BAD_ARCHIVES = [
    ("truncated .tar.gz", _truncated("w:gz", ".tar.gz")),
    ("truncated .tar", _truncated("w", ".tar")),
    ("truncated .tar.xz", _truncated("w:xz", ".tar.xz")),
    ("truncated .tar.bz2", _truncated("w:bz2", ".tar.bz2")),
    ("a text file named .tar.gz", _file("notes.tar.gz", b"this is not an archive\n" * 20)),
    ("an empty .tar", _file("empty.tar", b"")),
    ("random bytes named .tgz", _file("noise.tgz", os.urandom(4096))),
]


@pytest.mark.parametrize(("what", "make"), BAD_ARCHIVES, ids=[c[0] for c in BAD_ARCHIVES])
def test_unreadable_archive_names_the_file_and_leaves_nothing(tmp_path, what, make):
    archive = make(tmp_path)
    root = tmp_path / "srcs" / "sub"
    with pytest.raises(SourceError) as exc:
        unpack_archive(archive, root)
    assert str(archive) in exc.value.message and "not a readable tarball" in exc.value.message
    assert not (tmp_path / "srcs").exists(), "a directory was left behind"


# tar members that write, or point, outside the tree: (kind, name, link target or file text)
Member = tuple[str, str, str]


def _slip(tmp: Path, members: list[Member]) -> Path:
    """A real tarball made by tarfile: a top directory, then members; "{outside}" in a link
    target is the absolute path of tmp/outside (a directory holding victim.txt)."""
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "victim.txt").write_text(OUTSIDE_TEXT)
    path = tmp / "slip.tar"
    with tarfile.open(path, "w") as tar:
        top = tarfile.TarInfo("top")
        top.type, top.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(top)
        setup = tarfile.TarInfo("top/setup.py")
        setup.size = 4
        tar.addfile(setup, io.BytesIO(b"# x\n"))
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            value = value.replace("{outside}", str(outside))
            if kind == "file":
                info.size = len(value.encode())
                tar.addfile(info, io.BytesIO(value.encode()))
                continue
            info.type = {"sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = value
            tar.addfile(info)
    return path


TAR_SLIPS: list[tuple[str, list[Member]]] = [
    ("file under an absolute symlink", [("sym", "top/link", "{outside}"), ("file", "top/link/FILE", "pwned\n")]),
    (
        "overwrite through an absolute symlink",
        [("sym", "top/link", "{outside}"), ("file", "top/link/victim.txt", "pwned\n")],
    ),
    ("file under a ../ symlink", [("sym", "top/up", "../.."), ("file", "top/up/outside/FILE", "pwned\n")]),
    ("symlink to a file outside", [("sym", "top/v", "../../outside/victim.txt")]),
    ("absolute symlink alone", [("sym", "top/v", "{outside}/victim.txt")]),
    (
        "symlink through an earlier symlink",
        [("sym", "top/deep", "."), ("sym", "top/l", "deep/../../outside"), ("file", "top/l/FILE", "pwned\n")],
    ),
    ("hard link to a file outside", [("hard", "top/h", "../outside/victim.txt")]),
    ("hard link through a symlink", [("sym", "top/link", "{outside}"), ("hard", "top/h", "top/link/victim.txt")]),
    ("member named ../", [("file", "top/../../outside/FILE", "pwned\n")]),
    ("member with an absolute name", [("file", "{outside}/FILE", "pwned\n")]),
    ("a FIFO", [("fifo", "top/pipe", "")]),
]


@pytest.mark.parametrize("data_filter", [False, True], ids=["without data_filter (3.9-3.11.3)", "with data_filter"])
@pytest.mark.parametrize(("what", "members"), TAR_SLIPS, ids=[c[0] for c in TAR_SLIPS])
def test_tarball_member_leading_outside_is_refused_as_unsafe(tmp_path, monkeypatch, what, members, data_filter):
    if not data_filter:  # as on Debian bookworm's Python 3.11.2
        monkeypatch.delattr(tarfile, "data_filter")
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile.data_filter")
    archive = _slip(tmp_path, [(k, n.replace("{outside}", str(tmp_path / "outside")), v) for k, n, v in members])
    with pytest.raises(SourceError) as exc:
        unpack_archive(archive, tmp_path / "srcs")
    assert "unsafe tarball member" in exc.value.message and "not a readable tarball" not in exc.value.message
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["victim.txt"]
    assert (tmp_path / "outside" / "victim.txt").read_text() == OUTSIDE_TEXT
    assert not (tmp_path / "srcs").exists(), "a directory was left behind"


def test_tarball_symlinks_inside_the_tree_are_kept(tmp_path, monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter")
    archive = _slip(
        tmp_path, [("file", "top/a.txt", "a\n"), ("sym", "top/b.txt", "a.txt"), ("hard", "top/c", "top/a.txt")]
    )
    tree = unpack_archive(archive, tmp_path / "srcs").path
    assert (tree / "b.txt").read_text() == "a\n" and os.readlink(tree / "b.txt") == "a.txt"
    assert (tree / "c").read_text() == "a\n"


def _raise_os(err: int) -> Callable[..., None]:
    def extract(*args: object, **kwargs: object) -> None:
        raise OSError(err, os.strerror(err))

    return extract


# (the OS fault, how to cause it, expected error, words of its message)
ARCHIVE_OS_FAULTS = [
    ("disk full", _raise_os(errno.ENOSPC), InsufficientSpace, "no space left"),
    ("read-only destination", _raise_os(errno.EROFS), PathError, "read-only"),
    ("permission denied", _raise_os(errno.EACCES), PathError, "permission denied"),
]


@pytest.mark.parametrize(("what", "fault", "error", "words"), ARCHIVE_OS_FAULTS, ids=[c[0] for c in ARCHIVE_OS_FAULTS])
def test_os_fault_while_unpacking_is_named(tmp_path, monkeypatch, what, fault, error, words):
    archive = _tarball(tmp_path, "pytorch.tar.gz", "w:gz")
    monkeypatch.setattr(tarfile.TarFile, "extractall", fault)
    with pytest.raises(error, match=words):
        unpack_archive(archive, tmp_path / "srcs")
    assert not (tmp_path / "srcs").exists()


# (a destination root that cannot be used, expected words)
BAD_UNPACK_ROOTS = [
    ("under a file", lambda tmp: tmp / "afile" / "srcs", "not a directory"),
    ("a name too long", lambda tmp: tmp / ("x" * 300), "too long"),
]


@pytest.mark.parametrize(("what", "root", "words"), BAD_UNPACK_ROOTS, ids=[c[0] for c in BAD_UNPACK_ROOTS])
def test_unusable_unpack_root_is_a_path_error(tmp_path, what, root, words):
    archive = _tarball(tmp_path, "pytorch.tar.gz", "w:gz")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PathError, match=words):
        unpack_archive(archive, root(tmp_path))


# --------------------------------------------------------------------------- get_source


@pytest.fixture
def spec(tmp_path):
    return resolve("cpu", [f"cache_dir={tmp_path / 'cache'}"])


def _local_tree(tmp: Path) -> str:
    tree = tmp / "tree"
    tree.mkdir(exist_ok=True)
    (tree / "setup.py").write_text("# x\n")
    return str(tree)


def _archive(tmp: Path) -> str:
    return str(_tarball(tmp, "pytorch.tar.gz", "w:gz"))


def _file_dest(tmp: Path) -> str:
    (tmp / "afile").write_text("x")
    return str(tmp / "afile")


URL = "file:///nonexistent/pytorch.git"

# (what the user typed, source, ref, dest (each a function of tmp_path), error, words)
BAD_SOURCE_OPTIONS = [
    ("--ref with a local tree", _local_tree, "v2.6.0", None, UsageError, "--ref v2.6.0 cannot be used with a local"),
    ("--dest with a local tree", _local_tree, "", lambda t: str(t / "d"), UsageError, "--dest .* cannot be used"),
    ("--ref with a tarball", _archive, "v2.6.0", None, UsageError, "--ref v2.6.0 cannot be used with an archive"),
    ("--dest a file, git URL", lambda t: URL, "", _file_dest, PathError, "--dest .*afile exists and is not a dir"),
    ("--dest a file, tarball", _archive, "", _file_dest, PathError, "--dest .*afile exists and is not a dir"),
    ("--dest under a file", _archive, "", lambda t: _file_dest(t) + "/sub", PathError, "afile is a file"),
    ("--dest name too long", lambda t: URL, "", lambda t: str(t / ("x" * 300)), PathError, "too long"),
    ("--ref=--detach", lambda t: URL, "--detach", None, UsageError, "--ref '--detach' starts with '-'"),
    ("--ref --orphan=evil", lambda t: "", "--orphan=evil", None, UsageError, "--ref '--orphan=evil' starts with '-'"),
    ("--ref --upload-pack", lambda t: URL, "--upload-pack=touch x", None, UsageError, "--ref .* starts with '-'"),
    ("--source --upload-pack", lambda t: "--upload-pack=touch x;.git", "", None, UsageError, "--source .* starts with"),
    ("--source a path like an option", lambda t: "-tree", "", None, UsageError, "--source '-tree' starts with '-'"),
]


@pytest.mark.parametrize(
    ("what", "source", "ref", "dest", "error", "words"), BAD_SOURCE_OPTIONS, ids=[c[0] for c in BAD_SOURCE_OPTIONS]
)
def test_bad_source_options_are_named(spec, tmp_path, what, source, ref, dest, error, words):
    with pytest.raises(error, match=words):
        get_source(spec, source(tmp_path), ref, dest(tmp_path) if dest else "", out=io.StringIO())


def test_unwritable_dest_is_a_path_error(spec, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # root could write anywhere
    with pytest.raises(PathError, match="not writable"):
        get_source(spec, _archive(tmp_path), dest=str(tmp_path / "d"), out=io.StringIO())


def test_get_source_tarball_unpacks_under_dest_and_a_tree_is_used_in_place(spec, tmp_path):
    info = get_source(spec, _archive(tmp_path), dest=str(tmp_path / "d"), out=io.StringIO())
    assert info.kind == "tarball" and info.path.parent == tmp_path / "d"
    assert (info.path / "setup.py").is_file()
    default = get_source(spec, _archive(tmp_path), out=io.StringIO())
    assert default.path.parent == tmp_path / "cache" / "src"
    tree = get_source(spec, _local_tree(tmp_path), out=io.StringIO())
    assert tree.kind == "dir" and tree.path == tmp_path / "tree"


# profile keys whose values reach git, tar or pip argvs: (key, --set value)
OPTION_LIKE_KEYS = [
    ("torch_ref", "torch_ref=--orphan=evil"),
    ("torch_repo", "torch_repo=--upload-pack=touch x"),
    ("companion_refs", "companion_refs={torchvision: --orphan}"),
    ("companion_repos", "companion_repos={torchvision: --upload-pack=x}"),
    ("nccl_source", "nccl_source=--to-command=sh"),
]


@pytest.mark.parametrize(("key", "setting"), OPTION_LIKE_KEYS, ids=[c[0] for c in OPTION_LIKE_KEYS])
def test_profile_ref_or_source_that_starts_with_a_dash_is_refused(tmp_path, key, setting):
    sets = [f"cache_dir={tmp_path}", setting]
    if key.startswith("companion"):
        sets.append("companions=[torchvision]")
    if key == "nccl_source":
        sets += ["cuda_version=12.6", "cuda_arch_list=[9.0]", "distributed=[nccl, gloo]", "nccl=source"]
    with pytest.raises(ProfileError, match=f"key '{key}'.* starts with '-'"):
        resolve("cpu", sets)


def test_pip_reads_a_source_that_looks_like_an_option_as_a_requirement(tmp_path):
    """`pip wheel -w DIR --help` would print pip's help and exit 0: a build that "succeeded"
    with no wheel. After `--` pip names it as a bad requirement."""
    proc = subprocess.run(pip_wheel(tmp_path / "w", "--help"), capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "Usage:" not in proc.stdout
    assert "--help" in proc.stderr


# issue 41 item 4: a file name is shown inert, in what `invoke source` prints and in its errors
def test_escape_sequences_in_a_source_file_name_reach_the_terminal_inert(tmp_path):
    from helpers import run_invoke

    name = "py\x1b]0;pwned\x07torch\x1b[2J"
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "setup.py").write_text("# x\n")
    archive = tmp_path / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="pytorch")
    res = run_invoke("source", "--source", str(archive), "--dest", str(tmp_path / "srcs"), "--no-patch")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "pytorch-" in res.stdout, repr(res.stdout)
    missing = run_invoke("source", "--source", str(tmp_path / f"{name}.tgz"), "--dest", str(tmp_path / "srcs"))
    assert missing.returncode == 8 and "error: SourceError:" in missing.stderr, missing.stderr
    assert "\x1b" not in missing.stderr and "\x07" not in missing.stderr and "pwned" not in missing.stderr
