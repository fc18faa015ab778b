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

pytestmark = pytest.mark.skipif(shutil.which("dpkg-source") is None, reason="needs dpkg-dev's dpkg-source")

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


def test_a_dsc_whose_symlinks_stay_inside_is_unpacked(tmp_path):
    dsc = make_dsc(tmp_path / "pkg", "debian")  # build -> debian: inside the tree
    dest = tmp_path / "srcs"
    res = run_invoke("source", "--source", str(dsc), "--dest", str(dest), "--no-patch")
    assert res.returncode == 0, res.stdout + res.stderr
    (tree,) = dest.iterdir()
    assert os.readlink(tree / "build") == "debian" and (tree / "setup.py").is_file()
