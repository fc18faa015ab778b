from __future__ import annotations

import json
import os
import shutil

import pytest

from torchbuild.builder.step import BuildRequest, object_target
from torchbuild.core import records
from torchbuild.core.errors import BuildFailed
from torchbuild.profile.config import resolve
from torchbuild.runtime.compile_job import hit_rate

NINJA = """rule cc
  command = touch $out
build caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/cpu/int4mm_kernel.cpp.DEFAULT.cpp.o: cc x
build caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/cpu/int4mm_kernel.cpp.AVX2.cpp.o: cc x
build c10/CMakeFiles/c10.dir/util/Logging.cpp.o: cc x
build other/CMakeFiles/o.dir/Logging.cpp.o: cc x
build x: phony
"""


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_object_targets_for_plain_and_per_capability_sources(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "build.ninja").write_text(NINJA)
    env = dict(os.environ)
    assert object_target(str(tmp_path), "aten/src/ATen/native/cpu/int4mm_kernel.cpp", env).endswith(
        "int4mm_kernel.cpp.DEFAULT.cpp.o"
    )
    assert object_target(str(tmp_path), "c10/util/Logging.cpp", env) == "c10/CMakeFiles/c10.dir/util/Logging.cpp.o"
    with pytest.raises(BuildFailed, match="no object target"):
        object_target(str(tmp_path), "aten/src/ATen/Nope.cpp", env)


def test_hit_rate_counts_direct_and_preprocessed_hits():
    assert hit_rate({"direct_cache_hit": 8, "preprocessed_cache_hit": 1, "cache_miss": 1}) == (9, 1, 0.9)
    assert hit_rate({}) == (0, 0, 0.0)


def test_build_request_round_trips_through_json():
    req = BuildRequest(
        spec=resolve("gh200"),
        source="/src",
        out_dir="/out",
        cache_root="/cache",
        preflight=True,
        targets=("c10",),
        canaries=("a.cpp",),
        provenance={"source": {"kind": "dir"}},
    )
    back = records.from_dict(BuildRequest, json.loads(json.dumps(records.to_dict(req))), "the build request")
    assert back.spec.hash == req.spec.hash and back.targets == ("c10",) and back.run_id == req.run_id
    assert back.provenance == {"source": {"kind": "dir"}}


def test_clean_of_a_tree_whose_build_is_a_symlink_names_the_link_and_removes_nothing(tmp_path):
    """Issue 41 item 23: `build --clean` ended with `PathError: invoke build: .: OSError`
    (shutil.rmtree refuses a link with an OSError that names nothing)."""
    from helpers import run_invoke

    tree, elsewhere = tmp_path / "tree", tmp_path / "elsewhere"
    tree.mkdir()
    elsewhere.mkdir()
    (tree / "setup.py").write_text("")
    (elsewhere / "keep").write_text("not the tree's")
    (tree / "build").symlink_to(elsewhere)
    res = run_invoke(
        "build", "--engine", "native", "--clean", "--source", str(tree), "--out", str(tmp_path / "out"),
        "--set", f"cache_dir={tmp_path / 'cache'}", "--set", "build_venv=false", "--set", "patches=none",
        timeout=300,
    )  # fmt: skip
    assert res.returncode == 15, res.stdout[-2000:] + res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith(f"error: PathError: --clean: {tree / 'build'} is a symbolic link (to {elsewhere})"), first
    assert f"rm {tree / 'build'}" in res.stderr.splitlines()[1]
    assert (elsewhere / "keep").is_file() and (tree / "build").is_symlink()


def test_clean_removes_a_real_build_directory(tmp_path):
    from torchbuild.builder.step import remove_build_dir

    class Lines:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def line(self, text: str) -> None:
            self.lines.append(text)

    (tmp_path / "build" / "x").mkdir(parents=True)
    said = Lines()
    remove_build_dir(str(tmp_path), said)  # type: ignore[arg-type]
    assert not (tmp_path / "build").exists() and said.lines == [f"removing {tmp_path / 'build'} (--clean)"]
    remove_build_dir(str(tmp_path), said)  # type: ignore[arg-type]  # nothing there: nothing to do
