from __future__ import annotations

import pytest

from torchbuild.core.arch import Arch
from torchbuild.core.errors import ProfileError


@pytest.mark.parametrize(
    ("name", "arch", "platform", "debian"),
    [
        ("x86_64", Arch.X86_64, "linux/amd64", "amd64"),
        ("amd64", Arch.X86_64, "linux/amd64", "amd64"),
        ("aarch64", Arch.AARCH64, "linux/arm64", "arm64"),
        ("linux/arm64", Arch.AARCH64, "linux/arm64", "arm64"),
    ],
)
def test_arch_names(name, arch, platform, debian):
    a = Arch.parse(name)
    assert a is arch and a.docker_platform == platform and a.debian_arch == debian


def test_unknown_arch_is_a_profile_error():
    with pytest.raises(ProfileError, match="ppc64le"):
        Arch.parse("ppc64le")
