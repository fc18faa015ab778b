"""The derecho profile's whole native path, rehearsed on a stand-in Derecho GPU node.

The stand-in (tests/fixtures/derecho_standin/) is a Debian bookworm image with no Docker in it:
- libfabric 1.17.0 (bookworm's libfabric1 + libfabric-dev) moved under the Cray-style prefix
  /opt/cray/libfabric/1.15.2.0 and removed from /usr, with a libfabric/1.15.2.0 module;
- real Lmod with modules named as Derecho's: ncarenv/23.09, gcc/12.2.0 (bookworm's gcc 12.2),
  ncarcompilers, cray-mpich/8.1.27 (Debian's MPICH 4.0, the ABI cray-mpich is compatible with;
  it loads the libfabric module, as Cray's does), cuda/12.2.1 and the cudnn modules the profile
  may ask for. bookworm's nvidia-cuda-toolkit is CUDA 11.8: the cuda/12.2.1 module is NAMED as
  the site's but provides 11.8 (under /usr, Debian's layout), and the cudnn modules provide no
  library (Debian's nvidia-cudnn downloads cuDNN from NVIDIA, which is not reachable here).

In it, as the site's user (uid 1000, a login shell; this checkout's torchbuild and the test
interpreter's site-packages bound in read-only at their own paths, run by bookworm's python3.11
on PYTHONPATH: the same 3.11 ABI; pip reaches PyPI through this host's CA bundle): `module load`
the profile's modules; `invoke comms` builds NCCL 2.21.5-1 (the shared tarball) for sm_80 and aws-ofi-nccl 1.6.0 against that libfabric;
the preflight of Debian's PyTorch 2.6 source (`invoke build --preflight`) configures against
them; `invoke install` of a torch wheel recorded as built with that comms stack (a stand-in
package: the whole library is hours of compiling here) and `module load` of the installed
modulefile, whose environment must put the built NCCL and plugin first and set NCCL_NET_PLUGIN.

Slow. Measured here on 2 cores shared with other builds (load 8-11): the image 6 min (CUDA 11.8
and PyTorch's build dependencies from Debian's mirror; 8.2 GB before those); aws-ofi-nccl 1.6.0
54 s; the preflight (configure and c10) 7 min. NCCL 2.21.5-1 for sm_80 alone did not finish in
the 45 min measured (24 of its ~115 device objects); 2.22.3-1 for sm_80 took 492 s on an idle
machine (docs/figures.md), so expect 10-15 min idle, an hour or more under load.
"""

from __future__ import annotations

import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, make_wheel
from standin import StandinNode, build_standin

from torchbuild.profile.config import resolve

pytestmark = [pytest.mark.docker]

STANDIN = "torchbuild-test/derecho-standin:bookworm"
NCCL = "2.21.5-1"
PLUGIN = "1.6.0"
LIBFABRIC = "/opt/cray/libfabric/1.15.2.0"
SCRATCH = "/glade/derecho/scratch/derecho"  # the site user's scratch: the test's directory bound in
SOURCES = "/glade/work/derecho/sources"
STANDIN_PYTHON = "3.11"  # bookworm's: this checkout's interpreter is bound in and must be the same


def _profile_sets(nccl: tuple[Path, str], plugin: tuple[Path, str]) -> list[str]:
    """--set overrides of the derecho profile for what the stand-in lacks or differs in, each with its reason."""
    return [
        f"cache_dir={SCRATCH}/cache",
        # github.com is closed here: NCCL's and the plugin's release tarballs from the shared sources
        f"nccl_source={SOURCES}/{nccl[0].name}",
        f"nccl_sha256={nccl[1]}",
        f"aws_ofi_nccl_source={SOURCES}/{plugin[0].name}",
        f"aws_ofi_nccl_sha256={plugin[1]}",
        # Debian's CUDA is laid out under /usr (the stand-in cuda module's CUDA_HOME), not NVIDIA's
        # /usr/local/cuda, and is 11.8, not the site's 12.2.1
        "cuda_home=/usr",
        "cuda_version=11.8",
        # the stand-in's base (the profile's nvidia/cuda 12.6 base would refuse cuda_version 11.8)
        "base_image=torchbuild/base:bookworm-x86_64",
        # bookworm's glibc is 2.36, Derecho's SLES 15 SP4+ 2.31: the stand-in cannot meet the floor
        "glibc_floor=",
        # bookworm's Python (the site's conda Python is left out by the profile as well)
        f"python_version={STANDIN_PYTHON}",
        # Debian's PyTorch 2.6 source is what is reachable here; it is de-vendored (third_party
        # removed): configured against bookworm's system libraries, as Debian builds it
        "torch_version=2.6.0",
        "switches.USE_SYSTEM_LIBS=ON",
        "switches.USE_GFLAGS=OFF",
        "switches.USE_GLOG=OFF",
        "switches.USE_ITT=OFF",
        "switches.USE_FBGEMM=OFF",
        "switches.USE_KINETO=OFF",
        "switches.USE_MKLDNN=OFF",
        # bookworm's XNNPACK (2022) has no libmicrokernels-prod, which torch 2.6 links
        "switches.USE_XNNPACK=OFF",
        # no cuDNN, cuSPARSELt, cuDSS or cuFile in bookworm (NVIDIA's downloads are closed here)
        "switches.USE_CUDNN=OFF",
        "switches.USE_CUSPARSELT=OFF",
        "switches.USE_CUDSS=OFF",
        "switches.USE_CUFILE=OFF",
        "switches.USE_MAGMA=OFF",
        # flash and memory-efficient attention need CUDA >= 11.6 features torch 2.6 gates on 12.x
        "switches.USE_FLASH_ATTENTION=OFF",
        "switches.USE_MEM_EFF_ATTENTION=OFF",
    ]


@pytest.fixture(scope="session")
def standin(engine, test_cache) -> str:
    """The stand-in Derecho node image, made from the bookworm base (made here if missing)."""
    return build_standin(engine, test_cache, FIXTURES / "derecho_standin", STANDIN)


@pytest.fixture
def node(engine, standin, nccl_sources, ofi_sources, debian_dsc, tmp_path):
    """The stand-in node running, with this checkout and its interpreter bound at their own paths
    (read-only), the shared tarballs and Debian's PyTorch source bound in, and the user's scratch."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" != STANDIN_PYTHON:
        pytest.fail(f"the rehearsal runs this interpreter's packages ({sys.version}) on bookworm's {STANDIN_PYTHON}")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)
    sources = tmp_path / "sources"
    sources.mkdir()
    for path, _ in (nccl_sources[NCCL], ofi_sources[PLUGIN]):
        shutil.copy(path, sources)
    mounts = {
        str(REPO): (str(REPO), "ro"),
        str(sources): (SOURCES, "ro"),
        str(debian_dsc.parent): ("/glade/work/derecho/debian-src", "ro"),
        str(scratch): (SCRATCH, "rw"),
    }
    site = sysconfig.get_paths()["purelib"]
    if not Path(site).is_relative_to(REPO):
        mounts[site] = (site, "ro")
    env = {"PYTHONPATH": f"{REPO / 'src'}:{site}"}
    certs = Path("/etc/ssl/certs/ca-certificates.crt")  # this host's CAs (a TLS-inspecting proxy to PyPI)
    if certs.is_file():
        mounts[str(certs)] = ("/etc/ssl/certs/host-ca-certificates.crt", "ro")
        env["PIP_CERT"] = "/etc/ssl/certs/host-ca-certificates.crt"
    n = StandinNode(engine, standin, mounts, env, "derecho")
    try:
        yield n, scratch
    finally:
        n.stop()


def invoke(*args: str) -> str:
    return " ".join(["python3", "-m", "invoke", *args])


def sets(values: list[str]) -> str:
    return " ".join(f"--set '{v}'" for v in values)


def test_derecho_rehearsal_comms_preflight_install_and_module_load(node, nccl_sources, ofi_sources, debian_dsc):
    n, scratch = node
    overrides = _profile_sets(nccl_sources[NCCL], ofi_sources[PLUGIN])
    spec = resolve("derecho", overrides)
    load = f"module load {' '.join(spec.modules)}"

    # -- the site's environment: libfabric only under the Cray prefix, reached through the module
    env = n.sh(f"{load}\nmodule list 2>&1\necho LD=$LD_LIBRARY_PATH\nls /usr/include/rdma/fabric.h 2>&1 || true")
    assert "cray-mpich/8.1.27" in env and "libfabric/1.15.2.0" in env
    assert f"LD={LIBFABRIC}/lib" in env and "No such file" in env

    # -- invoke comms: NCCL 2.21.5-1 for sm_80, aws-ofi-nccl 1.6.0 against the site's libfabric
    t0 = time.monotonic()
    out = n.sh(f"{load}\n{invoke('comms', '--profile', 'derecho', '--out', f'{SCRATCH}/out')} {sets(overrides)}")
    comms_s = time.monotonic() - t0
    (prefix,) = (scratch / "cache" / "comms").glob(f"nccl-{NCCL}-ofi-{PLUGIN}-*")
    made = json.loads((prefix / "torchbuild-comms.json").read_text())
    nccl, plugin = made["nccl"], made["plugin"]
    assert nccl["version_code"] == 22105 and nccl["gencode"] == "-gencode=arch=compute_80,code=sm_80"
    assert nccl["library"] == "lib/libnccl.so.2.21.5" and (prefix / "include" / "nccl.h").is_file()
    assert plugin["version"] == PLUGIN and plugin["libfabric_prefix"] == LIBFABRIC
    assert str(plugin["libfabric_version"]).startswith("1.")  # bookworm's 1.17 under the Cray prefix
    assert plugin["library"] == "lib/libnccl-net.so"
    assert any(s.startswith("ncclNetPlugin_v") for s in plugin["symbols"])
    print(
        f"comms {comms_s:.0f} s: NCCL {NCCL} {nccl['seconds']:.0f} s, {nccl['size_bytes'] / 2**20:.1f} MiB; "
        f"aws-ofi-nccl {PLUGIN} {plugin['seconds']:.0f} s, {plugin['size_bytes'] / 2**20:.1f} MiB, "
        f"against libfabric {plugin['libfabric_version']} ({plugin['symbols']})\n{out[-1500:]}"
    )

    # -- the preflight of Debian's PyTorch 2.6 source against that NCCL (comms is built already)
    dsc = f"/glade/work/derecho/debian-src/{debian_dsc.name}"
    t0 = time.monotonic()
    pre = n.sh(
        f"{load}\n{invoke('build', '--preflight', '--profile', 'derecho', '--source', dsc, '--out', f'{SCRATCH}/out')} "
        f"{sets(overrides)}"
    )
    print(f"preflight {time.monotonic() - t0:.0f} s")
    inside = f"{SCRATCH}/cache/comms/{prefix.name}"
    assert "is up to date" in pre and f"NCCL_ROOT={inside}" in pre and "USE_SYSTEM_NCCL=1" in pre
    assert f"Found NCCL (include: {inside}/include" in pre, pre[-6000:]
    manifest_line = next(ln for ln in pre.splitlines() if ln.startswith("manifest: "))
    manifest = scratch / Path(manifest_line.split(": ", 1)[1]).relative_to(SCRATCH)
    record = json.loads(manifest.read_text())
    assert record["comms"]["nccl"]["version_code"] == 22105 and record["comms"]["plugin"]["version"] == PLUGIN

    # -- invoke install of a torch wheel recorded as built with that comms stack, then module load
    wheels = scratch / "wheels"
    wheel = _standin_torch_wheel(wheels, spec.local_version)
    shutil.copy(manifest, f"{wheel}.manifest.json")
    wheels.chmod(0o777)
    env_prefix = f"{SCRATCH}/envs/torch"
    res = n.sh(
        f"{load}\n{invoke('install', '--profile', 'derecho', '--prefix', env_prefix, '--out', f'{SCRATCH}/wheels')} "
        f"{sets(overrides)}"
    )
    assert "torch loads" in res, res[-3000:]
    copied = f"{env_prefix}/comms"
    used = n.sh(
        f"module use {env_prefix}/modulefiles\nmodule load torch\n"
        'echo "LD=$LD_LIBRARY_PATH"; echo "PLUGIN=$NCCL_NET_PLUGIN"; echo "NET=$NCCL_NET"\n'
        f'python -c \'import torch; print("\\n".join(l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l))\''
    )
    ld = next(ln for ln in used.splitlines() if ln.startswith("LD=")).removeprefix("LD=").split(":")
    assert ld[0] == f"{copied}/lib", ld  # the built NCCL and plugin first
    # 1.6.0 installs lib/libnccl-net.so (1.17 libnccl-net-ofi.so): NCCL_NET_PLUGIN names it by its path
    assert f"PLUGIN={copied}/{plugin['library']}" in used and "NET=AWS Libfabric" in used
    assert f"{copied}/lib/libnccl.so.2.21.5" in used, used


def _standin_torch_wheel(directory: Path, local: str) -> Path:
    """torch 2.6.0+<local>: a package that loads libnccl.so.2 by its soname at import, as
    libtorch_cuda.so does (its DT_NEEDED), so the dynamic loader picks the NCCL the environment puts first."""
    code = 'import ctypes\n_nccl = ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)\n'
    return make_wheel(directory, "torch", f"2.6.0+{local}", module="torch", code=code)
