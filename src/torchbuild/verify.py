"""Verify what was built: the wheel's tags against this interpreter and machine, its version
against the profile, and that it installs into a fresh venv and works there.

`verify_here()` runs where the wheel is meant to run (in the toolchain image, or natively);
`invoke verify` calls it through `torchbuild verify-inside` in a container or directly.
For torch, the probe checks import, `torch.__version__`, the build configuration against the
profile (MPI, gloo, CUDA and its arch list, BLAS, OpenMP), a tensor op and an autograd step,
a 2-process gloo all_reduce and broadcast, and CUDA when a GPU is visible (skipped otherwise).
Any other package is imported and its `__version__` compared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from .config import BuildSpec

WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass, fail, skip
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def parse_wheel_name(name: str) -> dict[str, str]:
    m = WHEEL_RE.match(name)
    if not m:
        raise ValueError(f"{name} is not a wheel file name (name-version-python-abi-platform.whl)")
    return {k: v for k, v in m.groupdict().items() if v is not None}


def tag_checks(wheel_name: str, expect_version: str, machine: str | None = None) -> list[Check]:
    """Version and python/abi/platform tags of a wheel file name against this interpreter."""
    tags = parse_wheel_name(wheel_name)
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = machine or platform.machine()
    checks = []
    version = tags["version"].replace("_", "-")
    if expect_version:
        ok = version == expect_version
        checks.append(Check("version", "pass" if ok else "fail", f"{version} (expected {expect_version})"))
    py_ok = any(t in (py, "py3", f"py{sys.version_info.major}{sys.version_info.minor}") for t in tags["py"].split("."))
    checks.append(Check("python tag", "pass" if py_ok else "fail", f"{tags['py']} (interpreter {py})"))
    abi_ok = any(t in (py, "abi3", "none") for t in tags["abi"].split("."))
    checks.append(Check("abi tag", "pass" if abi_ok else "fail", f"{tags['abi']} (interpreter {py})"))
    plats = tags["plat"].split(".")
    plat_ok = any(
        p == "any" or (p.startswith(("linux_", "manylinux", "musllinux")) and p.endswith("_" + machine)) for p in plats
    )
    checks.append(Check("platform tag", "pass" if plat_ok else "fail", f"{tags['plat']} (machine {machine})"))
    return checks


TORCH_PROBE = r"""
import json, os, sys, tempfile
expect = json.loads(sys.argv[1])
checks = []
def check(name, ok, detail="", skip=False):
    checks.append({"name": name, "status": "skip" if skip else ("pass" if ok else "fail"), "detail": str(detail)})
try:
    import torch
except Exception as exc:
    check("import torch", False, repr(exc)); print(json.dumps(checks)); sys.exit(0)
check("import torch", True, torch.__file__)
if expect["version"]:
    check("torch.__version__", torch.__version__ == expect["version"], f"{torch.__version__} (expected {expect['version']})")
config = torch.__config__.show()
dist = torch.distributed.is_available()
check("distributed", dist == expect["distributed"], f"available={dist}")
if dist:
    import torch.distributed as td
    check("gloo backend", td.is_gloo_available() == expect["gloo"], f"available={td.is_gloo_available()}")
    check("mpi backend", td.is_mpi_available() == expect["mpi"], f"available={td.is_mpi_available()}")
cuda_built = torch.version.cuda is not None
check("CUDA built", cuda_built == bool(expect["cuda_version"]), f"torch.version.cuda={torch.version.cuda}")
if cuda_built and expect["cuda_arch_list"]:
    flags = torch._C._cuda_getArchFlags() or ""
    want = [a.replace(".", "").replace("+PTX", "") for a in expect["cuda_arch_list"]]
    check("CUDA arch list", all(f"sm_{w}" in flags for w in want), f"{flags} (expected {want})")
if expect["blas"]:
    check("BLAS", expect["blas"].lower() in config.lower(), f"expected {expect['blas']} in torch.__config__.show()")
check("OpenMP", torch.backends.openmp.is_available(), "torch.backends.openmp.is_available()")
x = torch.arange(6.0).reshape(2, 3)
check("tensor op", float((x @ x.T).sum()) == 83.0, f"sum(x @ x.T) = {float((x @ x.T).sum())} for x = arange(6).reshape(2, 3), expected 83")
w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
(w * w).sum().backward()
check("autograd", w.grad.tolist() == [2.0, 4.0, 6.0], f"d/dw sum(w^2) = {w.grad.tolist()}")
WORKER = (
    "import json, os, sys, torch, torch.distributed as td; "
    "backend, rank, size, init, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]; "
    "td.init_process_group(backend, init_method=init or None, rank=rank if init else -1, world_size=size if init else -1); "
    "r = td.get_rank(); dev = f'cuda:{r}' if backend == 'nccl' else 'cpu'; "
    "t = torch.tensor([float(r + 1)], device=dev); td.all_reduce(t); "
    "b = torch.tensor([42.0 if r == 0 else 0.0], device=dev); td.broadcast(b, src=0); "
    "open(os.path.join(outdir, f'rank{r}.json'), 'w').write(json.dumps([t.item(), b.item()])); "
    "td.destroy_process_group()"
)
def results(outdir):
    files = sorted(f for f in os.listdir(outdir) if f.startswith("rank"))
    return [json.load(open(os.path.join(outdir, f))) for f in files]
if dist and expect["gloo"]:
    import subprocess
    d = tempfile.mkdtemp()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, "gloo", str(r), "2", f"file://{d}/store", d],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    ok = all(p.returncode == 0 for p in procs) and results(d) == [[3.0, 42.0], [3.0, 42.0]]
    check("gloo all_reduce + broadcast (2 processes)", ok, results(d) if ok else "".join(outs)[-400:])
if dist and expect["mpi"] and torch.distributed.is_mpi_available():
    import shutil, subprocess
    mpirun = shutil.which("mpirun")
    if not mpirun:
        check("mpi all_reduce (mpirun -n 2)", False, "mpirun not found")
    else:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
        d = tempfile.mkdtemp()
        proc = subprocess.run([mpirun, "-n", "2", sys.executable, "-c", WORKER, "mpi", "0", "2", "", d],
                              capture_output=True, text=True, env=env, timeout=300)
        got = results(d)
        ok = proc.returncode == 0 and got == [[3.0, 42.0], [3.0, 42.0]]
        check("mpi all_reduce + broadcast (mpirun -n 2)", ok, got if ok else (proc.stdout + proc.stderr)[-400:])
import glob, shutil, subprocess
prefixes = [torch.utils.cmake_prefix_path, *glob.glob("/usr/lib/*/cmake"), "/usr/share/cmake"]
torch_cmake = next((p for p in prefixes if glob.glob(os.path.join(p, "Torch", "TorchConfig.cmake"))), None)
if not torch_cmake:
    check("LibTorch C++ (find_package(Torch))", False, f"no Torch/TorchConfig.cmake under {prefixes}")
elif not shutil.which("cmake"):
    check("LibTorch C++ (find_package(Torch))", True, "cmake not installed here", skip=True)
else:
    src = tempfile.mkdtemp()
    open(os.path.join(src, "CMakeLists.txt"), "w").write(
        "cmake_minimum_required(VERSION 3.18)\nproject(verify CXX)\nfind_package(Torch REQUIRED)\n"
        "add_executable(verify main.cpp)\ntarget_link_libraries(verify ${TORCH_LIBRARIES})\n"
        "set_property(TARGET verify PROPERTY CXX_STANDARD 17)\n")
    open(os.path.join(src, "main.cpp"), "w").write(
        "#include <torch/torch.h>\n#include <iostream>\nint main() {\n"
        "  auto x = torch::arange(6, torch::kFloat).reshape({2, 3});\n"
        "  auto w = torch::ones({3}, torch::requires_grad());\n"
        "  auto y = torch::matmul(x, w).sum(); y.backward();\n"
        "  std::cout << \"RESULT \" << y.item<float>() << \" \" << w.grad().sum().item<float>() << std::endl;\n}\n")
    build = os.path.join(src, "build")
    steps = [["cmake", "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={torch_cmake}", "-DCMAKE_BUILD_TYPE=Release"],
             ["cmake", "--build", build, "-j2"], [os.path.join(build, "verify")]]
    log = ""
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=900)
        log += proc.stdout + proc.stderr
        if proc.returncode != 0:
            break
    ok = proc.returncode == 0 and "RESULT 15 15" in proc.stdout
    check("LibTorch C++ (find_package(Torch))", ok, "compiled against " + torch_cmake + ", printed " + proc.stdout.strip() if ok else log[-400:])
if torch.cuda.is_available():
    n = torch.cuda.device_count()
    a = torch.ones(64, 64, device="cuda")
    check("CUDA devices", n > 0, f"{n} x {torch.cuda.get_device_name(0)}")
    check("CUDA matmul", float((a @ a).sum()) == 64.0 ** 3, "ones(64,64) @ ones(64,64)")
    if expect["nccl"]:
        size = min(2, n)  # one rank per GPU
        d = tempfile.mkdtemp()
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, "nccl", str(r), str(size), f"file://{d}/store", d],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(size)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        want = [[float(sum(range(1, size + 1))), 42.0]] * size
        ok = all(p.returncode == 0 for p in procs) and results(d) == want
        check(f"nccl all_reduce + broadcast ({size} GPU processes)", ok, results(d) if ok else "".join(outs)[-400:])
else:
    check("CUDA devices", True, "no GPU visible", skip=True)
print(json.dumps(checks))
"""

GENERIC_PROBE = r"""
import importlib, json, sys
name, version = sys.argv[1], sys.argv[2]
checks = []
try:
    mod = importlib.import_module(name)
    checks.append({"name": f"import {name}", "status": "pass", "detail": mod.__file__})
    got = getattr(mod, "__version__", None)
    if version:
        checks.append({"name": f"{name}.__version__", "status": "pass" if got == version else "fail",
                       "detail": f"{got} (expected {version})"})
except Exception as exc:
    checks.append({"name": f"import {name}", "status": "fail", "detail": repr(exc)})
print(json.dumps(checks))
"""


def _site_paths() -> list[str]:
    """This interpreter's package directories: the fresh venv sees them for dependencies only."""
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return [p for p in sorted(paths) if os.path.isdir(p)]


def _probe(python: str, name: str, spec: BuildSpec, version: str) -> list[Check]:
    if name == "torch":
        expect = {
            "version": version,
            "distributed": bool(spec.distributed),
            "gloo": "gloo" in spec.distributed,
            "mpi": "mpi" in spec.distributed,
            "nccl": "nccl" in spec.distributed,
            "cuda_version": spec.cuda_version,
            "cuda_arch_list": list(spec.cuda_arch_list),
            "blas": {"openblas": "OpenBLAS", "mkl": "MKL", "generic": "", "eigen": "Eigen"}.get(spec.blas, spec.blas),
        }
        args = [python, "-c", TORCH_PROBE, json.dumps(expect)]
    else:
        args = [python, "-c", GENERIC_PROBE, name, version]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
    lines = proc.stdout.strip().splitlines()
    try:
        return [Check(**c) for c in json.loads(lines[-1])]
    except (IndexError, ValueError, TypeError):
        return [Check(f"probe {name}", "fail", (proc.stdout + proc.stderr).strip()[-500:])]


def verify_wheel(wheel: Path, spec: BuildSpec, expect_version: str) -> list[Check]:
    """Tags, then install into a fresh venv (dependencies from this interpreter) and probe."""
    checks = tag_checks(wheel.name, expect_version)
    name = parse_wheel_name(wheel.name)["name"].lower()
    with tempfile.TemporaryDirectory(prefix="torchbuild-verify-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        purelib = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        Path(purelib, "torchbuild-deps.pth").write_text("\n".join(_site_paths()) + "\n")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", str(wheel)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            return [*checks, Check("install into a fresh venv", "fail", proc.stderr.strip()[-500:])]
        checks.append(Check("install into a fresh venv", "pass", wheel.name))
        checks += _probe(python, name, spec, expect_version)
    return checks


def verify_installed(name: str, spec: BuildSpec, expect_version: str) -> list[Check]:
    """The package already installed for this interpreter (e.g. a distribution's torch)."""
    return _probe(sys.executable, name, spec, expect_version)


def render(checks: list[Check]) -> str:
    width = max((len(c.name) for c in checks), default=0)
    lines = [f"  {c.status.upper():<4}  {c.name:<{width}}  {c.detail}" for c in checks]
    failed = sum(c.status == "fail" for c in checks)
    skipped = sum(c.status == "skip" for c in checks)
    lines.append(f"{len(checks) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)


def report(checks: list[Check], subject: str) -> dict[str, Any]:
    return {
        "subject": subject,
        "ok": not any(c.status == "fail" for c in checks),
        "checks": [c.to_dict() for c in checks],
        "python": sys.version.split()[0],
        "machine": platform.machine(),
    }


def request(
    spec: BuildSpec, *, wheel: Path | None, installed: str, expect_version: str, report: Path | None
) -> dict[str, Any]:
    """A verify request: plain data, so the image or the SIF can be handed it as JSON."""
    req: dict[str, Any] = {
        "spec": spec.to_dict(),
        "expect_version": expect_version or spec.build_version,
        "installed": installed,
    }
    if wheel is not None:
        req["wheel"] = str(wheel)
        req["json"] = str(report or Path(f"{wheel}.verify.json"))
    elif report is not None:
        req["json"] = str(report)
    return req


def run_request(req: dict[str, Any]) -> int:
    """Run a verify request here: checks, table, JSON report; VerifyFailed on any failure."""
    from .config import spec_from_dict
    from .errors import VerifyFailed

    spec = spec_from_dict(req["spec"], "verify request")
    if req.get("installed"):
        subject = f"installed {req['installed']}"
        checks = verify_installed(req["installed"], spec, req["expect_version"])
    else:
        subject = Path(req["wheel"]).name
        checks = verify_wheel(Path(req["wheel"]), spec, req["expect_version"])
    data = report(checks, subject)
    print(f"verify {subject} ({data['machine']}, Python {data['python']}):")
    print(render(checks))
    if req.get("json"):
        Path(req["json"]).write_text(json.dumps(data, indent=2) + "\n")
        print(f"report: {req['json']}")
    if not data["ok"]:
        failed = ", ".join(c.name for c in checks if c.status == "fail")
        raise VerifyFailed(f"{subject}: {failed}")
    return 0


def main_inside(request_file: str) -> int:
    """`torchbuild verify-inside REQUEST.json`: the request `verify_in()` wrote for the image or SIF."""
    return run_request(json.loads(Path(request_file).read_text()))


def check_wheel_file(path: Path) -> None:
    """A named error unless path is a wheel file (placeholder until the packaging-based check)."""
    from .errors import WheelError

    if not path.is_file():
        raise WheelError(f"--wheel {path}: no such file")
