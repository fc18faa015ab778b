"""Reproducible and cheap rebuilds with the real compiler, ccache and engine: the same inputs in
fresh trees at different paths give byte-identical wheels, a checkout at another path hits the
cache, `invoke manifest.diff` names what differs, and --python builds a wheel per Python."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, TEST_TORCH, TREE_KINDS, fixture_tree, run_invoke, set_args

from torchbuild.builder.repro import PLAIN_TREE, PLAIN_TREE_EPOCH
from torchbuild.core.safeio import sha256_file

NATIVE_TOOLS = ("g++", "cmake", "ninja", "ccache")
SID_PYTHONS = str(FIXTURES / "profiles" / "sid-pythons.yaml")  # the sid_pythons_image fixture's profile


def copy_fixture(dest: Path) -> Path:
    """The fixture at dest, copied as `cp -r` copies: the content, the copy's own mtimes (a plain
    tree's SOURCE_DATE_EPOCH does not depend on them)."""
    ignore = shutil.ignore_patterns("build", "*.so", "_version.py")
    shutil.copytree(FIXTURES / "minitorch", dest, ignore=ignore, copy_function=shutil.copy)
    return dest


def build(tree: Path, out: Path, cache: Path, *extra: str, sets: tuple[str, ...] = ()) -> dict:
    """invoke build of tree; the wheel's manifest."""
    res = run_invoke(
        "build",
        "--source",
        str(tree),
        "--out",
        str(out),
        *set_args([TEST_TORCH, f"cache_dir={cache}", "patches=none", "local_version=repro", *sets]),
        *extra,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    (path,) = out.glob("*.whl.manifest.json")
    return json.loads(path.read_text())


def wheel_of(out: Path) -> Path:
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.mark.skipif(not all(shutil.which(t) for t in NATIVE_TOOLS), reason="needs g++, cmake, ninja and ccache")
def test_native_rebuilds_are_byte_identical_and_path_independent(tmp_path):
    a = copy_fixture(tmp_path / "a" / "minitorch")
    b = copy_fixture(tmp_path / "b" / "a" / "much" / "longer" / "path" / "minitorch")
    # cold, each with its own cache: the compiler's output itself must not depend on the path
    ma = build(a, tmp_path / "out-a", tmp_path / "cache-a")
    mb = build(b, tmp_path / "out-b", tmp_path / "cache-b")
    wa, wb = wheel_of(tmp_path / "out-a"), wheel_of(tmp_path / "out-b")
    assert sha256_file(wa) == sha256_file(wb)
    assert ma["ccache"]["misses"] >= 10 and mb["ccache"]["misses"] >= 10
    repro = ma["reproducibility"]
    assert repro["source_date_epoch"] == PLAIN_TREE_EPOCH == mb["reproducibility"]["source_date_epoch"]
    assert repro["origin"] == PLAIN_TREE and repro["ccache_basedir"] == str(a)
    assert ma["environment"]["SOURCE_DATE_EPOCH"] == str(repro["source_date_epoch"])
    same = run_invoke("manifest.diff", str(wa), str(wb))
    assert same.returncode == 0 and same.stdout.startswith("identical: "), same.stdout + same.stderr

    # a third checkout at another path with a's cache: every compile hits
    c = copy_fixture(tmp_path / "c" / "minitorch")
    mc = build(c, tmp_path / "out-c", tmp_path / "cache-a")
    assert mc["ccache"]["misses"] == 0 and mc["ccache"]["hits"] >= 10, mc["ccache"]
    assert sha256_file(wheel_of(tmp_path / "out-c")) == sha256_file(wa)

    # one changed source: manifest.diff names the library that changed, and exits 99
    with (c / "csrc" / "ops.cpp").open("a") as f:
        f.write('extern "C" int minitorch_changed() { return 1; }\n')
    shutil.rmtree(tmp_path / "out-c")
    changed = build(c, tmp_path / "out-c", tmp_path / "cache-a")
    # a plain tree's clock is a constant: the build's own writes and this edit do not move it
    assert changed["reproducibility"]["origin"] == PLAIN_TREE
    assert changed["reproducibility"]["source_date_epoch"] == mc["reproducibility"]["source_date_epoch"]
    differ = run_invoke("manifest.diff", str(wa), str(wheel_of(tmp_path / "out-c")))
    assert differ.returncode == 99, differ.stdout + differ.stderr
    rows = {tuple(ln.split()[:2]) for ln in differ.stdout.splitlines()[1:] if ln.split() and "/" in ln.split()[0]}
    # exactly the library and RECORD (its hash), and only their content
    assert rows == {("minitorch/libminitorch.so", "content"), ("minitorch-2.6.0+repro.dist-info/RECORD", "content")}, (
        differ.stdout
    )
    # between the manifests too: the wheel's sha256 differs, then its members
    manifests = [next(d.glob("*.manifest.json")) for d in (tmp_path / "out-a", tmp_path / "out-c")]
    differ = run_invoke("manifest.diff", *map(str, manifests))
    assert differ.returncode == 99 and "wheel.sha256" in differ.stdout and "libminitorch.so" in differ.stdout


@pytest.mark.docker
def test_in_container_rebuilds_at_other_paths_are_byte_identical(cpu_image, site_overrides, tmp_path):
    spec, _ = cpu_image
    sets = tuple(site_overrides)
    args = ("--in-container", "--profile", "cpu", "--arch", "x86_64")
    a = copy_fixture(tmp_path / "one" / "minitorch")
    b = copy_fixture(tmp_path / "two" / "deeper" / "minitorch")
    ma = build(a, tmp_path / "out-a", tmp_path / "cache-a", *args, sets=sets)
    mb = build(b, tmp_path / "out-b", tmp_path / "cache-b", *args, sets=sets)
    assert ma["image"]["id"] == mb["image"]["id"]
    assert ma["ccache"]["misses"] >= 10 and mb["ccache"]["misses"] >= 10  # two cold caches
    assert sha256_file(wheel_of(tmp_path / "out-a")) == sha256_file(wheel_of(tmp_path / "out-b"))
    assert ma["wheel"]["name"].startswith(f"minitorch-2.6.0+repro-cp{spec.python_version.replace('.', '')}-")


@pytest.mark.docker
@pytest.mark.parametrize("kind", TREE_KINDS)
def test_one_tree_two_pythons_two_wheels_only_the_extension_recompiles(engine, sid_pythons_image, tmp_path, kind):
    """--python on both shapes of the fixture: a scikit-build-core tree (PyTorch main) is
    configured for each interpreter as setup.py's is, through its backend."""
    spec, image_sets = sid_pythons_image
    tree = fixture_tree(tmp_path / "minitorch", kind)
    out, cache = tmp_path / "out", tmp_path / "cache"
    sets = [TEST_TORCH, *image_sets, f"cache_dir={cache}", "patches=none", "local_version=py"]
    res = run_invoke(
        "build", "--in-container", "--profile", SID_PYTHONS, "--arch", "x86_64", "--python", "3.13,3.14",
        "--source", str(tree), "--out", str(out), *set_args(sets),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    wheels = sorted(w.name for w in out.glob("*.whl"))
    assert wheels == [f"minitorch-2.6.0+py-{t}-{t}-linux_x86_64.whl" for t in ("cp313", "cp314")]
    first, second = (json.loads((out / f"{w}.manifest.json").read_text()) for w in wheels)
    assert first["reproducibility"]["python"] == "3.13" and second["reproducibility"]["python"] == "3.14"
    assert first["reproducibility"]["source_date_epoch"] == second["reproducibility"]["source_date_epoch"]
    # cold for 3.13; for 3.14 the one translation unit that includes Python.h is the only miss
    assert first["ccache"]["misses"] >= 10
    assert second["ccache"]["misses"] == 1 and second["ccache"]["hits"] >= 10, second["ccache"]
    assert "reconfiguring /src/build: torchbuild:python changed" in res.stdout
    # each was verified in a venv of its own interpreter
    for w, python in zip(wheels, ("3.13", "3.14")):
        verified = json.loads((out / f"{w}.verify.json").read_text())
        assert verified["ok"] and verified["python"] == python
    # and each wheel's extension was compiled against its own Python's headers
    script = (
        "for v in 3.13 3.14; do p=/opt/venv/bin/python; [ $v = 3.14 ] && p=/opt/venv-3.14/bin/python; "
        "$p -m venv --without-pip /tmp/v$v && $p -m pip --python /tmp/v$v/bin/python install -q --no-index "
        '/out/minitorch-*-cp${v/./}-*.whl && /tmp/v$v/bin/python -c "import minitorch; print(minitorch.python_headers())"; '
        "done"
    )
    raw = engine.client.containers.run(
        spec.image_tag, ["bash", "-c", script], volumes={str(out): {"bind": "/out", "mode": "ro"}}, remove=True
    )
    headers = raw.decode().split()
    assert [h.rsplit(".", 1)[0] for h in headers] == ["3.13", "3.14"], headers
