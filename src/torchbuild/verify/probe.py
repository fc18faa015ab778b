"""The program `verify` runs in the interpreter being verified, by file path:

    python probe.py torch EXPECT_JSON          torch against the profile's expectations
    python probe.py package NAME VERSION       any other package: import and __version__
    python probe.py worker BACKEND RANK SIZE INIT OUTDIR    one rank of a 2-process collective

It runs in a fresh venv where torchbuild is not importable, so it imports only the standard
library at module level (torch inside functions) and prints its checks as one JSON list on
the last line of stdout: [{"name": ..., "status": "pass" | "fail" | "skip", "detail": ...}].
For the same reason it starts its child processes (a collective's ranks, mpirun, the C++ check's
cmake and program) with subprocess, not through torchbuild's core/process.py.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

TAIL = 400  # characters of a failed step's output kept in a check's detail
TIMEOUT = 300  # seconds for a collective or a C++ build step
COLLECTIVE = [3.0, 42.0]  # what each of 2 ranks sees: all_reduce of 1 + 2, then rank 0's broadcast of 42
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}
LIBTORCH = "LibTorch C++ (find_package(Torch))"
CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(verify CXX)
find_package(Torch REQUIRED)
add_executable(verify main.cpp)
target_link_libraries(verify ${TORCH_LIBRARIES})
set_property(TARGET verify PROPERTY CXX_STANDARD 17)
"""
MAIN_CPP = """#include <torch/torch.h>
#include <iostream>
int main() {
  auto x = torch::arange(6, torch::kFloat).reshape({2, 3});
  auto w = torch::ones({3}, torch::requires_grad());
  auto y = torch::matmul(x, w).sum(); y.backward();
  std::cout << "RESULT " << y.item<float>() << " " << w.grad().sum().item<float>() << std::endl;
}
"""
CPP_RESULT = "RESULT 15 15"  # sum(arange(6).reshape(2, 3) @ ones(3)) and sum of its gradient


def record(name: str, ok: bool, detail: object = "", skip: bool = False) -> dict[str, str]:
    """One check as the JSON record verify.py reads back."""
    return {"name": name, "status": "skip" if skip else ("pass" if ok else "fail"), "detail": str(detail)}


def skipped(name: str, why: str) -> dict[str, str]:
    return record(name, True, why, skip=True)


def expected(name: str, got: object, want: object) -> dict[str, str]:
    """A check that passes when got == want, saying both."""
    return record(name, got == want, f"{got} (expected {want})")


def tail(text: str) -> str:
    return text[-TAIL:]


# --- the build configuration against the profile ----------------------------------------


def arch_flags_cover(flags: str, arch_list: list[str]) -> tuple[bool, list[str]]:
    """Whether torch's arch flags ("sm_80 sm_90 compute_90") hold a real (sm_) target for every
    arch of the profile ("8.0", "9.0a", "9.0+PTX"); also the wanted names ("80", "90a", "90")."""
    want = [a.replace(".", "").replace("+PTX", "") for a in arch_list]
    have = set(flags.replace(",", " ").split())
    return all(f"sm_{w}" in have for w in want), want


def build_config(torch: Any, expect: dict[str, Any]) -> list[dict[str, str]]:
    """Version, distributed backends, CUDA and its arch list, BLAS and OpenMP as the profile asks."""
    checks = []
    if expect["version"]:
        checks.append(expected("torch.__version__", torch.__version__, expect["version"]))
    dist = bool(torch.distributed.is_available())
    checks.append(record("distributed", dist == expect["distributed"], f"available={dist}"))
    if dist:
        gloo, mpi = torch.distributed.is_gloo_available(), torch.distributed.is_mpi_available()
        checks.append(record("gloo backend", gloo == expect["gloo"], f"available={gloo}"))
        checks.append(record("mpi backend", mpi == expect["mpi"], f"available={mpi}"))
    cuda = torch.version.cuda
    checks.append(
        record("CUDA built", (cuda is not None) == bool(expect["cuda_version"]), f"torch.version.cuda={cuda}")
    )
    if cuda is not None and expect["cuda_arch_list"]:
        flags = torch._C._cuda_getArchFlags() or ""
        ok, want = arch_flags_cover(flags, expect["cuda_arch_list"])
        checks.append(record("CUDA arch list", ok, f"{flags} (expected {want})"))
    if expect["blas"]:
        found = expect["blas"].lower() in torch.__config__.show().lower()
        checks.append(record("BLAS", found, f"expected {expect['blas']} in torch.__config__.show()"))
    checks.append(record("OpenMP", torch.backends.openmp.is_available(), "torch.backends.openmp.is_available()"))
    return checks


def tensor_autograd(torch: Any) -> list[dict[str, str]]:
    """A matrix product and one backward step on the CPU."""
    x = torch.arange(6.0).reshape(2, 3)
    total = float((x @ x.T).sum())
    w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (w * w).sum().backward()
    grad = w.grad.tolist()
    return [
        record("tensor op", total == 83.0, f"sum(x @ x.T) = {total} for x = arange(6).reshape(2, 3), expected 83"),
        record("autograd", grad == [2.0, 4.0, 6.0], f"d/dw sum(w^2) = {grad}"),
    ]


# --- collectives: each rank is `probe.py worker` and leaves rankN.json in a folder --------


def worker(backend: str, rank: int, size: int, init: str, outdir: str) -> None:
    """One rank: all_reduce of rank + 1, broadcast of 42 from rank 0; writes rank<r>.json.
    With init empty (mpirun), the launcher gives the rank and world size."""
    torch: Any = importlib.import_module("torch")
    td: Any = importlib.import_module("torch.distributed")
    td.init_process_group(backend, init_method=init or None, rank=rank if init else -1, world_size=size if init else -1)
    r = td.get_rank()
    dev = f"cuda:{r}" if backend == "nccl" else "cpu"
    t = torch.tensor([float(r + 1)], device=dev)
    td.all_reduce(t)
    b = torch.tensor([42.0 if r == 0 else 0.0], device=dev)
    td.broadcast(b, src=0)
    with open(os.path.join(outdir, f"rank{r}.json"), "w") as f:
        json.dump([t.item(), b.item()], f)
    td.destroy_process_group()


def rank_of(filename: str) -> int:
    digits = filename[len("rank") : -len(".json")]
    return int(digits) if digits.isdigit() else -1


def collect_results(outdir: str) -> list[Any]:
    """What each rank wrote, in rank order; a file that is not JSON stays as its text."""
    files = sorted((f for f in os.listdir(outdir) if f.startswith("rank") and f.endswith(".json")), key=rank_of)
    results = []
    for name in files:
        with open(os.path.join(outdir, name)) as f:
            text = f.read()
        try:
            results.append(json.loads(text))
        except ValueError:
            results.append(text)
    return results


def expected_results(size: int) -> list[list[float]]:
    """What each of `size` ranks reports: the sum of 1..size, then 42 from rank 0."""
    return [[float(sum(range(1, size + 1))), 42.0]] * size


def worker_command(backend: str, rank: int, size: int, init: str, outdir: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "worker", backend, str(rank), str(size), init, outdir]


def collective_check(name: str, ok_exit: bool, outdir: str, want: list[list[float]], output: str) -> dict[str, str]:
    """Pass when every process exited 0 and every rank reported `want`."""
    got = collect_results(outdir)
    ok = ok_exit and got == want
    return record(name, ok, got if ok else tail(output))


def spawned_collective(name: str, backend: str, size: int) -> dict[str, str]:
    """`size` worker processes meeting through a file store (gloo on the CPU, nccl one rank per GPU)."""
    d = tempfile.mkdtemp()
    procs = [
        subprocess.Popen(
            worker_command(backend, r, size, f"file://{d}/store", d),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(size)
    ]
    outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    return collective_check(name, all(p.returncode == 0 for p in procs), d, expected_results(size), "".join(outs))


def gloo(torch: Any, expect: dict[str, Any]) -> list[dict[str, str]]:
    """Two worker processes on the CPU, when the profile asks for gloo and torch has distributed."""
    if not (torch.distributed.is_available() and expect["gloo"]):
        return []
    return [spawned_collective("gloo all_reduce + broadcast (2 processes)", "gloo", 2)]


def mpi(torch: Any, expect: dict[str, Any]) -> list[dict[str, str]]:
    """`mpirun -n 2` of the worker, when the profile asks for MPI and torch has it."""
    td = torch.distributed
    if not (td.is_available() and expect["mpi"] and td.is_mpi_available()):
        return []
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return [record("mpi all_reduce (mpirun -n 2)", False, "mpirun not found")]
    d = tempfile.mkdtemp()
    proc = subprocess.run(
        [mpirun, "-n", "2", *worker_command("mpi", 0, 2, "", d)],
        capture_output=True,
        text=True,
        env=dict(os.environ, **MPI_ENV),
        timeout=TIMEOUT,
    )
    name = "mpi all_reduce + broadcast (mpirun -n 2)"
    return [collective_check(name, proc.returncode == 0, d, expected_results(2), proc.stdout + proc.stderr)]


# --- LibTorch from C++ ----------------------------------------------------------------------


def cmake_prefixes(torch: Any) -> list[str]:
    """Where Torch/TorchConfig.cmake may be: the wheel's CMake prefix, then the system's."""
    return [torch.utils.cmake_prefix_path, *glob.glob("/usr/lib/*/cmake"), "/usr/share/cmake"]


def torch_cmake_dir(prefixes: list[str]) -> str | None:
    """The first prefix holding Torch/TorchConfig.cmake."""
    return next((p for p in prefixes if glob.glob(os.path.join(p, "Torch", "TorchConfig.cmake"))), None)


def libtorch_cpp(torch: Any) -> list[dict[str, str]]:
    """find_package(Torch), compile and run a small program doing a matmul and a backward step."""
    prefixes = cmake_prefixes(torch)
    torch_cmake = torch_cmake_dir(prefixes)
    if not torch_cmake:
        return [record(LIBTORCH, False, f"no Torch/TorchConfig.cmake under {prefixes}")]
    if not shutil.which("cmake"):
        return [skipped(LIBTORCH, "cmake not installed here")]
    src = tempfile.mkdtemp()
    for name, text in (("CMakeLists.txt", CMAKELISTS), ("main.cpp", MAIN_CPP)):
        with open(os.path.join(src, name), "w") as f:
            f.write(text)
    build = os.path.join(src, "build")
    steps = [
        ["cmake", "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={torch_cmake}", "-DCMAKE_BUILD_TYPE=Release"],
        ["cmake", "--build", build, "-j2"],
        [os.path.join(build, "verify")],
    ]
    log = ""
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=3 * TIMEOUT)
        log += proc.stdout + proc.stderr
        if proc.returncode != 0:
            return [record(LIBTORCH, False, tail(log))]
    ok = CPP_RESULT in proc.stdout
    return [record(LIBTORCH, ok, f"compiled against {torch_cmake}, printed {proc.stdout.strip()}" if ok else tail(log))]


# --- CUDA and NCCL, when a GPU is visible ---------------------------------------------------


def cuda_nccl(torch: Any, expect: dict[str, Any]) -> list[dict[str, str]]:
    """Devices, a matmul on the GPU, and an nccl collective with one rank per GPU (up to 2)."""
    if not torch.cuda.is_available():
        return [skipped("CUDA devices", "no GPU visible")]
    n = torch.cuda.device_count()
    a = torch.ones(64, 64, device="cuda")
    checks = [
        record("CUDA devices", n > 0, f"{n} x {torch.cuda.get_device_name(0)}"),
        record("CUDA matmul", float((a @ a).sum()) == 64.0**3, "ones(64,64) @ ones(64,64)"),
    ]
    if expect["nccl"]:
        size = min(2, n)
        checks.append(spawned_collective(f"nccl all_reduce + broadcast ({size} GPU processes)", "nccl", size))
    return checks


# --- entry points ---------------------------------------------------------------------------


def torch_probe(expect: dict[str, Any]) -> list[dict[str, str]]:
    """Every torch check, in the order the table shows them."""
    try:
        torch: Any = importlib.import_module("torch")
    except Exception as exc:
        return [record("import torch", False, repr(exc))]
    return [
        record("import torch", True, torch.__file__),
        *build_config(torch, expect),
        *tensor_autograd(torch),
        *gloo(torch, expect),
        *mpi(torch, expect),
        *libtorch_cpp(torch),
        *cuda_nccl(torch, expect),
    ]


def package_probe(name: str, version: str) -> list[dict[str, str]]:
    """Any other package: it imports, and its __version__ is the one expected (when one is)."""
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        return [record(f"import {name}", False, repr(exc))]
    checks = [record(f"import {name}", True, getattr(mod, "__file__", None))]
    if version:
        checks.append(expected(f"{name}.__version__", getattr(mod, "__version__", None), version))
    return checks


USAGE = "usage: probe.py torch EXPECT_JSON | package NAME VERSION | worker BACKEND RANK SIZE INIT OUTDIR"


def main(argv: list[str]) -> int:
    """Run one mode; the checks go to stdout as JSON on the last line (a worker prints nothing)."""
    if argv[:1] == ["worker"] and len(argv) == 6:
        worker(argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5])
        return 0
    if argv[:1] == ["torch"] and len(argv) == 2:
        checks = torch_probe(json.loads(argv[1]))
    elif argv[:1] == ["package"] and len(argv) == 3:
        checks = package_probe(argv[1], argv[2])
    else:
        print(USAGE, file=sys.stderr)
        return 2
    print(json.dumps(checks))
    return 0


def _drop_own_directory() -> None:
    """Run as `python .../torchbuild/verify/probe.py`, Python puts its own folder first on
    sys.path, where torchbuild's modules (install, manifest, verify...) would shadow the packages under test."""
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == here:
        del sys.path[0]


if __name__ == "__main__":
    _drop_own_directory()
    sys.exit(main(sys.argv[1:]))
