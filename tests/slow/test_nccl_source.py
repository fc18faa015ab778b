"""NCCL from source with `invoke comms`, then the real PyTorch 2.6 source configured against it.

NCCL's source does not reach this project's CI: Debian's mirror answers 404 for every file of
the nvidia-nccl source package (its index lists 2.22.3-1-1), and github.com is closed. Point
TORCHBUILD_TEST_NCCL_SOURCE at a release tarball of NVIDIA/nccl (e.g. nccl-2.22.3-1.tar.gz, the
tag v2.22.3-1) to run it; without it the test is skipped and says why."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, OFI_PLUGIN, image_ok, preflight_ok, run_invoke, set_args

NCCL_SOURCE = os.environ.get("TORCHBUILD_TEST_NCCL_SOURCE", "")
PROFILE = str(FIXTURES / "profiles" / "derecho-on-debian.yaml")

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not NCCL_SOURCE,
        reason="NCCL's source is unreachable here (Debian's nvidia-nccl source files answer 404, github.com is "
        "closed): set TORCHBUILD_TEST_NCCL_SOURCE to an NVIDIA/nccl release tarball",
    ),
]


def test_nccl_built_for_the_a100_and_pytorch_configures_against_it(
    engine, local_base, site_certs, debian_dsc, ofi_sources, tmp_path
):
    tarball, sha = ofi_sources[OFI_PLUGIN]
    cache = tmp_path / "cache"
    sets = [
        f"base_image={local_base}", *site_certs, f"cache_dir={cache}", f"nccl_source={NCCL_SOURCE}",
        f"aws_ofi_nccl_source={tarball}", f"aws_ofi_nccl_sha256={sha}",
    ]  # fmt: skip
    image_ok(PROFILE, set_args(sets))
    t0 = time.monotonic()
    res = run_invoke("comms", "--in-container", "--profile", PROFILE, "--out", str(tmp_path / "out"), *set_args(sets))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    (prefix,) = (cache / "comms").glob("nccl-2.22.3-1-ofi-1.17.1-*")
    m = json.loads((prefix / "torchbuild-comms.json").read_text())
    nccl = m["nccl"]
    assert nccl["version_code"] == 22203 and nccl["gencode"] == "-gencode=arch=compute_80,code=sm_80"
    assert nccl["library"] == "lib/libnccl.so.2.22.3" and (prefix / "include" / "nccl.h").is_file()
    print(
        f"comms: {time.monotonic() - t0:.0f} s; NCCL {nccl['seconds']:.0f} s, {nccl['size_bytes'] / 2**20:.1f} MiB; "
        f"plugin {m['plugin']['seconds']:.0f} s, {m['plugin']['size_bytes'] / 2**20:.1f} MiB"
    )

    stdout, data = preflight_ok(PROFILE, debian_dsc, tmp_path / "out", set_args(sets))
    inside = f"/cache/comms/{prefix.name}"
    assert "comms:" in stdout and "is up to date" in stdout  # the build ran comms first: built already
    assert f"NCCL_ROOT={inside}" in stdout and "USE_SYSTEM_NCCL=1" in stdout
    assert f"Found NCCL (include: {inside}/include" in stdout, stdout[-6000:]
    assert data["comms"]["nccl"]["version_code"] == 22203
    assert data["comms"]["plugin"]["version"] == OFI_PLUGIN
    assert Path(data["comms"]["prefix"]) == prefix
