"""The GH200 canary: int4mm_kernel.cpp of real PyTorch 2.6 compiled with the gh200 flags in an
arm64 image under qemu-user emulation. Takes tens of minutes on 2 cores: `nox -s slow`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, SUITE, image_ok, preflight_ok, set_args

from torchbuild.core.arch import Arch
from torchbuild.image.baseimage import make_base_image
from torchbuild.runtime.engine import Engine

pytestmark = [pytest.mark.docker, pytest.mark.emulation, pytest.mark.slow]


def test_int4mm_canary_compiles_for_aarch64_with_gh200_flags(tmp_path_factory):
    engine = Engine.connect()
    cache = tmp_path_factory.mktemp("cache")
    x86, _ = make_base_image(engine, suite=SUITE, arch=Arch.X86_64, work_dir=cache / "rootfs", ignore_valid_until=True)
    arm, _ = make_base_image(engine, suite=SUITE, arch=Arch.AARCH64, work_dir=cache / "rootfs", ignore_valid_until=True)
    sys.path.insert(0, str(FIXTURES))
    from debian_source import fetch_debian_pytorch

    dsc = fetch_debian_pytorch(engine, x86, cache / "debian-src")
    profile = str(FIXTURES / "profiles" / "debian-pytorch-2.6-aarch64.yaml")
    certs = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    sets = set_args(
        [
            f"base_image={arm}",
            f"cache_dir={cache}",
            *(["ca_certificates=" + ",".join(map(str, certs))] if certs else []),
        ]
    )
    image_ok(profile, sets, timeout=7200)
    stdout, data = preflight_ok(profile, dsc, cache / "out", sets, timeout=7200)
    assert "-flax-vector-conversions" in stdout
    (canary,) = data["preflight"]["canaries"]
    assert canary["file"] == "aten/src/ATen/native/cpu/int4mm_kernel.cpp" and canary["seconds"] > 0
    assert data["resolved_profile"]["arch"] == "aarch64"
    print(
        f"\naarch64 canary int4mm_kernel.cpp: {canary['seconds']:.0f} s, peak {canary['peak_rss_bytes'] / 2**20:.0f} MiB; "
        f"configure {data['preflight']['configure_s']} s; whole preflight {data['duration_s']} s"
    )
