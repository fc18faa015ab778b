"""Bad inputs to the source side: patches that reach outside the tree, broken archives,
unusable destinations. Each case says what the user gave and what they must see."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from torchbuild.errors import PatchConflict, UnsafePatch
from torchbuild.patches import apply_series, load_series

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
