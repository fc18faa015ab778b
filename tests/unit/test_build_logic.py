from __future__ import annotations

import json
import os
import shutil

import pytest

from torchbuild.core import records
from torchbuild.core.errors import BuildFailed
from torchbuild.inputs.config import resolve
from torchbuild.steps.build import BuildRequest, object_target
from torchbuild.steps.compile_job import hit_rate

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
