"""A native `invoke install` that carries the comms stack, with real parts: Debian's
python3-torch-cuda 2.6 (its libtorch_cuda links libnccl.so.2) packed as a wheel, Debian's
libnccl2 2.22.3 copied into a comms prefix that is not on the default search path, beside a
real aws-ofi-nccl 1.17.1 built there by `torchbuild comms` (nccl: system) in the cuda-offline
image, and real Lmod. The install runs natively inside a container of an image with that torch
(the worktree's torchbuild, bound in); the test shows that torch loads the system libnccl
without the install's environment and the prefix's copy with it (activated, or `module load`),
that NCCL_NET_PLUGIN names a library exporting ncclNetPlugin_v*, and that a prefix whose
libnccl torch does not load fails the install and leaves nothing.

The image: the debian-torch-installed toolchain image (Debian's CPU torch 2.6, shared with the
install and companion tests) with Lmod, the CUDA 12.4 runtime libraries and NCCL 2.22.3 that
Debian's torch-cuda packages link (contrib and non-free: libcudart12, libcublas12, ...,
libnccl2; not the 6 GB toolkit, which nothing here compiles with) and those torch-cuda packages
unpacked over the CPU torch (not installed: their nvidia-cudnn dependency downloads cuDNN from
NVIDIA at install time), and a stub libcudnn.so.9 defining the cudnn* symbols torch's libraries
bind (BIND_NOW) so that torch imports; nothing here calls cuDNN or a GPU.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import CALLER, FIXTURES, OFI_PLUGIN, run_in

import torchbuild
from torchbuild.profile.config import resolve
from torchbuild.runtime import manifest as mf

pytestmark = pytest.mark.docker

TAG = "torchbuild-test/torch-cuda-lmod:2.6.0"
# the runtime libraries libtorch-cuda-2.6, libgloo-cuda-0 and libtensorpipe-cuda-0 depend on
# beyond the CPU torch's (apt-cache depends), nvidia-cudnn left out
CUDA_RUNTIME = (
    "libcudart12 libcublas12 libcublaslt12 libcufft11 libcurand10 libcusolver11 libcusparse12 libnvrtc12 "
    "libnvtoolsext1 libnccl2 libhiredis1.1.0 libibverbs1 libuv1t64"
)
DOCKERFILE = """FROM {base}
USER 0
RUN echo 'deb http://deb.debian.org/debian trixie contrib non-free' > /etc/apt/sources.list.d/tb-cuda.list \\
 && apt-get -o Acquire::Check-Valid-Until=false update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lmod {runtime} >/dev/null \\
 && cd /tmp && apt-get download -qq libtorch-cuda-2.6 python3-torch-cuda libgloo-cuda-0 libtensorpipe-cuda-0 \\
 && for d in /tmp/*.deb; do dpkg -x "$d" /; done && rm -f /tmp/*.deb \\
 && find /usr/lib/python3/dist-packages/torch -xtype l -delete
RUN nm -D --undefined-only /usr/lib/x86_64-linux-gnu/lib*torch*.so* /usr/lib/x86_64-linux-gnu/libc10*.so* 2>/dev/null \\
    | awk '$2 ~ /^cudnn/ {{split($2, s, "@"); print "void " s[1] "(void) {{}}"}}' | sort -u > /tmp/cudnn.c \\
 && echo 'libcudnn.so.9 {{ global: *; }};' > /tmp/cudnn.map \\
 && "$(command -v gcc-13 || command -v gcc || command -v cc)" -shared -fPIC -Wl,-soname,libcudnn.so.9 \\
    -Wl,--version-script=/tmp/cudnn.map -o /usr/lib/x86_64-linux-gnu/libcudnn.so.9 /tmp/cudnn.c \\
 && rm /tmp/cudnn.c /tmp/cudnn.map && ldconfig
"""
TREE = Path(torchbuild.__file__).resolve().parents[2]  # this checkout (src/, configs/), bound in as /tb
SYSTEM_NCCL = "/usr/lib/x86_64-linux-gnu/libnccl.so.2.22.3"
MAPPED = "python -c \"import torch; print('{0}', [l.split()[-1] for l in open('/proc/self/maps') if '/libnccl.so' in l][0])\""
LMOD = "/usr/share/lmod/lmod/init/bash"


@pytest.fixture(scope="module")
def torch_cuda(engine, torch_image) -> str:
    """The image above on the session's debian-torch-installed image (Docker's layer cache makes
    it instant after the first time)."""
    spec, _ = torch_image
    dockerfile = DOCKERFILE.format(base=spec.image_tag, runtime=CUDA_RUNTIME)
    engine.client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=TAG, rm=True, forcerm=True)
    return TAG


def _run(engine, tag: str, argv: list[str], mounts: dict[str, str]) -> tuple[int, str]:
    """argv in a fresh container of tag as the caller, with the worktree's torchbuild first on
    PYTHONPATH; (exit code, output)."""
    container = engine.client.containers.run(
        tag, argv, detach=True, user=CALLER,
        environment={"HOME": "/tmp", "PYTHONPATH": "/tb/src"},
        volumes={str(TREE): {"bind": "/tb", "mode": "ro"}, **{h: {"bind": c, "mode": "rw"} for h, c in mounts.items()}},
    )  # fmt: skip
    try:
        rc = int(container.wait(timeout=900)["StatusCode"])
        return rc, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def site(engine, torch_cuda, cuda_image, ofi_sources, tmp_path_factory) -> dict[str, Path]:
    """The comms prefix (the plugin of `torchbuild comms`, Debian's libnccl copied in) and the
    torch-cuda wheel whose manifest records it."""
    root = tmp_path_factory.mktemp("install-comms")
    cache, wheels = root / "cache", root / "wheels"
    cache.mkdir()
    wheels.mkdir()
    spec, _ = cuda_image
    tarball, sha = ofi_sources[OFI_PLUGIN]
    argv = ["torchbuild", "comms", "--profile", "cuda-offline", "--out", str(root / "out")]
    for item in (f"aws_ofi_nccl_version={OFI_PLUGIN}", f"aws_ofi_nccl_source=/s/{tarball.name}",
                 f"aws_ofi_nccl_sha256={sha}", f"cache_dir={cache}"):  # fmt: skip
        argv += ["--set", item]
    rc, out = _run(engine, spec.image_tag, argv, {str(tarball.parent): "/s", str(root): str(root)})
    assert rc == 0, out[-4000:]
    (prefix,) = (cache / "comms").glob(f"ofi-{OFI_PLUGIN}-*")
    # Debian's libnccl2, copied into the prefix as `invoke comms` would have put a built NCCL
    fx = root / "fx"
    fx.mkdir()
    shutil.copy(FIXTURES / "debian_torch_wheel.py", fx)
    script = f"cp -P {SYSTEM_NCCL} /usr/lib/x86_64-linux-gnu/libnccl.so.2 {prefix}/lib/ && python3 {fx}/debian_torch_wheel.py {wheels}"
    run_in(engine, torch_cuda, script, {str(root): str(root)})
    made = json.loads((prefix / "torchbuild-comms.json").read_text())
    made["nccl"] = {
        "version": "2.22.3-1",
        "version_code": 22203,
        "sha256": "",
        "gencode": "",
        "library": "lib/libnccl.so.2.22.3",
    }
    (prefix / "torchbuild-comms.json").write_text(json.dumps(made))
    (wheel,) = wheels.glob("torch-2.6.0+debian-*.whl")
    _record(wheel, prefix, made)
    return {"root": root, "cache": cache, "prefix": prefix, "wheel": wheel}


def _record(wheel: Path, prefix: Path, made: dict) -> None:
    """wheel's manifest, recording the comms prefix as `invoke build` does."""
    plugin = {
        k: made["plugin"][k]
        for k in ("version", "sha256", "libfabric_prefix", "libfabric_version", "library", "symbols")
    }
    record = {"prefix": str(prefix), "key": made["key"], "nccl": made["nccl"], "plugin": plugin}
    built = mf.for_build(
        resolve("cuda-offline"), run_id="0123456789ab", provenance={"engine": "native", "comms": record},
        toolchain={"cc": "gcc"}, environment={}, jobs={"max_jobs": 1, "final_jobs": 1, "reason": "test"},
        started="2025-01-01T00:00:00+00:00", finished="2025-01-01T01:00:00+00:00", seconds=1.0,
        ccache=(0, 0, 0.0), log="build.log", report=None, wheel=wheel,
    )  # fmt: skip
    mf.write(built, Path(f"{wheel}{mf.SUFFIX}"))


def _install(engine, tag: str, site: dict[str, Path], wheel: Path, env: Path) -> tuple[int, str]:
    root = site["root"]
    argv = ["torchbuild", "install", "--profile", "cpu", "--prefix", str(env), "--wheel", str(wheel),
            "--out", str(root / "install-out"), "--set", f"cache_dir={site['cache']}",
            "--set", "python_version=3.13", "--set", 'runtime_env={NCCL_NET: "AWS Libfabric"}']  # fmt: skip
    return _run(engine, tag, argv, {str(root): str(root)})


@pytest.fixture(scope="module")
def installed(engine, torch_cuda, site) -> tuple[Path, str]:
    env = site["root"] / "env"
    rc, out = _install(engine, torch_cuda, site, site["wheel"], env)
    assert rc == 0, out[-5000:]
    return env, out


def test_installed_torch_loads_the_carried_nccl_and_plugin_activated_and_through_lmod(
    engine, torch_cuda, site, installed
):
    env, out = installed
    copy = f"{env}/comms/lib/libnccl.so.2.22.3"
    plugin = f"{env}/comms/lib/libnccl-net-ofi.so"
    assert f"torch loads {copy}; NCCL opens {plugin} (ncclNetPlugin_v" in out, out[-3000:]
    m = mf.read_install(env / "torchbuild-install.json")
    assert m.comms is not None and m.comms.copied and m.comms.source == str(site["prefix"])
    assert m.comms.nccl_loaded == copy and m.comms.net_plugin == plugin and "ncclNetPlugin_v8" in m.comms.plugin_symbols
    symbols = "python -c \"import ctypes, os; l = ctypes.CDLL(os.environ['NCCL_NET_PLUGIN']); print('{0}', hasattr(l, 'ncclNetPlugin_v8'))\""
    script = f"""
        set -e
        cd /tmp
        env -u LD_LIBRARY_PATH -u NCCL_NET_PLUGIN PATH={env}/bin:$PATH {MAPPED.format("plain")}
        . {env}/bin/activate
        {MAPPED.format("activated")}
        {symbols.format("activated-plugin")}
        printf 'activated-env:%s|%s\\n' "$LD_LIBRARY_PATH" "$NCCL_NET_PLUGIN"
        deactivate
        source {LMOD}
        module use {env}/modulefiles
        module load torch/2.6.0-debian
        {MAPPED.format("module")}
        {symbols.format("module-plugin")}
        printf 'module-env:%s|%s|%s\\n' "$LD_LIBRARY_PATH" "$NCCL_NET_PLUGIN" "$NCCL_NET"
    """
    # the build cache is not bound in: the environment needs only its own copy
    logs = run_in(engine, torch_cuda, script, {str(env): str(env)})
    assert f"plain {SYSTEM_NCCL}" in logs, logs
    assert f"activated {copy}" in logs and f"module {copy}" in logs, logs
    assert "activated-plugin True" in logs and "module-plugin True" in logs, logs
    lines = dict(ln.split(":", 1) for ln in logs.splitlines() if ln.startswith(("activated-env:", "module-env:")))
    assert lines["activated-env"].startswith(f"{env}/comms/lib") and lines["activated-env"].endswith(f"|{plugin}"), logs
    assert lines["module-env"].startswith(f"{env}/comms/lib") and lines["module-env"].endswith(
        f"|{plugin}|AWS Libfabric"
    ), logs


def test_a_prefix_whose_nccl_torch_does_not_load_fails_the_install_and_leaves_nothing(engine, torch_cuda, site):
    """The prefix's libnccl.so.2 link gone (its libnccl.so.2.22.3 still there): the loader finds
    the system's libnccl.so.2, and the check after install names it."""
    root = site["root"]
    tampered = site["cache"] / "comms" / "tampered"
    shutil.copytree(site["prefix"], tampered, symlinks=True)
    (tampered / "lib" / "libnccl.so.2").unlink()
    wheels = root / "tampered-wheels"
    wheels.mkdir()
    wheel = wheels / site["wheel"].name
    os.link(site["wheel"], wheel)
    _record(wheel, tampered, json.loads((tampered / "torchbuild-comms.json").read_text()))
    env = root / "tampered-env"
    rc, out = _install(engine, torch_cuda, site, wheel, env)
    assert rc == 22, out[-4000:]
    assert "error: InstallFailed" in out and "Traceback" not in out, out[-4000:]
    assert f"torch loaded {SYSTEM_NCCL}, not {env}/comms/lib/libnccl.so.2.22.3" in out, out[-4000:]
    assert not env.exists()
    out = root / "install-out"  # gone when this failed install made it (issue 41 item 18)
    assert not out.exists() or not [p for p in out.iterdir() if p.name.startswith(".partial-")]
