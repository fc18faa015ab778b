"""`invoke verify` on the fixture wheel in the toolchain image, and on deliberately broken copies."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import TEST_TORCH, TORCH_PROFILE, manifest_of, run_invoke, set_args
from test_build import build_args, workspace  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.docker


def test_verify_passes_the_wheel_and_fails_retagged_copies(engine, cpu_image, site_overrides, workspace):  # noqa: F811
    tree, out, cache = workspace
    res = run_invoke(*build_args(tree, out, cache, site_overrides))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    wheel = out / manifest_of(res.stdout)["wheel"]["name"]
    sets = set_args([TEST_TORCH, *site_overrides, "local_version=tbtest"])
    verify = ["verify", "--in-container", "--profile", "cpu", "--arch", "x86_64", *sets]

    res = run_invoke(*verify, "--wheel", str(wheel))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    data = json.loads((out / f"{wheel.name}.verify.json").read_text())
    got = {c["name"]: c["status"] for c in data["checks"]}
    assert data["ok"] and data["python"].startswith("3.13")
    assert got["install into a fresh venv"] == got["import minitorch"] == got["minitorch.__version__"] == "pass"
    assert "0 failed" in res.stdout

    wrong_version = out / wheel.name.replace("+tbtest", "+other")
    wrong_platform = out / wheel.name.replace("linux_x86_64", "linux_aarch64")
    for copy, failed in ((wrong_version, "version"), (wrong_platform, "platform tag")):
        shutil.copy(wheel, copy)
        res = run_invoke(*verify, "--wheel", str(copy))
        assert res.returncode == 14 and "VerifyFailed" in res.stderr, res.stdout[-2000:] + res.stderr
        checks = {c["name"]: c["status"] for c in json.loads((out / f"{copy.name}.verify.json").read_text())["checks"]}
        assert checks[failed] == "fail", checks
    assert not list(out.glob(".verify-*.json")), "request files were left behind"


def test_verify_installed_debian_torch_with_gloo_and_mpi(engine, torch_image, tmp_path):
    """Debian trixie's python3-torch 2.6 (built with MPI) in an image built by the tool (the
    session's debian-torch-installed image)."""
    _, image_sets = torch_image
    profile = TORCH_PROFILE
    sets = set_args(image_sets)
    report = tmp_path / "torch.verify.json"
    res = run_invoke(
        "verify", "--installed", "torch", "--in-container", "--profile", profile, "--report", str(report), *sets,
        timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    for name in (
        "import torch",
        "torch.__version__",
        "mpi backend",
        "gloo all_reduce + broadcast (2 processes)",
        "mpi all_reduce + broadcast (mpirun -n 2)",
        "LibTorch C++ (find_package(Torch))",
        "tensor op",
        "autograd",
    ):
        assert checks[name]["status"] == "pass", checks[name]
    # both ranks saw 1 + 2 = 3 and rank 0's 42
    assert checks["mpi all_reduce + broadcast (mpirun -n 2)"]["detail"].count("[3.0, 42.0]") == 2
    assert checks["CUDA devices"]["status"] == "skip"
