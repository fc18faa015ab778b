"""ATen's code generation reused with the real torchgen of PyTorch 2.6 (Debian's 2.6.0+dfsg
source; builder/codegen.py): the six runs Codegen.cmake makes (a --dry-run and a real run of
headers, sources and declarations_yaml) in one tree, then again in a fresh tree, where none
runs and the declared outputs are byte-identical, and so are the AOTInductor C shims
(c_shim_cpu.cpp, c_shim_cuda.cpp) that the sources run writes into the source tree unlisted,
removed before each round as a fresh checkout lacks them; a changed template or native_functions.yaml
runs the generator again (every run: they are all keyed by both), and the changed template shows
in what it wrote.

Slow: 7.4 minutes measured on 2 cores shared with a unit test run (load 5-7): the generator runs
three times from nothing (1-2 minutes each), the reused runs take about 10 s in all (most of it
creating the ~7,000 files), and the source tarball's torchgen/ and ATen are unpacked first.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchbuild.builder import codegen

KINDS = ("headers", "sources", "declarations_yaml")
SHIMS = ("c_shim_cpu.cpp", "c_shim_cuda.cpp")  # what the sources run writes into the aoti dir


def gen_args(src: Path, kind: str, dry: bool) -> list[str]:
    install = src / "build" / "aten" / "src" / "ATen"
    args = ["-m", "torchgen.gen", "--source-path", str(src / "aten/src/ATen"), "--install_dir", str(install)]
    args += ["--per-operator-headers", "--generate", kind]
    args += ["--output-dependencies", str(install / f"generated_{kind}.cmake")]
    return args + (["--dry-run"] if dry else [])


def generate(src: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, str]]:
    """The six runs in a fresh tree, without the C shims as a fresh checkout is: (what they
    printed, {declared output or C shim: sha256})."""
    shutil.rmtree(src / "build", ignore_errors=True)
    (src / "build/aten/src/ATen").mkdir(parents=True)
    aoti = src / codegen.AOTI_DIR
    for name in SHIMS:
        (aoti / name).unlink(missing_ok=True)
    capsys.readouterr()
    declared: set[Path] = set()
    for dry in (True, False):
        for kind in KINDS:
            assert codegen.run(cache, sys.executable, gen_args(src, kind, dry), src) == 0
            declared.update(codegen.outputs_of(gen_args(src, kind, dry), src) or [])
    declared.update(aoti / name for name in SHIMS)  # missing: read_bytes fails, naming it
    digests = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(declared)}
    return capsys.readouterr().out, digests


@pytest.fixture(scope="module")
def source(debian_dsc: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchgen/, aten/src/ATen and the checked-in C shim headers of the upstream tarball (the
    Debian patches leave them be)."""
    pytest.importorskip("yaml")
    dest = tmp_path_factory.mktemp("pytorch")
    orig = next(debian_dsc.parent.glob("pytorch_2.6.0+dfsg.orig.tar.*"))
    wanted = ["--wildcards", "*/torchgen/*", "*/aten/src/ATen/*", f"*/{codegen.AOTI_DIR}/*"]
    subprocess.run(["tar", "-xf", str(orig), "-C", str(dest), "--strip-components=1", *wanted], check=True)
    return dest


def test_real_torchgen_runs_once_per_inputs(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "codegen"
    out, first = generate(source, cache, capsys)
    assert out.count("code generation saved") == 6 and "reused" not in out, out
    assert len(first) > 1000  # the per-operator headers among them

    out, again = generate(source, cache, capsys)
    assert out.count("code generation reused") == 6 and "saved" not in out, out
    assert again == first  # the C shims among them, restored into the source tree
    for name in SHIMS:
        assert str(source / codegen.AOTI_DIR / name) in again

    template = source / "aten/src/ATen/templates/Functions.h"
    template.write_text(template.read_text() + "\n// changed by torchbuild's test\n")
    out, changed = generate(source, cache, capsys)
    assert out.count("code generation saved") == 6 and "reused" not in out, out
    functions_h = str(source / "build/aten/src/ATen/Functions.h")
    assert changed[functions_h] != first[functions_h]
    assert "changed by torchbuild's test" in Path(functions_h).read_text()

    yaml_file = source / "aten/src/ATen/native/native_functions.yaml"
    yaml_file.write_text(yaml_file.read_text() + "\n# changed by torchbuild's test\n")
    out, _ = generate(source, cache, capsys)
    assert out.count("code generation saved") == 6, out
