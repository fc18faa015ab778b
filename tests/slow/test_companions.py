"""torchvision 0.21.0 and torchaudio 2.6.0 together, from Debian trixie's real sources, built by
`invoke companions` against Debian's torch 2.6 in the debian-torch-installed image, each checked
beside that torch (nms; forced_align), then both installed in a fresh venv whose pip log shows
torch neither downloaded nor replaced. The build times are printed for the closing note (the
helpers live in tests/integration/test_developer_loop.py)."""

from __future__ import annotations

import re

import pytest
from integration.test_developer_loop import (
    FORCED_ALIGN,
    NMS,
    assert_torch_kept,
    build_companions,
    check_companion,
    install_beside_debian_torch,
)

from torchbuild.runtime import manifest

pytestmark = pytest.mark.docker


def test_torchvision_and_torchaudio_against_debian_torch(engine, torch_image, debian_torch_wheel, tmp_path):
    out, stdout = build_companions(torch_image, debian_torch_wheel, ["torchvision", "torchaudio"], tmp_path)
    assert "torchvision.ops.nms -> [0, 2]" in stdout and "torch.ops.torchaudio.forced_align -> [[1, 2, 0]]" in stdout
    for name in ("torchvision", "torchaudio"):
        wheel = check_companion(out, name, debian_torch_wheel)
        m = manifest.read(wheel.parent / f"{wheel.name}{manifest.SUFFIX}")
        print(
            f"{name}: built in {m.duration_s} s, {wheel.stat().st_size / 2**20:.1f} MiB, ccache {m.ccache.hits}/{m.ccache.hits + m.ccache.misses}"
        )
    log = install_beside_debian_torch(engine, torch_image, out, "torchvision", NMS)
    assert_torch_kept(log)
    assert "0.21.0+debian /usr/lib/python3/dist-packages/torch/__init__.py [0, 2]" in log
    log = install_beside_debian_torch(engine, torch_image, out, "torchaudio", FORCED_ALIGN)
    assert_torch_kept(log)
    assert re.search(r"2\.6\.0\+debian /usr/lib/python3/dist-packages/torch/__init__\.py \[\[1, 2, 0\]\]", log)
