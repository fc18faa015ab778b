"""Getting PyTorch source: git (with submodules and a reusable mirror cache), a local tree,
a tarball, or a Debian .dsc. Every fetch returns a SourceInfo recorded in the manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TextIO

from .errors import SourceError, ToolMissing

# file:// submodules are refused by default since git 2.38.1; mirrors and tests need them
_GIT = ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false"]
_URL_RE = re.compile(r"^(https?|ssh|git|file)://|^[\w.-]+@[\w.-]+:")


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    kind: str  # git | dir | tarball | dsc
    path: Path
    url: str = ""
    ref: str = ""
    commit: str = ""
    sha256: str = ""  # of the tarball or .dsc
    submodules: tuple[tuple[str, str], ...] = ()  # (path, commit)

    def to_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        d["path"] = str(self.path)
        d["submodules"] = [{"path": p, "commit": c} for p, c in self.submodules]
        return d


def _git(*args: str, cwd: Path | None = None, out: TextIO | None = None) -> str:
    if shutil.which("git") is None:
        raise ToolMissing("git is not installed", hint="apt-get install git")
    cmd = [*_GIT, *args]
    if out is not None:
        print(f"$ git {' '.join(args)}", file=out, flush=True)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SourceError(
            f"git {' '.join(args[:3])} failed: {detail[-1] if detail else proc.returncode}",
            hint="check the URL, the ref and network access; `git` itself shows more",
        )
    return proc.stdout.strip()


def mirror_path(cache: Path, url: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rstrip("/").rsplit("/", 1)[-1])
    return cache / "git" / f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def update_mirror(cache: Path, url: str, out: TextIO = sys.stdout) -> Path:
    """A bare mirror of url in the cache, created or refreshed; later clones borrow its objects."""
    mirror = mirror_path(cache, url)
    if (mirror / "HEAD").is_file():
        _git("--git-dir", str(mirror), "remote", "update", "--prune", out=out)
    else:
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=mirror.name + ".", dir=mirror.parent))
        try:
            _git("clone", "--mirror", "--quiet", url, str(tmp / "m"), out=out)
            os.replace(tmp / "m", mirror)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return mirror


def _submodules(repo: Path) -> list[tuple[str, str]]:
    """(path, url) of the submodules declared in repo/.gitmodules."""
    if not (repo / ".gitmodules").is_file():
        return []
    try:
        raw = _git("config", "-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.(path|url)$", cwd=repo)
    except SourceError:
        return []
    paths: dict[str, str] = {}
    urls: dict[str, str] = {}
    for line in raw.splitlines():
        key, _, value = line.partition(" ")
        name, _, field = key[len("submodule.") :].rpartition(".")
        (paths if field == "path" else urls)[name] = value
    return [(paths[n], urls[n]) for n in paths if n in urls]


def _init_submodules(repo: Path, cache: Path | None, out: TextIO) -> None:
    """Check out every submodule (recursively), borrowing objects from per-URL mirrors."""
    _git("submodule", "sync", "--quiet", cwd=repo)
    for path, url in _submodules(repo):
        args = ["submodule", "update", "--init", "--quiet"]
        if cache is not None and _URL_RE.match(url):
            args += ["--reference", str(update_mirror(cache, url, out))]
        _git(*args, "--", path, cwd=repo, out=out)
        _init_submodules(repo / path, cache, out)


def submodule_commits(repo: Path) -> tuple[tuple[str, str], ...]:
    try:
        raw = _git("submodule", "status", "--recursive", cwd=repo)
    except SourceError:
        return ()
    rows = []
    for line in raw.splitlines():
        parts = line[1:].split()
        if len(parts) >= 2:
            rows.append((parts[1], parts[0]))
    return tuple(rows)


def fetch_git(url: str, ref: str, dest: Path, cache: Path | None, out: TextIO = sys.stdout) -> SourceInfo:
    """Clone url at ref (tag, branch or commit) with submodules into dest.

    With a cache, the clone comes from a bare mirror kept in <cache>/git (a second clone at
    another tag only fetches what is new); without one, a shallow clone of the ref is made.
    dest must not exist; on failure nothing is left at dest.
    """
    if dest.exists():
        raise SourceError(f"{dest} already exists", hint="remove it, or pass it as --source to build it as it is")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if cache is not None:
            mirror = update_mirror(cache, url, out)
            _git("clone", "--quiet", "--no-checkout", "--reference", str(mirror), str(mirror), str(partial), out=out)
            _git("remote", "set-url", "origin", url, cwd=partial)
            _git("checkout", "--quiet", ref, cwd=partial, out=out)
        else:
            try:
                _git("clone", "--quiet", "--depth", "1", "--branch", ref, url, str(partial), out=out)
            except SourceError:  # a commit id cannot be cloned with --branch: fetch it
                shutil.rmtree(partial, ignore_errors=True)
                _git("init", "--quiet", str(partial))
                _git("remote", "add", "origin", url, cwd=partial)
                _git("fetch", "--quiet", "--depth", "1", "origin", ref, cwd=partial, out=out)
                _git("checkout", "--quiet", "FETCH_HEAD", cwd=partial)
        _init_submodules(partial, cache, out)
        os.replace(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return SourceInfo(
        kind="git",
        path=dest,
        url=url,
        ref=ref,
        commit=_git("rev-parse", "HEAD", cwd=dest),
        submodules=submodule_commits(dest),
    )


def update_tree(tree: Path, out: TextIO = sys.stdout) -> SourceInfo:
    """Bring a git tree to the head of its branch (fast-forward only), submodules included."""
    if not (tree / ".git").exists():
        raise SourceError(f"{tree} is not a git checkout", hint="--update works on trees made by `invoke source`")
    branch = _git("rev-parse", "--abbrev-ref", "HEAD", cwd=tree)
    if branch == "HEAD":
        raise SourceError(
            f"{tree} is at a detached commit (a tag or a commit id), not on a branch",
            hint="check out a branch first (git -C TREE checkout main), or fetch a new ref with `invoke source --ref`",
        )
    _git("fetch", "--quiet", "origin", cwd=tree, out=out)
    _git("merge", "--ff-only", "--quiet", "@{upstream}", cwd=tree, out=out)
    _git("submodule", "sync", "--quiet", "--recursive", cwd=tree)
    _git("submodule", "update", "--init", "--recursive", "--quiet", cwd=tree, out=out)
    return describe_dir(tree)


def describe_dir(tree: Path) -> SourceInfo:
    """An existing local tree, with its git commit when it has one."""
    if not tree.is_dir():
        raise SourceError(f"source {tree} is not a directory")
    if not ((tree / "setup.py").is_file() or (tree / "pyproject.toml").is_file()):
        raise SourceError(
            f"{tree} has neither setup.py nor pyproject.toml",
            hint="point --source at the top of a PyTorch checkout",
        )
    commit = url = ""
    if (tree / ".git").exists():
        try:
            commit = _git("rev-parse", "HEAD", cwd=tree)
            url = _git("config", "--get", "remote.origin.url", cwd=tree)
        except SourceError:
            pass
    return SourceInfo(
        kind="dir", path=tree, url=url, commit=commit, submodules=submodule_commits(tree) if commit else ()
    )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unpack_archive(archive: Path, dest_root: Path, out: TextIO = sys.stdout) -> SourceInfo:
    """Unpack a tarball or a Debian .dsc (with its patch series) under dest_root/<name>-<sha>."""
    if not archive.is_file():
        raise SourceError(f"source archive {archive} does not exist")
    digest = sha256_file(archive)
    stem = re.sub(r"(\.tar(\.\w+)?|\.tgz|\.dsc)$", "", archive.name)
    dest = dest_root / f"{stem}-{digest[:12]}"
    kind = "dsc" if archive.suffix == ".dsc" else "tarball"
    if dest.is_dir():
        return SourceInfo(kind=kind, path=dest, url=str(archive), sha256=digest)
    dest_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.", dir=dest_root))
    try:
        if kind == "dsc":
            if shutil.which("dpkg-source") is None:
                raise ToolMissing("dpkg-source is needed to unpack a .dsc", hint="apt-get install dpkg-dev")
            print(f"$ dpkg-source -x {archive}", file=out, flush=True)
            proc = subprocess.run(
                ["dpkg-source", "--no-check", "-x", str(archive), str(tmp / "tree")],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise SourceError(f"dpkg-source -x {archive.name} failed: {proc.stderr.strip()[-300:]}")
            top = tmp / "tree"
        else:
            try:
                with tarfile.open(archive) as tar:
                    _safe_extract(tar, tmp / "tree")
            except tarfile.TarError as exc:
                raise SourceError(f"{archive} is not a readable tarball: {exc}") from exc
            entries = list((tmp / "tree").iterdir())
            top = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp / "tree"
        os.replace(top, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return SourceInfo(kind=kind, path=dest, url=str(archive), sha256=digest)


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    dest.mkdir(parents=True)
    root = dest.resolve()
    for member in tar.getmembers():
        target = (dest / member.name).resolve()
        if root not in (target, *target.parents) or member.isdev():
            raise SourceError(f"refusing unsafe tarball member {member.name!r}")
    if hasattr(tarfile, "data_filter"):  # Python >= 3.12 (and security backports)
        tar.extractall(dest, filter="data")
    else:  # members were checked above
        tar.extractall(dest)


def looks_like_url(text: str) -> bool:
    return bool(_URL_RE.match(text)) or text.endswith(".git")
