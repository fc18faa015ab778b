"""The sm_100 canary that Debian's CUDA cannot give, and the CUDA target table against NVIDIA's own
compilers. No Debian or Ubuntu suite packages a CUDA with Blackwell (12.8), but NVIDIA publishes
each toolkit's ptxas, the assembler that writes the SASS, on PyPI (nvidia-cuda-nvcc-cu12 12.8
and 12.9, nvidia-cuda-nvcc 13.0). For each, in a container of the trixie base: the GPU names
ptxas takes are profile/cuda_archs.py's row for its CUDA, and a PTX kernel assembles for sm_100
(B200, GB200) and sm_120 into a cubin whose ELF header says so. `nox -s slow`: about 120 MB of
wheels from the index pip is configured with, a minute."""

from __future__ import annotations

import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from torchbuild.profile.cuda_archs import TARGETS

pytestmark = [pytest.mark.docker, pytest.mark.slow]

WHEELS = {"12.8": "nvidia-cuda-nvcc-cu12==12.8.93", "12.9": "nvidia-cuda-nvcc-cu12==12.9.86"}
WHEELS["13.0"] = "nvidia-cuda-nvcc==13.0.88"

# PTX ISA 8.7 (CUDA 12.8) is the first with sm_100 and sm_120 targets
KERNEL = """.version 8.7
.target {target}
.address_size 64

.visible .entry answer(.param .u64 out)
{{
  .reg .b64 %rd<3>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, 42;
  st.global.u32 [%rd2], %r1;
  ret;
}}
"""

# the script run in the container: ptxas's --gpu-name values, then each target assembled
SCRIPT = r"""
set -e
ptxas=$(ls /w/toolkit/nvidia/*/bin/ptxas)
chmod +x "$ptxas"
"$ptxas" --version | tail -n 1
"$ptxas" --help | tr -d '\n' | grep -o "'sm_[0-9a-z]*'" | tr -d "'" | tr '\n' ' '; echo
for t in sm_100 sm_120; do "$ptxas" -arch=$t /w/$t.ptx -o /w/$t.cubin; done
"""
EM_CUDA = 190  # e_machine of a cubin (the ELF registry's "NVIDIA CUDA architecture")


def _toolkit(requirement: str, dest: Path) -> Path:
    """The wheel's files, unpacked (pip download, then zipfile: no install into any Python)."""
    wheels = dest / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), requirement]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest / "toolkit")
    return dest


def _cubin_sm(path: Path) -> tuple[int, int]:
    """(e_machine, the SM) of a 64-bit cubin's ELF header: the SM is bits 8-15 of e_flags in the
    ELF ABI version 8 that ptxas 12.8 and later write (sm_100: 0x6006402), as `readelf -h` shows."""
    head = path.read_bytes()[:64]
    assert head[:4] == b"\x7fELF" and head[4] == 2 and head[8] == 8, head[:16]  # ELF64, ABI version 8
    machine, flags = struct.unpack_from("<H", head, 18)[0], struct.unpack_from("<I", head, 48)[0]
    return machine, (flags >> 8) & 0xFF


@pytest.mark.parametrize("cuda", sorted(WHEELS))
def test_ptxas_targets_are_the_tables_and_sm100_assembles(engine, local_base, tmp_path, cuda):
    work = _toolkit(WHEELS[cuda], tmp_path)
    for target in ("sm_100", "sm_120"):
        (work / f"{target}.ptx").write_text(KERNEL.format(target=target))
    out = engine.client.containers.run(
        local_base,
        ["bash", "-c", SCRIPT],
        volumes={str(work): {"bind": "/w", "mode": "rw"}},
        remove=True,
    ).decode()
    lines = out.splitlines()
    assert f"release {cuda}" in out or f"cuda_{cuda}" in lines[0], out
    names = {n.removeprefix("sm_") for n in lines[1].split()}
    table = {a.replace(".", "") for a in TARGETS[cuda]}
    assert names == table, (sorted(names - table), sorted(table - names))
    for target, sm in (("sm_100", 100), ("sm_120", 120)):
        assert _cubin_sm(work / f"{target}.cubin") == (EM_CUDA, sm), target
