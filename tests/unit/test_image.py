from __future__ import annotations

import pytest

from torchbuild.arch import Arch
from torchbuild.config import resolve
from torchbuild.errors import ImageBuildFailed
from torchbuild.image import apt_packages, build_args, inputs_hash, labels, make_context, manifest_commands, tree_digest


def test_apt_packages_follow_the_profile():
    assert apt_packages(resolve("cpu")) == ["gcc", "g++", "libopenblas-dev"]
    archer2 = apt_packages(resolve("archer2"))
    assert "libmkl-dev" in archer2 and "libmpich-dev" in archer2
    clang = apt_packages(resolve("cpu", ["compiler=clang", "compiler_version=18", "apt_packages=libnuma-dev,gcc"]))
    assert clang[:2] == ["clang-18", "libomp-18-dev"] and clang[-2:] == ["libnuma-dev", "gcc"]
    assert len(clang) == len(set(clang))
    debian_cuda = apt_packages(resolve("cuda", ["cuda_packages=nvidia-cuda-toolkit,libnccl-dev"]))
    assert debian_cuda[-2:] == ["nvidia-cuda-toolkit", "libnccl-dev"]


def test_build_args():
    args = build_args(resolve("cpu", ["python_version=3.13", "python_system_site_packages=true"]), ["-o", "X=1"])
    assert args["PYTHON_VERSION"] == "3.13"
    assert args["VENV_FLAGS"] == "--system-site-packages"
    assert args["APT_OPTIONS"] == "-o X=1"
    assert "numpy" in args["PYTHON_PACKAGES"].split()


def test_context_holds_dockerfile_source_and_certs(tmp_path):
    cert = tmp_path / "site.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    make_context(resolve("cpu", [f"ca_certificates={cert}"]), ctx)
    assert (ctx / "Dockerfile").read_text().startswith("#")
    assert (ctx / "certs" / "00-site.crt").read_text() == cert.read_text()
    assert (ctx / "torchbuild-src" / "pyproject.toml").is_file()
    assert (ctx / "torchbuild-src" / "configs" / "defaults.yaml").is_file()
    assert not list(ctx.rglob("__pycache__"))


def test_missing_ca_certificate_is_named(tmp_path):
    with pytest.raises(ImageBuildFailed, match=r"nope\.crt is not a file"):
        make_context(resolve("cpu", [f"ca_certificates={tmp_path}/nope.crt"]), tmp_path)


def test_tree_digest_is_content_based(tmp_path):
    (tmp_path / "a").write_text("1")
    first = tree_digest(tmp_path)
    (tmp_path / "a").write_text("1")  # rewritten, same content: same digest
    assert tree_digest(tmp_path) == first
    (tmp_path / "a").write_text("2")
    assert tree_digest(tmp_path) != first


def test_inputs_hash_ignores_build_switches_but_not_image_inputs(tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    base = resolve("cpu")
    make_context(base, ctx)
    h = inputs_hash(base.arch, ctx, build_args(base), "sha256:base")
    switched = resolve("cpu", ["switches.USE_MAGMA=0"])
    assert inputs_hash(switched.arch, ctx, build_args(switched), "sha256:base") == h
    more = resolve("cpu", ["apt_packages=libnuma-dev"])
    assert inputs_hash(more.arch, ctx, build_args(more), "sha256:base") != h
    assert inputs_hash(base.arch, ctx, build_args(base), "sha256:newbase") != h
    other_arch = resolve("cpu", arch="aarch64")
    assert inputs_hash(other_arch.arch, ctx, build_args(other_arch), "sha256:base") != h


def test_labels_record_profile_hash_and_versions():
    spec = resolve("cpu", arch="x86_64")
    lab = labels(spec, "abc", "sha256:base")
    assert lab["org.torchbuild.profile-hash"] == spec.hash
    assert lab["org.torchbuild.base-image"] == "ubuntu:24.04"
    assert lab["org.torchbuild.arch"] == Arch.X86_64.value


def test_push_publishes_a_manifest_list_over_both_arches():
    specs = [resolve("gh200", ["image_name=registry.example.org/hpc/toolchain"], arch=a) for a in ("x86_64", "aarch64")]
    cmds = manifest_commands(specs)
    target = "registry.example.org/hpc/toolchain:gh200-2.6.0"
    assert cmds[0] == [
        "docker",
        "manifest",
        "create",
        "--amend",
        target,
        "registry.example.org/hpc/toolchain:gh200-2.6.0-x86_64",
        "registry.example.org/hpc/toolchain:gh200-2.6.0-aarch64",
    ]
    assert cmds[2][5:7] == ["--arch", "arm64"] and cmds[-1] == ["docker", "manifest", "push", "--purge", target]
