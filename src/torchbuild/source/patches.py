"""Patch series: patches/<pkg>/<version>/NN-what.patch, applied in name order.

A patch is data (name, path, sha256); applying is separate. The whole series is checked
before anything is written, so a conflict leaves the tree untouched; patches already in
the tree are detected (they reverse-apply cleanly) and skipped, so a rerun is a no-op.

Version directories may be written 2.4.1 or v2.4.1; a directory for a minor series (2.4)
serves every release of it unless an exact directory exists. A directory holding a file
``same-as`` (its content a version) reuses that version's series.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from torchbuild.core.errors import PatchConflict, SourceError, ToolMissing, UnsafePatch
from torchbuild.core.process import Captured, run_captured
from torchbuild.core.safeio import sha256_file, user_path
from torchbuild.profile.config import data_dir


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    sha256: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True)
class Series:
    directory: Path | None  # None: no series for this version
    patches: tuple[Patch, ...]

    @property
    def checksum(self) -> str:
        """sha256 over the names and contents in order: one value for the manifest."""
        h = hashlib.sha256()
        for p in self.patches:
            h.update(f"{p.name}\0{p.sha256}\n".encode())
        return h.hexdigest()


def patches_root() -> Path:
    return data_dir() / "patches"


def _strip_v(v: str) -> str:
    return v[1:] if v.startswith("v") else v


def find_series_dir(version: str, pkg_dir: Path) -> Path | None:
    """The series directory for version: exact (with or without v), else its minor series."""
    version = _strip_v(version)
    minor = ".".join(version.split(".")[:2])
    seen: list[str] = []
    for candidate in (version, minor):
        for name in (candidate, f"v{candidate}"):
            d = pkg_dir / name
            if d.is_dir():
                same = d / "same-as"
                if same.is_file():
                    target = same.read_text().strip()
                    if target in seen or _strip_v(target) == version:
                        raise SourceError(f"{same}: same-as points back at {target}")
                    seen.append(target)
                    return find_series_dir(target, pkg_dir)
                return d
    return None


def load_series(setting: str, version: str, pkg: str = "pytorch") -> Series:
    """The series a profile's `patches` key selects: auto, none, or a directory."""
    if setting == "none":
        return Series(None, ())
    if setting == "auto":
        directory = find_series_dir(version, patches_root() / pkg)
    else:
        directory = user_path(setting).absolute()  # git apply runs in the tree: a relative path would miss
        if not directory.is_dir():
            raise SourceError(
                f"patches: {directory} is not a directory", hint="use auto, none or a directory of .patch files"
            )
    if directory is None:
        return Series(None, ())
    patches = tuple(Patch(p.name, p, sha256_file(p)) for p in sorted(directory.glob("*.patch")))
    return Series(directory, patches)


def _git_apply(tree: Path, *args: str) -> Captured:
    if shutil.which("git") is None:
        raise ToolMissing("git is needed to apply patches", hint="apt-get install git")
    # --unsafe-paths is not given: patches may touch only paths inside the tree. The ceiling
    # keeps git from finding an enclosing repository, whose root would change path handling.
    return run_captured(
        ["git", "apply", "--whitespace=nowarn", *args],
        cwd=tree,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)},
        timeout=600,  # local files only
    )


def _patch_paths(tree: Path, patch: Patch) -> list[str]:
    """Every path the patch reads or writes, as git parses it (a `diff --git` patch or a plain
    unified diff alike): --numstat names each file's new path (its old one for a deletion);
    reversed, it names the old paths, so renames and copies give both names."""
    paths: dict[str, None] = {}
    for direction in ((), ("--reverse",)):
        res = _git_apply(tree, "--numstat", "-z", *direction, "--", str(patch.path))
        if res.returncode != 0:
            raise PatchConflict(
                f"patch {patch.name} is not a patch git understands: {_failing_hunk(res.stderr)}",
                hint="a patch holds unified diffs (`git diff` or `diff -u` output); remove or fix the file",
            )
        for record in res.stdout.split("\0"):
            if record:
                paths[record.split("\t", 2)[-1]] = None
    return list(paths)


def _check_inside(tree: Path, patch: Patch, rel: str) -> None:
    """UnsafePatch unless rel names a place inside the tree, symlinks followed."""
    root = tree.resolve()
    pure = PurePosixPath(rel)
    target = (tree / rel).resolve()
    if pure.is_absolute() or ".." in pure.parts or (target != root and root not in target.parents):
        raise UnsafePatch(
            f"patch {patch.name} touches {rel}, which is outside the tree {tree}"
            f"{'' if '..' in pure.parts or pure.is_absolute() else f' (it leads to {target})'}; nothing was written"
        )


def touched_paths(tree: Path, patches: tuple[Patch, ...]) -> list[str]:
    """The paths the patches touch, each checked to lie inside the tree before anything is
    copied or written (UnsafePatch names the patch and the path otherwise)."""
    paths: dict[str, None] = {}
    for p in patches:
        for rel in _patch_paths(tree, p):
            _check_inside(tree, p, rel)
            paths[rel] = None
    return list(paths)


def _failing_hunk(stderr: str) -> str:
    m = re.search(r"patch failed: (\S+:\d+)", stderr)
    if m:
        return m.group(1)
    m = re.search(r"error: (\S+): (does not exist in index|No such file or directory|already exists)", stderr)
    if m:
        return f"{m.group(1)} ({m.group(2)})"
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("error:")]
    return lines[0][len("error: ") :] if lines else stderr.strip()[:200]


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    applied: tuple[str, ...]
    skipped: tuple[str, ...]  # already in the tree


class _Scratch:
    """A copy of just the files a series touches, where patches are tried for real."""

    def __init__(self, tree: Path, paths: list[str]) -> None:
        self.tree, self.paths = tree, paths
        self.dir = Path(tempfile.mkdtemp(prefix="torchbuild-patch-"))
        for rel in paths:
            src = tree / rel
            if src.is_file():
                (self.dir / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, self.dir / rel)

    def apply(self, patch: Patch, reverse: bool = False) -> Captured:
        return _git_apply(self.dir, *(["--reverse"] if reverse else []), "--", str(patch.path))

    def check_links(self, patches: tuple[Patch, ...]) -> None:
        """UnsafePatch when the patches made a symlink that leads out of the tree."""
        root = self.tree.resolve()
        for rel in self.paths:
            link = self.dir / rel
            if link.is_symlink():
                target = ((self.tree / rel).parent / os.readlink(link)).resolve()
                if target != root and root not in target.parents:
                    names = ", ".join(p.name for p in patches)
                    raise UnsafePatch(
                        f"patch series ({names}) makes {rel} a symlink to {os.readlink(link)}, "
                        f"outside the tree {self.tree}; nothing was written"
                    )

    def write_back(self) -> None:
        """Put the patched files into the tree (new files created, deleted files removed)."""
        for rel in self.paths:
            patched, target = self.dir / rel, self.tree / rel
            if patched.is_symlink() or patched.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.torchbuild-tmp")
                tmp.unlink(missing_ok=True)
                shutil.copy2(patched, tmp, follow_symlinks=False)
                os.replace(tmp, target)
            elif target.is_symlink() or target.is_file():
                target.unlink()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def applied_prefix(tree: Path, patches: tuple[Patch, ...]) -> int:
    """How many leading patches of the series the tree already has (0..n): the longest prefix
    that, undone last-first, reverse-applies cleanly (this copes with patches editing earlier ones)."""
    paths = touched_paths(tree, patches)
    for k in range(len(patches), 0, -1):
        scratch = _Scratch(tree, paths)
        try:
            if all(scratch.apply(p, reverse=True).returncode == 0 for p in reversed(patches[:k])):
                return k
        finally:
            scratch.close()
    return 0


def apply_series(tree: Path, series: Series) -> ApplyResult:
    """Skip the patches already in the tree, try the rest in order on a scratch copy of the
    files they touch, and write the result into the tree only when every one applied."""
    done = applied_prefix(tree, series.patches)
    skipped, todo = series.patches[:done], series.patches[done:]
    if not todo:
        return ApplyResult((), tuple(p.name for p in skipped))
    scratch = _Scratch(tree, touched_paths(tree, todo))
    try:
        for patch in todo:
            res = scratch.apply(patch)
            if res.returncode != 0:
                raise PatchConflict(
                    f"patch {patch.name} does not apply to {tree}: hunk at {_failing_hunk(res.stderr)} "
                    f"(series {series.directory}); the tree was not changed"
                )
        scratch.check_links(todo)
        scratch.write_back()
    finally:
        scratch.close()
    return ApplyResult(tuple(p.name for p in todo), tuple(p.name for p in skipped))
