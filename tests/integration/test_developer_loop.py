"""The PyTorch developer's loop with real parts: a torchvision source of another line refused by
`invoke companions` before compiling; `invoke develop` on the minitorch fixture in
the cpu image and natively (touch one .cpp: one compile); and `invoke bench` in the image with a
torchbench stand-in whose install asks pip for the newest torch. torchvision and torchaudio built
from Debian trixie's real sources against Debian's torch 2.6 and installed beside it are in
tests/slow/test_companions.py (torchaudio alone was here, 204 s of the stop's CI; the slow test
builds it with the same checks). The helpers below are shared with that test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import FIXTURES, TEST_TORCH, TORCH_PROFILE, fixture_tree, run_in, run_invoke, set_args

from torchbuild.core.safeio import sha256_file
from torchbuild.runtime import manifest

pytestmark = pytest.mark.docker

DEBIAN_POOL = "http://deb.debian.org/debian/pool/main/p"
# trixie's pytorch-vision 0.21.0-3 and pytorch-audio 2.6.0-1: the orig tarballs are upstream's
# release archives (the .dsc and debian.tar.xz answer 404 from this mirror); sha256s from
# dists/trixie/main/source/Sources.xz
SOURCES = {
    "torchvision": (
        f"{DEBIAN_POOL}/pytorch-vision/pytorch-vision_0.21.0.orig.tar.gz",
        "0a4a967bbb7f9810f792cd0289a07fb98c8fb5d1303fae8b63e3a6b05d720058",
        "0.21.0",
    ),
    "torchaudio": (
        f"{DEBIAN_POOL}/pytorch-audio/pytorch-audio_2.6.0.orig.tar.gz",
        "3335d8fcf58c26acf3c628d751103b59226e01c91847ce56efb2a4e7ae8351ef",
        "2.6.0",
    ),
}


def companion_sets(sets: list[str], names: list[str], cache: Path) -> list[str]:
    repos = ", ".join(f'"{n}": "{SOURCES[n][0]}"' for n in names)
    shas = ", ".join(f'"{n}": "{SOURCES[n][1]}"' for n in names)
    return [
        *sets,
        f"cache_dir={cache}",
        f"companions=[{', '.join(names)}]",
        f"companion_repos={{{repos}}}",
        f"companion_sha256={{{shas}}}",
    ]


def build_companions(torch_image, debian_torch_wheel, names: list[str], tmp_path: Path):
    """`invoke companions --in-container` against Debian's torch wheel: (out dir, stdout)."""
    _, sets = torch_image
    out = tmp_path / "out"
    out.mkdir()
    wheel = Path(shutil.copy(debian_torch_wheel, out))
    res = run_invoke(
        "companions", "--in-container", "--profile", TORCH_PROFILE, "--wheel", str(wheel),
        *set_args(companion_sets(sets, names, tmp_path / "cache")), timeout=3600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    return out, res.stdout


def check_companion(out: Path, name: str, torch_wheel: Path) -> Path:
    """The wheel is named with torch's local version, and its manifest records the torch wheel
    it was built against and the operator that ran."""
    version = SOURCES[name][2]
    (wheel,) = out.glob(f"{name}-{version}+debian-cp313-cp313-linux_x86_64.whl")
    m = manifest.read(Path(f"{wheel}{manifest.SUFFIX}"))
    assert m.companion is not None and m.companion.name == name and m.companion.version == f"{version}+debian"
    assert m.companion.torch_wheel.sha256 == sha256_file(torch_wheel)
    assert m.companion.torch_version == "2.6.0+debian" and m.environment["PYTORCH_VERSION"] == "2.6.0+debian"
    assert m.source is not None and m.source.kind == "tarball" and m.source.sha256 == SOURCES[name][1]
    assert m.engine == "docker" and m.wheel is not None and m.wheel.sha256 == sha256_file(wheel)
    assert m.image is not None and m.image.tag == "torchbuild/toolchain:debian-torch-installed-2.6.0-x86_64"
    assert not list(out.glob(".partial-*")), "a partial directory was left behind"
    return wheel


def install_beside_debian_torch(engine, torch_image, out: Path, name: str, check: str) -> str:
    """pip installs the wheel in a fresh venv that sees Debian's torch, with PyPI reachable for
    its other dependencies; the log must show torch already satisfied, never collected."""
    spec, _ = torch_image
    version = SOURCES[name][2]
    script = f"""
        set -e
        python3 -m venv --system-site-packages /tmp/v
        /tmp/v/bin/pip install --find-links /out "{name}=={version}+debian" 2>&1 | tee /tmp/pip.log
        cd /tmp && /tmp/v/bin/python -c '{check}'
    """
    return run_in(engine, spec.image_tag, script, {str(out): "/out"})


def assert_torch_kept(log: str) -> None:
    assert "Requirement already satisfied: torch==2.6.0+debian" in log, log[-3000:]
    assert "Collecting torch" not in log and "Downloading torch" not in log, log[-3000:]
    installed = [ln for ln in log.splitlines() if ln.startswith("Successfully installed")]
    assert not any("torch-" in ln.replace("torchvision-", "").replace("torchaudio-", "") for ln in installed), installed


NMS = (
    "import torch, torchvision; from torchvision.ops import nms; "
    "b = torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]]); "
    "print(torchvision.__version__, torch.__file__, nms(b, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist())"
)


FORCED_ALIGN = (
    "import torch, torchaudio; "
    "lp = torch.log_softmax(torch.tensor([[[0.1, 2.0, 0.1], [0.1, 0.1, 2.0], [2.0, 0.1, 0.1]]]), -1); "
    "a, _ = torchaudio.functional.forced_align(lp, torch.tensor([[1, 2]], dtype=torch.int32), blank=0); "
    "print(torchaudio.__version__, torch.__file__, a.tolist())"
)


def test_a_companion_of_another_line_is_refused_before_compiling(torch_image, debian_torch_wheel, tmp_path):
    """torchvision 0.21's source with a torch 2.5 wheel: refused by the table, nothing built."""
    _, sets = torch_image
    out = tmp_path / "out"
    out.mkdir()
    wheel = out / "torch-2.5.1+debian-cp313-cp313-linux_x86_64.whl"
    shutil.copy(debian_torch_wheel, wheel)
    res = run_invoke(
        "companions", "--in-container", "--profile", TORCH_PROFILE, "--wheel", str(wheel),
        *set_args(companion_sets(sets, ["torchvision"], tmp_path / "cache")),
    )  # fmt: skip
    assert res.returncode == 26, res.stdout[-3000:] + res.stderr
    assert "torchvision 0.21.0 does not go with torch 2.5.1" in res.stderr and "TABLE" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == [wheel.name]


# --------------------------------------------------------------------------- develop


def _log_entries(tree: Path) -> list[str]:
    return (tree / "build" / ".ninja_log").read_text().splitlines()


def _compiled(tree: Path, before: list[str]) -> list[str]:
    """Objects ninja logged since `before` (its entries then: CMake's regeneration, on every
    build of a scikit-build-core tree, recompacts the log, keeping them as they were)."""
    seen = set(before)
    lines = [ln for ln in _log_entries(tree) if ln not in seen and not ln.startswith("#")]
    return [ln.split("\t")[3] for ln in lines if ln.split("\t")[3].endswith(".o")]


@pytest.mark.parametrize(
    ("where", "kind"), [("in-container", "setup.py"), ("native", "setup.py"), ("native", "scikit-build-core")]
)
def test_develop_recompiles_only_the_touched_file(where, kind, cpu_image, site_overrides, tmp_path):
    """Both shapes of the fixture; a scikit-build-core tree (PyTorch main) is an editable install
    in redirect mode: its *.py from the tree, its library and extension from site-packages."""
    tree = fixture_tree(tmp_path / "src" / "minitorch", kind)
    venv = tmp_path / "envs" / "dev"
    args = ["develop", "--source", str(tree), "--venv", str(venv)]
    if where == "in-container":
        args += ["--in-container", "--profile", "cpu", "--arch", "x86_64"]
    sets = set_args(
        [TEST_TORCH, *(site_overrides if where == "in-container" else []), f"cache_dir={tmp_path / 'cache'}"]
    )
    first = run_invoke(*args, *sets)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    assert first.stdout.strip().splitlines()[-1] == str(venv)
    assert "minitorch==2.6.0 installed in development mode" in first.stdout
    assert len(_compiled(tree, [])) >= 3
    before = _log_entries(tree)
    (tree / "csrc" / "ops.cpp").touch()
    again = run_invoke(*args, *sets)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    assert _compiled(tree, before) == ["CMakeFiles/minitorch.dir/csrc/ops.cpp.o"]
    assert "1 object(s) compiled" in again.stdout
    if where == "native":  # the venv runs here: the tree is what it imports
        code = "import minitorch; print(minitorch.__file__, minitorch.add(2, 3))"
        got = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
        assert got.stdout.split() == [str(tree / "minitorch" / "__init__.py"), "5.0"]


# --------------------------------------------------------------------------- torchbench


def test_bench_install_keeps_the_built_torch_and_runs(engine, torch_image, tmp_path):
    """The stand-in's install.py runs `pip install --upgrade torch six` against PyPI: without
    the constraint pip would install the newest official torch over Debian's."""
    spec, sets = torch_image
    tree = Path(shutil.copytree(FIXTURES / "torchbench", tmp_path / "benchmark"))
    venv = tmp_path / "envs" / "bench"
    venv.parent.mkdir()
    run_in(
        engine, spec.image_tag, f"python3 -m venv --system-site-packages {venv}", {str(venv.parent): str(venv.parent)}
    )
    res = run_invoke(
        "bench", "--in-container", "--profile", TORCH_PROFILE, "--venv", str(venv),
        "--benchmark", str(tree), "--args", "tiny -d cpu -t eval", *set_args([TEST_TORCH, *sets, f"cache_dir={tmp_path / 'cache'}"]),
        timeout=1800,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert "Requirement already satisfied: torch in /usr/lib/python3/dist-packages" in res.stdout
    assert "Collecting torch" not in res.stdout and "Downloading torch" not in res.stdout
    assert "torchbench installed" in res.stdout and "against torch 2.6.0+debian (kept)" in res.stdout
    assert "model tiny on cpu (eval): torch 2.6.0+debian from /usr/lib/python3/dist-packages/torch" in res.stdout
    # the built torch pinned exactly (=== : no other local version passes), then the site's own lines, if any
    assert (venv / "torchbuild-constraints.txt").read_text().splitlines()[0] == "torch===2.6.0+debian"
