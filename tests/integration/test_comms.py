"""`invoke comms` in the cuda-offline image: the real aws-ofi-nccl release tarballs built against
Debian trixie's libfabric 2.1 and CUDA 12.4. 1.17.1 builds and exports the ncclNetPlugin_v*
symbols NCCL looks for; 1.6.0 (Derecho's pin) does not compile against libfabric 2.x, and
torchbuild says so before compiling. NCCL itself from source is in tests/slow (its source is
not reachable from CI: see test_nccl_source there)."""

from __future__ import annotations

import json
import re
import time

import pytest
from helpers import OFI_PLUGIN, TEST_TORCH, run_invoke, set_args

from torchbuild.runtime.environment import build_env

pytestmark = pytest.mark.docker


def _comms(sets: list[str], tmp_path, *extra: str):
    return run_invoke(
        "comms", "--in-container", "--profile", "cuda-offline", "--out", str(tmp_path / "out"), *set_args(sets), *extra
    )


def test_plugin_builds_against_trixies_libfabric_and_a_rerun_is_a_no_op(engine, cuda_image, ofi_sources, tmp_path):
    spec, image_sets = cuda_image
    tarball, sha = ofi_sources[OFI_PLUGIN]
    cache = tmp_path / "cache"
    sets = [
        TEST_TORCH,
        *image_sets,
        f"aws_ofi_nccl_source={tarball}",
        f"aws_ofi_nccl_sha256={sha}",
        f"cache_dir={cache}",
    ]
    t0 = time.monotonic()
    res = _comms(sets, tmp_path)
    first = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    (prefix,) = (cache / "comms").glob(f"ofi-{OFI_PLUGIN}-*")
    m = json.loads((prefix / "torchbuild-comms.json").read_text())
    plugin = m["plugin"]
    assert plugin["version"] == OFI_PLUGIN and plugin["sha256"] == sha and m["nccl"] is None
    assert plugin["libfabric_version"] == "2.1" and plugin["libfabric_prefix"] == "/usr"
    # NCCL 2.19+ takes v5 or newer, 2.26+ v6 or newer: the release must export them
    assert {"ncclNetPlugin_v6", "ncclNetPlugin_v9", "ncclNetPlugin_v10"} <= set(plugin["symbols"]), plugin
    assert "--with-libfabric=/usr" not in plugin["configure"] and "--disable-tests" in plugin["configure"]
    assert (prefix / plugin["library"]).is_file() and plugin["library"] == "lib/libnccl-net-ofi.so"
    # in the image, as a job would load it: every dependency resolves, libfabric is trixie's
    ldd = engine.client.containers.run(
        spec.image_tag, ["ldd", f"/p/{plugin['library']}"], volumes={str(prefix): {"bind": "/p", "mode": "ro"}},
        remove=True,
    ).decode()  # fmt: skip
    assert "not found" not in ldd, ldd
    assert re.search(r"libfabric\.so\.1 => (/usr)?/lib/x86_64-linux-gnu/libfabric\.so\.1", ldd), ldd
    assert not list((cache / "comms").glob("*.partial-*"))

    t0 = time.monotonic()
    again = _comms(sets, tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr
    assert "is up to date" in again.stdout and "building aws-ofi-nccl" not in again.stdout
    assert [p.name for p in (cache / "comms").iterdir()] == [prefix.name]
    print(f"aws-ofi-nccl {OFI_PLUGIN}: first run {first:.1f} s, rerun {time.monotonic() - t0:.1f} s")


def test_derechos_plugin_pin_does_not_compile_against_libfabric_2_and_is_refused_first(
    engine, cuda_image, ofi_sources, tmp_path
):
    spec, image_sets = cuda_image
    tarball, sha = ofi_sources["1.6.0"]
    cache = tmp_path / "cache"
    sets = [TEST_TORCH,
        *image_sets, "aws_ofi_nccl_version=1.6.0", f"aws_ofi_nccl_source={tarball}", f"aws_ofi_nccl_sha256={sha}",
        f"cache_dir={cache}",
    ]  # fmt: skip
    res = _comms(sets, tmp_path)
    assert res.returncode == 2 and "ProfileError" in res.stderr and "Traceback" not in res.stderr, res.stderr
    said = res.stdout + res.stderr  # the step in the image reports it; the host names the error again
    assert "1.6.0 does not compile against libfabric 2.1" in said and "use aws_ofi_nccl_version 1.17.1" in said
    assert "autogen" not in res.stdout  # refused before anything ran
    assert not list((cache / "comms").glob("*"))
    # the refusal is right: 1.6.0's own build stops at container_of, which libfabric 2.0 removed
    cc = build_env(spec, cache_root="/cache", jobs=1)["CC"]  # the image's compiler (gcc-13; no plain cc)
    script = (
        "cd /tmp && tar xzf /s/aws-ofi-nccl-1.6.0.tar.gz && cd aws-ofi-nccl-1.6.0 && sh ./autogen.sh >/dev/null 2>&1 && "
        f"./configure CC={cc} --disable-tests --with-cuda=/usr/lib/cuda >/dev/null 2>&1 && echo configured && "
        "make -j2 2>&1; echo make-exit=$?"
    )
    out = engine.client.containers.run(
        spec.image_tag, ["bash", "-c", script], volumes={str(tarball.parent): {"bind": "/s", "mode": "ro"}},
        remove=True,
    ).decode()  # fmt: skip
    assert "configured" in out and "make-exit=0" not in out and "container_of" in out, out[-3000:]
    print("\n".join(ln for ln in out.splitlines() if "container_of" in ln or "Error" in ln)[:1500])


def test_a_libfabric_prefix_that_is_not_there_is_named_and_nothing_is_made(cuda_image, ofi_sources, tmp_path):
    _, image_sets = cuda_image
    tarball, sha = ofi_sources[OFI_PLUGIN]
    missing = tmp_path / "opt" / "cray" / "libfabric" / "1.15.2.0"
    sets = [TEST_TORCH,
        *image_sets, f"aws_ofi_nccl_source={tarball}", f"aws_ofi_nccl_sha256={sha}", f"libfabric_prefix={missing}",
        f"cache_dir={tmp_path / 'cache'}",
    ]  # fmt: skip
    res = _comms(sets, tmp_path)
    assert res.returncode == 2 and "ProfileError" in res.stderr, res.stdout[-2000:] + res.stderr
    assert "libfabric_prefix" in res.stderr and str(missing) in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "opt").exists()  # no bind source made by the engine
    assert not (tmp_path / "cache" / "comms").exists()
