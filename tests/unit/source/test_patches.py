from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from torchbuild.core.errors import PatchConflict
from torchbuild.source.patches import apply_series, find_series_dir, load_series, patches_root


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def make_patch(tmp: Path, name: str, path: str, old: str, new: str) -> Path:
    """A git-style patch turning `old` into `new` in `path` (git diff in a scratch repository)."""
    scratch = tmp / f"scratch-{name}"
    f = scratch / path
    f.parent.mkdir(parents=True)
    f.write_text(old)
    subprocess.run(["git", "init", "-q"], cwd=scratch, check=True)
    subprocess.run(["git", "add", "-A"], cwd=scratch, check=True)
    f.write_text(new)
    diff = subprocess.run(["git", "diff"], cwd=scratch, capture_output=True, text=True, check=True).stdout
    series = tmp / "series"
    series.mkdir(exist_ok=True)
    p = series / name
    p.write_text(f"Header text: what this patch does.\n\n{diff}")
    return p


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "tree"
    (t / "src").mkdir(parents=True)
    (t / "src/a.cpp").write_text("int a() {\n  return 1;\n}\n")
    (t / "src/b.cpp").write_text("int b() {\n  return 2;\n}\n")
    return t


def test_series_applies_in_order_then_rerun_is_a_noop(tmp_path, tree):
    make_patch(tmp_path, "01-a.patch", "src/a.cpp", "int a() {\n  return 1;\n}\n", "int a() {\n  return 10;\n}\n")
    # 02 builds on 01: it can only be checked after 01
    make_patch(
        tmp_path, "02-a-again.patch", "src/a.cpp", "int a() {\n  return 10;\n}\n", "int a() {\n  return 11;\n}\n"
    )
    series = load_series(str(tmp_path / "series"), "2.6.0")
    first = apply_series(tree, series)
    assert first.applied == ("01-a.patch", "02-a-again.patch") and first.skipped == ()
    assert "return 11;" in (tree / "src/a.cpp").read_text()
    before = tree_digest(tree)
    second = apply_series(tree, series)
    assert second.applied == () and second.skipped == ("01-a.patch", "02-a-again.patch")
    assert tree_digest(tree) == before


def test_a_series_named_by_a_relative_path_applies(tmp_path, tree, monkeypatch):
    """`patches: tests/fixtures/patches/...` in a profile, relative to where invoke runs: git
    apply runs in the tree, where the relative path named nothing (PatchConflict "can't open
    patch" in the first real build)."""
    make_patch(tmp_path, "01-a.patch", "src/a.cpp", "int a() {\n  return 1;\n}\n", "int a() {\n  return 10;\n}\n")
    monkeypatch.chdir(tmp_path)
    done = apply_series(tree, load_series("series", "2.6.0"))
    assert done.applied == ("01-a.patch",) and "return 10;" in (tree / "src/a.cpp").read_text()


def test_conflict_names_patch_and_hunk_and_leaves_tree_untouched(tmp_path, tree):
    make_patch(tmp_path, "01-ok.patch", "src/b.cpp", "int b() {\n  return 2;\n}\n", "int b() {\n  return 20;\n}\n")
    make_patch(tmp_path, "02-bad.patch", "src/a.cpp", "int a() {\n  return 999;\n}\n", "int a() {\n  return 0;\n}\n")
    before = tree_digest(tree)
    with pytest.raises(PatchConflict) as exc:
        apply_series(tree, load_series(str(tmp_path / "series"), "2.6.0"))
    assert "02-bad.patch" in exc.value.message and "src/a.cpp:1" in exc.value.message
    assert tree_digest(tree) == before  # 01-ok.patch was not applied either


def test_series_checksum_covers_names_and_contents(tmp_path):
    p = make_patch(tmp_path, "01-a.patch", "x.c", "a\n", "b\n")
    c1 = load_series(str(tmp_path / "series"), "1").checksum
    p.write_text(p.read_text() + "\n")
    assert load_series(str(tmp_path / "series"), "1").checksum != c1
    assert load_series("none", "1").patches == ()


def test_version_directories(tmp_path):
    for d in ("2.4", "v2.6.0", "2.3"):
        (tmp_path / d).mkdir()
    (tmp_path / "2.5.1").mkdir()
    (tmp_path / "2.5.1" / "same-as").write_text("2.4\n")
    assert find_series_dir("2.4.1", tmp_path) == tmp_path / "2.4"
    assert find_series_dir("v2.4.0", tmp_path) == tmp_path / "2.4"
    assert find_series_dir("2.6.0", tmp_path) == tmp_path / "v2.6.0"
    assert find_series_dir("2.5.1", tmp_path) == tmp_path / "2.4"
    assert find_series_dir("2.7.0", tmp_path) is None


def test_shipped_cuda_aware_mpi_patch_for_2_3_and_2_4():
    for version in ("2.3.0", "2.3.1", "2.4.0", "2.4.1"):
        series = load_series("auto", version)
        names = [p.name for p in series.patches]
        assert any("cuda-aware-mpi" in n for n in names), (version, names)
        text = series.patches[0].path.read_text()
        assert "ProcessGroupMPI.cpp" in text and "MPICH_GPU_SUPPORT_ENABLED" in text
    assert (patches_root() / "pytorch" / "README.md").is_file()
