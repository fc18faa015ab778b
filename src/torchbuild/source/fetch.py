"""Getting PyTorch source: git (with submodules and a reusable mirror cache), a local tree,
a tarball, or a Debian .dsc. Every fetch returns a SourceInfo recorded in the manifest.
The source of a library built beside torch (nccl, aws-ofi-nccl, a companion) comes the same
ways through `fetch`, an archive checked against its sha256 before it is unpacked.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import lzma
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from torchbuild.core.atomic import atomic_writer
from torchbuild.core.console import redact
from torchbuild.core.errors import (
    InsufficientSpace,
    PathError,
    ProfileError,
    SourceError,
    ToolMissing,
    UsageError,
    named_os_errors,
    writable_dir,
)
from torchbuild.core.process import run_attached, run_captured
from torchbuild.core.safeio import not_an_option, sha256_file, user_path
from torchbuild.image.host import tree_digest
from torchbuild.profile.config import BuildSpec
from torchbuild.source.patches import ApplyResult as ApplyResult  # re-exported: the patch series, for builder
from torchbuild.source.patches import Series as Series  # re-exported: builder, configview
from torchbuild.source.patches import apply_series as apply_series  # re-exported: builder/host.py
from torchbuild.source.patches import load_series as load_series  # re-exported: builder, configview

_GIT = ["git", "-c", "advice.detachedHead=false"]
# The file protocol (file:// and plain local paths) is allowed only where torchbuild itself
# names the repository: the user's --source or torch_repo, and the mirror it keeps of it. A URL
# from a fetched tree (a submodule's) runs under git's own rule for submodules (CVE-2022-39253,
# refused by default since git 2.38.1): GIT_PROTOCOL_FROM_USER=0 makes the default policy
# ("user") refuse it even where torchbuild clones the submodule's mirror itself; a user who
# trusts such a tree allows it in git's configuration (protocol.file.allow=always).
_TRUSTED = ["-c", "protocol.file.allow=always"]
_FILE_REFUSED = "transport 'file' not allowed"
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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceInfo:
        """The inverse of to_dict (a resumed run's record of its tree)."""
        d = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        d["path"] = Path(str(d["path"]))
        d["submodules"] = tuple((str(s["path"]), str(s["commit"])) for s in d.get("submodules", ()))
        return cls(**d)


def _git(*args: str, cwd: Path | None = None, out: TextIO | None = None, trusted: bool = False) -> str:
    """git ARGS; trusted: the file protocol is allowed (a repository torchbuild was told to use),
    else git's rule for a submodule's URL applies (_TRUSTED)."""
    if shutil.which("git") is None:
        raise ToolMissing("git is not installed", hint="apt-get install git")
    cmd = [*_GIT, *(_TRUSTED if trusted else []), *args]
    if out is not None:
        print(redact(f"$ git {' '.join(args)}"), file=out, flush=True)  # a URL's token stays out of the log
    env = None if trusted else {**os.environ, "GIT_PROTOCOL_FROM_USER": "0"}
    # attached: git may ask for a URL's credentials on the terminal (core/process.py)
    proc = run_attached(cmd, cwd=cwd, env=env, capture=True)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        what = f"git {' '.join(args[:3])} failed"
        if "No space left on device" in detail:
            raise InsufficientSpace(f"{what}: no space left on device\n{detail}")
        raise SourceError(
            f"{what}:\n{detail}", hint="check the URL, the ref and network access; git's own words are above"
        )
    return proc.stdout.strip()


def mirror_path(cache: Path, url: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rstrip("/").rsplit("/", 1)[-1])
    return cache / "git" / f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def update_mirror(cache: Path, url: str, out: TextIO = sys.stdout, trusted: bool = True) -> Path:
    """A bare mirror of url in the cache, created or refreshed; later clones borrow its objects.
    trusted: url is one torchbuild was given (not a submodule's from a fetched tree)."""
    mirror = mirror_path(cache, url)
    if (mirror / "HEAD").is_file():
        _git(f"--git-dir={mirror}", "remote", "update", "--prune", out=out, trusted=trusted)
    else:
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=mirror.name + ".", dir=mirror.parent))
        try:
            _git("clone", "--mirror", "--quiet", "--", url, str(tmp / "m"), out=out, trusted=trusted)
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
    """Check out every submodule (recursively), borrowing objects from per-URL mirrors. The
    URLs come from the fetched tree: git's rule for submodules applies (no local repository
    unless the user's git configuration allows it)."""
    _git("submodule", "sync", "--quiet", cwd=repo)
    for path, url in _submodules(repo):
        args = ["submodule", "update", "--init", "--quiet"]
        try:
            if cache is not None and _URL_RE.match(url):
                args.append(f"--reference={update_mirror(cache, url, out, trusted=False)}")
            _git(*args, "--", path, cwd=repo, out=out)
        except SourceError as exc:
            if _FILE_REFUSED in exc.message:
                raise _local_submodule(path, url) from None
            raise
        _init_submodules(repo / path, cache, out)


def _local_submodule(path: str, url: str) -> SourceError:
    return SourceError(
        f"submodule {path} names a repository on this machine ({url}), which a fetched tree may not check "
        "out: git refuses it since 2.38.1 (CVE-2022-39253)",
        hint="if you trust this source, allow it in git's configuration: "
        "git config --global protocol.file.allow always (or GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=protocol.file.allow "
        "GIT_CONFIG_VALUE_0=always for one run)",
    )


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


def _clone(url: str, ref: str, partial: Path, cache: Path | None, out: TextIO) -> None:
    """Clone url at ref with submodules into partial (see fetch_git). Every value from the user
    comes after `--`, `--end-of-options` or in `--option=value` form: git never reads it as an
    option (git 2.39's `checkout` takes no --end-of-options: `switch` does)."""
    if cache is not None:
        mirror = update_mirror(cache, url, out)
        _git(
            "clone", "--quiet", "--no-checkout", f"--reference={mirror}", "--", str(mirror), str(partial),
            out=out, trusted=True,
        )  # fmt: skip
        _git("remote", "set-url", "--end-of-options", "origin", url, cwd=partial)
        try:  # a branch: checked out as a local branch that tracks it (`invoke source --update`)
            _git("rev-parse", "--verify", "--quiet", f"refs/remotes/origin/{ref}", cwd=partial)
            detach: list[str] = []
        except SourceError:  # a tag or a commit
            detach = ["--detach"]
        try:
            _git("switch", "--quiet", *detach, "--end-of-options", ref, cwd=partial, out=out)
        except SourceError as exc:
            raise SourceError(
                f"cannot check out {ref}: it is not a branch, tag or commit of {url}\n{exc.message}",
                hint="check the ref (git ls-remote URL lists branches and tags)",
            ) from None
    else:
        try:
            _git("clone", "--quiet", "--depth", "1", f"--branch={ref}", "--", url, str(partial), out=out, trusted=True)
        except SourceError:  # a commit id cannot be cloned with --branch: fetch it
            shutil.rmtree(partial, ignore_errors=True)
            _git("init", "--quiet", "--", str(partial))
            _git("remote", "add", "--end-of-options", "origin", url, cwd=partial)
            _git(
                "fetch",
                "--quiet",
                "--depth",
                "1",
                "--end-of-options",
                "origin",
                ref,
                cwd=partial,
                out=out,
                trusted=True,
            )
            _git("checkout", "--quiet", "FETCH_HEAD", cwd=partial)
    _init_submodules(partial, cache, out)


def fetch_git(url: str, ref: str, dest: Path, cache: Path | None, out: TextIO = sys.stdout) -> SourceInfo:
    """Clone url at ref (tag, branch or commit) with submodules into dest.

    With a cache, the clone comes from a bare mirror kept in <cache>/git (a second clone at
    another tag only fetches what is new); without one, a shallow clone of the ref is made.
    dest must not exist; on failure nothing is left at dest. A url or ref that starts with `-`
    (git would read it as an option) is a UsageError.
    """
    not_an_option(url, "git URL")
    not_an_option(ref, "git ref")
    if dest.exists():
        raise SourceError(f"{dest} already exists", hint="remove it, or pass it as --source to build it as it is")
    partial = dest.with_name(f".{dest.name}.partial")
    with named_os_errors(dest, "fetching the source into"):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            _clone(url, ref, partial, cache, out)
            check_links(partial, f"{url} at {ref}")
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
    _git("fetch", "--quiet", "origin", cwd=tree, out=out, trusted=True)  # the tree's own origin
    _git("merge", "--ff-only", "--quiet", "@{upstream}", cwd=tree, out=out)
    _git("submodule", "sync", "--quiet", "--recursive", cwd=tree)
    try:  # the submodules' URLs come from the fetched tree: git's rule for them applies
        _git("submodule", "update", "--init", "--recursive", "--quiet", cwd=tree, out=out)
    except SourceError as exc:
        if _FILE_REFUSED in exc.message:
            named = re.search(r"clone of '(.*?)' into submodule path '(.*?)' failed", exc.message)
            url, path = named.groups() if named else ("a local path or file:// URL", "(one of them)")
            raise _local_submodule(path, url) from None
        raise
    check_links(tree, f"{tree} after the update")
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


def unpack_archive(archive: Path, dest_root: Path, out: TextIO = sys.stdout, expect: str = "") -> SourceInfo:
    """Unpack a tarball or a Debian .dsc (with its patch series) under dest_root/<name>-<sha>;
    with expect (the profile's torch_sha256), an archive of another digest is a SourceError
    before anything is unpacked.

    It is unpacked into a temporary sibling and renamed into place when complete: a truncated
    or foreign file is a SourceError naming it, and leaves no directory behind (not even
    dest_root, when this call created it). OS faults are named errors (PathError, InsufficientSpace)."""
    with named_os_errors(dest_root, f"unpacking {archive.name} into"):
        return _unpack(archive, dest_root, out, expect)


def _unpack(archive: Path, dest_root: Path, out: TextIO, expect: str = "") -> SourceInfo:
    if not archive.is_file():
        raise SourceError(f"source archive {archive} does not exist")
    digest = sha256_file(archive)
    if expect and digest != expect:
        raise SourceError(
            f"source archive {archive} has sha256 {digest}, not the profile's torch_sha256 {expect}",
            hint="fetch the archive again from where the digest was published, or correct torch_sha256",
        )
    stem = re.sub(r"(\.tar(\.\w+)?|\.tgz|\.dsc)$", "", archive.name)
    dest = dest_root / f"{stem}-{digest[:12]}"
    kind = "dsc" if archive.suffix == ".dsc" else "tarball"
    if not dest.is_dir():
        _unpack_new(archive, kind, dest, out)
    else:  # unpacked before (perhaps by a torchbuild that did not check dpkg-source's tree)
        check_links(dest, f"{archive.name} (unpacked earlier at {dest})")
    return SourceInfo(kind=kind, path=dest, url=str(archive), sha256=digest)


def _unpack_new(archive: Path, kind: str, dest: Path, out: TextIO) -> None:
    """Unpack archive into a temporary directory beside dest, then rename it to dest."""
    missing = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            top = _run_dpkg_source(archive, tmp / "tree", out) if kind == "dsc" else _extract_tarball(archive, tmp)
            os.replace(top, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        for p in missing:  # the directories this call created, innermost first
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


def _run_dpkg_source(archive: Path, tree: Path, out: TextIO) -> Path:
    if shutil.which("dpkg-source") is None:
        raise ToolMissing("dpkg-source is needed to unpack a .dsc", hint="apt-get install dpkg-dev")
    print(f"$ dpkg-source -x {archive}", file=out, flush=True)
    proc = run_captured(["dpkg-source", "--no-check", "-x", str(archive), str(tree)])
    if proc.returncode != 0:
        raise SourceError(f"dpkg-source -x {archive.name} failed: {proc.stderr.strip()[-300:]}")
    check_links(tree, f"{archive.name} (as dpkg-source unpacked it)")
    return tree


def _extract_tarball(archive: Path, tmp: Path) -> Path:
    """Extract into tmp/tree; the tree's top directory (its only entry when it has one)."""
    try:
        with tarfile.open(archive) as tar:
            safe_extract(tar, tmp / "tree")
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise _unreadable(archive, exc) from exc
    except OSError as exc:
        if exc.errno is not None:  # the OS's fault (disk full, read-only...): named by the caller
            raise
        raise _unreadable(archive, exc) from exc  # a decompressor's complaint (bad CRC, bad stream)
    entries = list((tmp / "tree").iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp / "tree"


def _unreadable(archive: Path, exc: BaseException) -> SourceError:
    return SourceError(
        f"{archive} is not a readable tarball (truncated, or not an archive): {exc or type(exc).__name__}",
        hint="download it again and compare its sha256 with the published one, or pass a git URL or directory",
    )


def safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract tar into dest, refusing (SourceError, "unsafe") any member that would write or
    point outside dest: an absolute or `..` name, a member under a symlink leading out, a symlink
    or hard link whose target is outside, a device or FIFO. Each member is checked against what
    is already on disk just before it is written (a symlink extracted earlier is followed), so
    Pythons without tarfile's data filter (3.9 to 3.11.3) are as safe; where it exists, the
    data filter checks again."""
    dest.mkdir(parents=True)
    members = _checked_members(tar, dest.resolve())
    try:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.12 and the 3.8-3.11 security releases
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)
    except getattr(tarfile, "FilterError", ()) as exc:  # a TarError, but not a damaged archive
        raise _unsafe(exc.tarinfo.name, str(exc)) from exc


def _checked_members(tar: tarfile.TarFile, root: Path) -> Iterator[tarfile.TarInfo]:
    """tar's members, each checked as extractall reaches it (after the members before it are
    on disk), with set-id bits, group/other write and the archive's owners dropped."""
    for member in tar:
        where = Path(os.path.realpath(root / member.name))
        if os.path.isabs(member.name) or not _inside(where, root):
            raise _unsafe(member.name, "it would be written outside the tree (an absolute or `..` path, or a symlink)")
        parents = Path(member.name).parents
        if any((root / parent).is_symlink() for parent in parents if parent.name):
            raise _unsafe(member.name, "it would be written through a symlink the archive made")
        if member.isdev():
            raise _unsafe(member.name, "it is a device or FIFO")
        if member.issym() and _leads_out(root / member.name, member.linkname, root):
            raise _unsafe(member.name, f"it is a symlink to {member.linkname!r}, outside the tree")
        elif member.islnk():
            target = os.path.realpath(root / member.linkname)
            if os.path.isabs(member.linkname) or not _inside(Path(target), root):
                raise _unsafe(member.name, f"it is a hard link to {member.linkname!r}, outside the tree")
        safe = copy.copy(member)
        safe.mode &= 0o755 if member.isdir() or member.mode & 0o100 else 0o644
        safe.uid, safe.gid, safe.uname, safe.gname = os.getuid(), os.getgid(), "", ""
        yield safe


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _leads_out(link: Path, target: str, root: Path) -> bool:
    """The tarball rule for a symlink at link (under root) to target: an absolute target, or one
    that resolves outside root, leads out (a later write through it would land outside)."""
    return os.path.isabs(target) or not _inside(Path(os.path.realpath(link.parent / target)), root)


def check_links(tree: Path, what: str) -> None:
    """SourceError naming the first symlink in tree that leads out of it (the tarball rule,
    _leads_out), wherever the tree came from: dpkg-source keeps the orig tarball's `build ->
    /elsewhere`, and git checks out a committed one; a build would write through it."""
    root = Path(os.path.realpath(tree))
    pending = [root]
    while pending:
        with os.scandir(pending.pop()) as entries:  # scandir's types: no stat per entry
            for entry in entries:
                if entry.is_symlink():
                    target = os.readlink(entry.path)
                    if _leads_out(Path(entry.path), target, root):
                        raise SourceError(
                            f"{what}: {Path(entry.path).relative_to(root)} is a symlink to {target!r}, outside the tree",
                            hint="a build would write through it outside the tree; get the source from a trusted "
                            "place, or remove the link",
                        )
                elif entry.is_dir():
                    pending.append(Path(entry.path))


def _unsafe(name: str, why: str) -> SourceError:
    return SourceError(
        f"refusing unsafe tarball member {name!r}: {why}",
        hint="this archive would write outside the directory it is unpacked into; get the source from a trusted place",
    )


def looks_like_url(text: str) -> bool:
    return bool(_URL_RE.match(text)) or text.endswith(".git")


def default_tree(spec: BuildSpec, ref: str) -> Path:
    """Where a git source at ref is checked out when --dest is not given."""
    safe = ref.replace("/", "_")
    return _cache(spec) / "src" / f"pytorch-{safe}"


def get_source(
    spec: BuildSpec, source: str = "", ref: str = "", dest: str = "", out: TextIO = sys.stdout
) -> SourceInfo:
    """--source as given: a git URL, a directory, a tarball or .dsc; empty means the profile's repo.

    --ref applies to git sources only; --dest is where a git source is checked out or an
    archive unpacked, and cannot move a local tree (UsageError naming the option). A --dest
    that is a file, or cannot be written, is a PathError. A --source or --ref that starts with
    `-` (git would read it as an option) is a UsageError."""
    not_an_option(source, "--source")
    not_an_option(ref, "--ref")
    with named_os_errors(dest or source or spec.cache_dir, "getting the source"):
        if source and not looks_like_url(source):
            return _get_local(spec, user_path(source).resolve(), ref, dest, out)
        return _get_git(spec, source, ref, dest, out)


def _no_sha256_for(spec: BuildSpec, what: str) -> None:
    """torch_sha256 checks an archive: set for a git or directory source, it is refused by name
    (a digest that is never checked would read as a pin)."""
    if spec.torch_sha256:
        raise SourceError(
            f"torch_sha256 is set, but the source {what}: a sha256 checks an archive",
            hint="drop torch_sha256 (a commit pins a git source), or pass the archive as --source",
        )


def _get_git(spec: BuildSpec, source: str, ref: str, dest: str, out: TextIO) -> SourceInfo:
    ref = ref or spec.git_ref
    url = source or spec.torch_repo
    _no_sha256_for(spec, f"{url} is a git repository")
    tree = user_path(dest).absolute() if dest else default_tree(spec, ref)
    if tree.is_dir():
        print(f"using existing checkout {tree} (`invoke source --update` refreshes a branch)", file=out)
        return dataclasses.replace(describe_dir(tree), kind="git", ref=ref)
    return fetch_git(url, ref, _usable_dest(tree, "--dest" if dest else "the checkout directory"), _cache(spec), out)


def _cache(spec: BuildSpec) -> Path:
    return user_path(spec.cache_dir)


def _get_local(spec: BuildSpec, path: Path, ref: str, dest: str, out: TextIO) -> SourceInfo:
    """A local tree (built where it is) or an archive (unpacked under --dest or the cache)."""
    if path.is_dir():
        for option, value in (("--ref", ref), ("--dest", dest)):
            if value:
                raise UsageError(
                    f"{option} {value} cannot be used with a local tree (--source {path}): it is built as it is",
                    hint=f"drop {option}; to build another ref, check it out in the tree (git -C {path} checkout REF)",
                )
        _no_sha256_for(spec, f"{path} is a directory")
        return describe_dir(path)
    if ref:
        raise UsageError(
            f"--ref {ref} cannot be used with an archive (--source {path}): an archive holds one version",
            hint="drop --ref, or pass a git URL as --source to choose a ref",
        )
    root = _usable_dest(user_path(dest).absolute(), "--dest") if dest else _cache(spec) / "src"
    return unpack_archive(path, root, out=out, expect=spec.torch_sha256)


def _usable_dest(path: Path, option: str) -> Path:
    """path, when it is (or can be made) a directory this user can write; PathError otherwise.
    Nothing is created here."""
    if path.exists() and not path.is_dir():
        raise PathError(f"{option} {path} exists and is not a directory", hint="choose a directory path")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise PathError(f"{option} {path}: {existing} is a file, not a directory", hint="choose a directory path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PathError(f"{option} {path}: {existing} is not writable", hint="choose a directory you can write to")
    return path


# --------------------------------------------------------------------------- a library's source
# (nccl and aws-ofi-nccl for comms/host.py, a companion archive for builder/companions.py)


@dataclasses.dataclass(frozen=True)
class Source:
    """A source tree ready to build, and what identifies its content."""

    tree: Path
    origin: str  # the URL or path it came from
    digest: str  # sha256 of the archive, or of the tree's files


def fetch(
    what: str,
    source: str,
    default_url: str,
    sha256: str,
    cache: Path,
    out: TextIO = sys.stdout,
    ref: str = "",
    *,
    key: str = "",
    area: str = "comms-src",
    sha_key: str = "",
) -> Source:
    """The source of `what` (nccl, aws-ofi-nccl, a companion library) unpacked in <cache>/<area>:
    source is an archive URL, a git URL (cloned at ref), a tarball, a .dsc or a directory
    ('' = default_url); sha256, when given, is checked before anything is unpacked. key is the
    profile key named in errors (default <what>_source)."""
    key, sha_key = key or f"{what}_source", sha_key or f"{what}_sha256"
    origin = source or default_url
    local = user_path(origin).absolute()
    if is_git_url(origin) and not local.is_dir():
        if sha256:
            raise ProfileError(
                f"{key}: {origin} is a git repository; a sha256 checks an archive", hint=f"drop {sha_key}"
            )
        return _clone_source(origin, ref, cache, out)
    if looks_like_url(origin) and not local.is_dir():
        archive = download(origin, cache / "downloads", sha256, key, out)
    else:
        path = local
        if path.is_dir():
            if sha256:
                raise ProfileError(f"{key}: {path} is a directory; a sha256 checks an archive", hint=f"drop {sha_key}")
            return Source(tree=path, origin=str(path), digest=tree_digest(path))
        if not path.is_file():
            raise ProfileError(f"{key}: {path} does not exist", hint="give a tarball, a .dsc, a directory or a URL")
        archive = path
        _check_sha(archive, sha256, key)
    info = unpack_archive(archive, cache / area, out)
    return Source(tree=info.path, origin=origin, digest=info.sha256 or sha256_file(archive))


def is_git_url(text: str) -> bool:
    """A repository to clone (git@, git://, ssh:// or a URL ending in .git), not an archive."""
    return text.startswith(("git@", "git://", "ssh://")) or (looks_like_url(text) and text.rstrip("/").endswith(".git"))


def _clone_source(url: str, ref: str, cache: Path, out: TextIO) -> Source:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git"))
    dest = cache / "comms-src" / f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:8]}-{ref or 'HEAD'}"
    info = describe_dir(dest) if dest.is_dir() else fetch_git(url, ref, dest, cache, out)
    return Source(tree=dest, origin=f"{url}@{ref}", digest=info.commit or tree_digest(dest))


def _check_sha(archive: Path, sha256: str, key: str, label: str = "") -> None:
    if sha256:
        with named_os_errors(archive, key):
            got = sha256_file(archive)
        _check_digest(got, sha256, key, label or archive.name)


def _check_digest(got: str, sha256: str, key: str, label: str) -> None:
    if sha256 and got != sha256:
        raise SourceError(
            f"{key}: {label} has sha256 {got}, not the {sha256} expected",
            hint="download it again from the release page; if the release was re-tagged, check and update the sha256",
        )


def download(url: str, dest_dir: Path, sha256: str, key: str, out: TextIO = sys.stdout) -> Path:
    """url saved as dest_dir/<its name> (kept for the next run), whole or not at all."""
    # the URL's own hash first: two URLs ending in the same name (master.tar.gz) stay apart
    base = re.sub(r"[^A-Za-z0-9._+-]", "_", url.rstrip("/").rsplit("/", 1)[-1]) or "download"
    name = f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{base}"
    dest = writable_dir(dest_dir, "cache_dir") / name
    if dest.is_file() and (not sha256 or sha256_file(dest) == sha256):
        return dest
    print(f"downloading {url}", file=out, flush=True)
    try:
        # 0600, as the cache's downloads always were (mkstemp's mode)
        with atomic_writer(dest, mode=0o600) as f, urllib.request.urlopen(url, timeout=60) as resp:
            hasher = hashlib.sha256()
            while chunk := resp.read(1 << 20):
                hasher.update(chunk)
                f.write(chunk)
            _check_digest(hasher.hexdigest(), sha256, key, url)
    except (urllib.error.URLError, TimeoutError) as exc:
        raise SourceError(
            f"{key}: could not download {url}: {getattr(exc, 'reason', exc)}",
            hint=f"download it where you can and set {key} to the file (with its sha256)",
        ) from None
    return dest
