"""Image references, split by docker-py's own rules (the split its pull makes, the registry the
CLI picks): what `invoke image` pulls for a base image, which registry --push talks to, and
whether that registry is plain HTTP."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from torchbuild.image.host import registry_is_insecure
from torchbuild.runtime.engine import Engine, registry_of, split_reference

DIGEST = "sha256:" + "ab" * 32

SPLITS = {
    "name and tag": ("ubuntu:24.04", ("ubuntu", "24.04")),
    "no tag is latest": ("ubuntu", ("ubuntu", "latest")),
    "user/repo": ("nvidia/cuda:12.6.3-devel-ubuntu24.04", ("nvidia/cuda", "12.6.3-devel-ubuntu24.04")),
    "registry with port, no tag": ("localhost:5000/tb/toolchain", ("localhost:5000/tb/toolchain", "latest")),
    "registry with port and tag": (
        "reg.example.org:5000/tb/toolchain:cpu",
        ("reg.example.org:5000/tb/toolchain", "cpu"),
    ),
    "digest": (f"debian@{DIGEST}", ("debian", DIGEST)),
    "registry, port and digest": (f"localhost:5000/x@{DIGEST}", ("localhost:5000/x", DIGEST)),
    "tag and digest: the digest is pulled": (f"ubuntu:24.04@{DIGEST}", ("ubuntu:24.04", DIGEST)),
    "uppercase stays as written": ("Ubuntu:24.04", ("Ubuntu", "24.04")),
}


@pytest.mark.parametrize(("ref", "split"), SPLITS.values(), ids=SPLITS.keys())
def test_a_reference_splits_into_what_is_pulled(ref, split):
    assert split_reference(ref) == split


REGISTRIES = {
    "docker hub library": ("ubuntu", ""),
    "docker hub user": ("torchbuild/toolchain", ""),
    "docker.io named": ("docker.io/library/ubuntu", ""),
    "a dotted host": ("registry.example.org/group/toolchain", "registry.example.org"),
    "a host with a port": ("reg:5000/toolchain", "reg:5000"),
    "localhost": ("localhost/toolchain", "localhost"),
    "an IP and port": ("127.0.0.1:5000/toolchain", "127.0.0.1:5000"),
    "uppercase host": ("Registry.Example.org/toolchain", "Registry.Example.org"),
    "a scheme is no registry": ("https://reg.example.org/toolchain", ""),
}


@pytest.mark.parametrize(("name", "registry"), REGISTRIES.values(), ids=REGISTRIES.keys())
def test_the_registry_of_an_image_name(name, registry):
    assert registry_of(name) == registry


def _engine(info: dict[str, Any]) -> Engine:
    return Engine(client=SimpleNamespace(info=lambda: info))


HUB_ONLY = {
    "RegistryConfig": {"IndexConfigs": {"docker.io": {"Secure": True}}, "InsecureRegistryCIDRs": ["127.0.0.0/8"]}
}


@pytest.mark.parametrize(
    ("name", "insecure"),
    [
        ("torchbuild/toolchain", False),
        ("localhost:5000/toolchain", True),
        ("127.0.0.1:5000/toolchain", True),
        ("10.0.0.5:5000/toolchain", False),
        ("registry.example.org/toolchain", False),
    ],
)
def test_plain_http_registries_are_those_the_engine_calls_insecure(name, insecure):
    assert registry_is_insecure(_engine(HUB_ONLY), name) is insecure


def test_a_registry_the_engine_lists_is_taken_at_its_word():
    info = {"RegistryConfig": {"IndexConfigs": {"reg.lan:5000": {"Secure": False}}}}
    assert registry_is_insecure(_engine(info), "reg.lan:5000/toolchain") is True
