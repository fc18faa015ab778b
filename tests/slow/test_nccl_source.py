"""NCCL from source with `invoke comms`, then the real PyTorch 2.6 source configured against it.

NCCL's source is NVIDIA/nccl's release tarball nccl-2.22.3-1.tar.gz (the tag v2.22.3-1, Debian
trixie's nvidia-nccl release) from the project's shared sources (../shared/sources, or
TORCHBUILD_TEST_SOURCES), copied into the test cache with its sha256 from SHA256SUMS checked
(the nccl_sources fixture). The test runs on a clean checkout; without the tarball it fails and
names what is missing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, OFI_PLUGIN, TEST_TORCH, image_ok, preflight_ok, run_invoke, set_args

NCCL = "2.22.3-1"
PROFILE = str(FIXTURES / "profiles" / "derecho-on-debian.yaml")

pytestmark = [pytest.mark.docker]


def test_nccl_built_for_the_a100_and_pytorch_configures_against_it(
    engine, local_base, site_certs, debian_dsc, ofi_sources, nccl_sources, tmp_path
):
    tarball, sha = ofi_sources[OFI_PLUGIN]
    nccl_tarball, nccl_sha = nccl_sources[NCCL]
    cache = tmp_path / "cache"
    sets = [TEST_TORCH,
        f"base_image={local_base}", *site_certs, f"cache_dir={cache}", f"nccl_source={nccl_tarball}", f"nccl_sha256={nccl_sha}",
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
