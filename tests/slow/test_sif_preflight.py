"""Debian's PyTorch 2.6 source built (configure + c10) in a SIF, twice: a real compile of about
5 min, moved from the integration suite to keep CI under 45 min. The fixture-wheel SIF tests stay
in tests/integration/test_sif.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import FIXTURES, TEST_TORCH, image_ok, manifest_of, run_invoke, set_args
from integration.test_sif import call, run_containers

from torchbuild.profile.config import resolve
from torchbuild.runtime.apptainer import locate

pytestmark = [pytest.mark.docker, pytest.mark.apptainer, pytest.mark.slow]


def test_sif_runs_real_pytorch_preflight_and_reuses_ccache(
    engine, local_base, sid_base, site_certs, debian_dsc, tmp_path
):
    """Debian's PyTorch 2.6 source: the preflight by `apptainer run ... build --preflight` as a
    user types it, then again by `invoke build --engine apptainer --clean`, hitting the ccache
    the first run filled through the /cache bind."""
    profile = str(FIXTURES / "profiles" / "debian-pytorch-2.6.yaml")
    cache, out = tmp_path / "cache", tmp_path / "out"
    sets = [TEST_TORCH, f"base_image={local_base}", *site_certs, f"cache_dir={cache}", f"sif_builder_base={sid_base}"]
    image_ok(profile, set_args(sets))
    res = run_invoke("sif", "--profile", profile, "--out", str(tmp_path), *set_args(sets))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    sif = tmp_path / "torch-build-debian-pytorch-2.6-x86_64.sif"
    res = run_invoke(
        "source",
        "--profile",
        profile,
        "--source",
        str(debian_dsc),
        "--dest",
        str(tmp_path / "src"),
        "--no-patch",
        *set_args(sets),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    tree = Path(res.stdout.strip().splitlines()[-1].split(" (")[0])
    assert (tree / "setup.py").is_file()
    out.mkdir()
    cache.mkdir(exist_ok=True)

    apptainer = locate(resolve(profile, sets), "docker")
    rc, text = call(
        apptainer,
        ["run", "--userns", "--bind", f"{tree}:/src,{cache}:/cache,{out}:/out", str(sif), "build", "--preflight"],
        [tree, cache, out, tmp_path],
    )
    assert rc == 0, text[-5000:]
    # the SIF prints the manifest's path as it sees it: /out/<name>
    printed = next(ln for ln in text.splitlines() if ln.startswith("manifest: /out/"))
    m1 = json.loads((out / Path(printed.split(": ", 1)[1]).name).read_text())
    assert m1["engine"] == "apptainer" and m1["image"]["sif"] == str(sif)
    assert m1["preflight"]["targets"] == ["c10"] and list((tree / "build" / "lib").glob("libc10.so*"))
    assert m1["patches"]["applied_now"] == ["01-cuda-aware-mpi-fallback.patch"]  # patched inside the SIF
    assert not run_containers(engine)

    res = run_invoke(
        "build",
        "--in-container",
        "--engine",
        "apptainer",
        "--sif",
        str(sif),
        "--apptainer",
        "docker",
        "--preflight",
        "--clean",
        "--profile",
        profile,
        "--source",
        str(tree),
        "--out",
        str(out),
        *set_args(sets),
        timeout=3600,
    )
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    m2 = manifest_of(res.stdout)
    assert m2["engine"] == "apptainer" and m2["run_id"] != m1["run_id"]
    assert m2["ccache"]["hit_rate"] >= 0.90, m2["ccache"]
    assert not run_containers(engine)
