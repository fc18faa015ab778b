"""A fetched source is a stranger's input (issue 41 items 2 and 3), with the real tools:
dpkg-source unpacking a .dsc whose orig tarball holds `build -> /elsewhere`, and git cloning a
repository whose .gitmodules names another local repository over file://. Through
`invoke source`, as a user runs it; no Docker engine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import run_invoke

needs_dpkg_source = pytest.mark.skipif(shutil.which("dpkg-source") is None, reason="needs dpkg-dev's dpkg-source")

CHANGELOG = """tbpkg (1.0-1) unstable; urgency=medium

  * test.

 -- T <t@example.invalid>  Mon, 01 Jan 2024 00:00:00 +0000
"""
CONTROL = """Source: tbpkg
Maintainer: T <t@example.invalid>

Package: tbpkg
Architecture: all
Description: test
 test
"""


def make_dsc(work: Path, link_target: str) -> Path:
    """tbpkg_1.0-1.dsc built by dpkg-source -b, its orig tarball holding setup.py and
    `build -> link_target`."""
    tree = work / "tbpkg-1.0"
    tree.mkdir(parents=True)
    (tree / "setup.py").write_text("# x\n")
    (tree / "build").symlink_to(link_target)
    subprocess.run(["tar", "-czf", "tbpkg_1.0.orig.tar.gz", "tbpkg-1.0"], cwd=work, check=True)
    (tree / "debian" / "source").mkdir(parents=True)
    (tree / "debian" / "source" / "format").write_text("3.0 (quilt)\n")
    (tree / "debian" / "changelog").write_text(CHANGELOG)
    (tree / "debian" / "control").write_text(CONTROL)
    subprocess.run(["dpkg-source", "-b", "tbpkg-1.0"], cwd=work, check=True, capture_output=True)
    return work / "tbpkg_1.0-1.dsc"


@needs_dpkg_source
def test_a_dsc_whose_tree_has_a_symlink_leading_out_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dsc = make_dsc(tmp_path / "pkg", str(elsewhere))
    dest = tmp_path / "srcs"
    res = run_invoke("source", "--source", str(dsc), "--dest", str(dest), "--no-patch")
    assert res.returncode == 8, res.stdout + res.stderr
    assert "error: SourceError: tbpkg_1.0-1.dsc (as dpkg-source unpacked it): build is a symlink to" in res.stderr
    assert res.stderr.splitlines()[-1].startswith("hint: ") and "Traceback" not in res.stderr
    assert not dest.exists(), "the unpacked tree (or the directory made for it) was left"
    assert list(elsewhere.iterdir()) == []


@needs_dpkg_source
def test_a_dsc_whose_symlinks_stay_inside_is_unpacked(tmp_path):
    dsc = make_dsc(tmp_path / "pkg", "debian")  # build -> debian: inside the tree
    dest = tmp_path / "srcs"
    res = run_invoke("source", "--source", str(dsc), "--dest", str(dest), "--no-patch")
    assert res.returncode == 0, res.stdout + res.stderr
    (tree,) = dest.iterdir()
    assert os.readlink(tree / "build") == "debian" and (tree / "setup.py").is_file()


# ------------------------------------------------------------------ item 3: submodules over file://

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid"}
GIT_ENV |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
SECRET = "the private repository's secret\n"
# what a user who trusts the source sets for one run (git's own configuration, not torchbuild's)
TRUST_FILE = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.file.allow", "GIT_CONFIG_VALUE_0": "always"}


def git(*args: str, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_CONFIG")}
    subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd, env={**env, **GIT_ENV}, check=True)


def repo_with_submodule(tmp_path: Path, url_of) -> Path:
    """An 'upstream' repository whose .gitmodules names url_of(private), a local repository
    holding a secret."""
    private = tmp_path / "private"
    private.mkdir()
    git("init", "-q", "-b", "main", cwd=private)
    (private / "secret.txt").write_text(SECRET)
    git("add", ".", cwd=private)
    git("commit", "-q", "-m", "secret", cwd=private)
    up = tmp_path / "upstream"
    up.mkdir()
    git("init", "-q", "-b", "main", cwd=up)
    (up / "setup.py").write_text("# x\n")
    git("add", ".", cwd=up)
    git("commit", "-q", "-m", "top", cwd=up)
    git("submodule", "add", "-q", url_of(private), "third_party/p", cwd=up)
    git("commit", "-q", "-m", "add p", cwd=up)
    return up


def _source(up: Path, dest: Path, cache: Path, env: dict[str, str] | None = None):
    clean = {k: "" for k in os.environ if k.startswith("GIT_CONFIG")}
    return run_invoke(
        "source", "--source", up.as_uri(), "--ref", "main", "--dest", str(dest), "--no-patch",
        "--set", f"cache_dir={cache}", env={**clean, **(env or {})},
    )  # fmt: skip


def _holding_the_secret(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.name == "secret.txt"]


@pytest.mark.parametrize("url_of", [Path.as_uri, str], ids=["file:// URL", "plain local path"])
def test_a_submodule_naming_a_local_repository_is_not_checked_out(tmp_path, url_of):
    """The source's own file:// URL is cloned (torchbuild was given it), its mirror kept in the
    cache; the submodule URL from its .gitmodules, a repository on this machine, is refused as
    git refuses it (CVE-2022-39253): no checkout of it in the tree, no mirror of it in the cache."""
    up = repo_with_submodule(tmp_path, url_of)
    dest, cache = tmp_path / "tree", tmp_path / "cache"
    res = _source(up, dest, cache)
    assert res.returncode == 8, res.stdout + res.stderr
    assert "error: SourceError: submodule third_party/p names a repository on this machine" in res.stderr
    assert "CVE-2022-39253" in res.stderr and res.stderr.splitlines()[-1].startswith("hint: ")
    assert not dest.exists() and _holding_the_secret(dest, cache, tmp_path / ".tree.partial") == []
    assert [p.name.rsplit("-", 1)[0] for p in (cache / "git").iterdir()] == ["upstream"]


def test_a_user_who_trusts_the_source_allows_it_in_gits_configuration(tmp_path):
    up = repo_with_submodule(tmp_path, Path.as_uri)
    dest = tmp_path / "tree"
    res = _source(up, dest, tmp_path / "cache", env=TRUST_FILE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (dest / "third_party" / "p" / "secret.txt").read_text() == SECRET
