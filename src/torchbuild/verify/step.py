"""Verify what was built: the wheel's tags against this interpreter and machine, its version
against the profile, and that it installs into a fresh venv and works there.

`run_request()` runs where the wheel is meant to run (in the toolchain image, the SIF, or
natively); `invoke verify` reaches it through a backend's `verify` step (steps.py).
The checks inside the interpreter under test are probe.py, run there by file path.
For torch, the probe checks import, `torch.__version__`, the build configuration against the
profile (MPI, gloo, CUDA and its arch list, BLAS, OpenMP), a tensor op and an autograd step,
a 2-process gloo (and MPI) all_reduce and broadcast, LibTorch from C++, and CUDA when a GPU is visible (skipped otherwise).
Any other package is imported and its `__version__` compared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from packaging.tags import Tag, compatible_tags, cpython_tags, sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from torchbuild.core import console
from torchbuild.core.errors import CommsFailed, PathError, TorchbuildError, UsageError, WheelError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.core.safeio import open_regular
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime import pipenv
from torchbuild.runtime.manifest import write_json
from torchbuild.runtime.pipenv import interpreter
from torchbuild.verify import probe, upstream_tests

PROBE = Path(probe.__file__)  # run by path in the interpreter under test, which lacks torchbuild
WHEEL_METADATA = re.compile(r"[^/]+\.dist-info/WHEEL")


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass, fail, skip
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


# a project name as the core metadata specification defines it (PEP 508's `identifier`, which
# packaging.utils.canonicalize_name(validate=True) checks only from packaging 24 on, and this
# project takes packaging 23): parse_wheel_filename takes `..` or `_x` as a name
_PROJECT_NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9]", re.IGNORECASE)


def check_wheel_file(path: Path, what: str = "--wheel", hint: str | None = None) -> None:
    """WheelError unless path is a wheel: a name-version-python-abi-platform.whl name whose name
    is a project name, and a zip archive with a *.dist-info/WHEEL; PathError when it does not
    exist, cannot be read or is no regular file (a directory, or a FIFO, which is never waited on). `what` says where the file came from in
    the messages (--wheel, or the directory it was found in), `hint` what to do instead."""
    label = f"{what} {console.printable(path)}"
    try:
        parse_wheel_filename(path.name)
        project = path.name.split("-", 1)[0]
        if not _PROJECT_NAME.fullmatch(project):
            raise InvalidWheelFilename(f"{project!r} is not a project name (letters, digits, '.', '_', '-')")
    except InvalidWheelFilename as exc:
        raise WheelError(
            f"{label} is not a wheel file name (name-version-python-abi-platform.whl): {console.printable(exc)}",
            hint=hint,
        ) from exc
    with named_os_errors(path, what):
        try:
            opened = open_regular(path, what, PathError)  # a FIFO named *.whl is never waited on
        except PathError as exc:  # a directory, device, FIFO or socket (not an OS fault: raised as is)
            if exc.__cause__ is not None:
                raise
            kind = exc.message.rpartition(" is ")[2]
            raise PathError(f"{label} is {kind}", hint=hint or WheelError.default_hint) from None
        try:
            with opened as f, zipfile.ZipFile(f) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, EOFError, ValueError) as exc:  # ValueError: a name not the UTF-8 its flag says
            raise WheelError(f"{label} is named like a wheel but is not a zip archive ({exc})", hint=hint) from exc
    if not any(WHEEL_METADATA.fullmatch(n) for n in names):
        raise WheelError(f"{label} is a zip archive without a *.dist-info/WHEEL: not a wheel", hint=hint)


def supported_tags(machine: str | None = None, python: str = "") -> tuple[Tag, ...]:
    """The tags a wheel may carry to install into this interpreter, most specific first
    (packaging's sys_tags); with machine (e.g. "aarch64"), those tags for that machine instead;
    with python ("3.14"), those of CPython X.Y on this machine."""
    if python and python != "{}.{}".format(*sys.version_info[:2]):
        version = tuple(int(p) for p in python.split("."))
        here = (*cpython_tags(python_version=version), *compatible_tags(python_version=version))
    else:
        here = tuple(sys_tags())
    host = platform.machine()
    if not machine or machine == host:
        return here
    return tuple(
        Tag(t.interpreter, t.abi, t.platform[: -len(host)] + machine) if t.platform.endswith(f"_{host}") else t
        for t in here
    )


def _some(values: Iterable[str], shown: int = 3) -> str:
    """A short, ordered listing: the first few values and how many more there are."""
    unique = list(dict.fromkeys(values))
    more = f" and {len(unique) - shown} more" if len(unique) > shown else ""
    return ", ".join(unique[:shown]) + more


def _tag_row(name: str, wheel: Collection[str], here: list[str]) -> Check:
    """One part of the wheel's tags (python, abi or platform) against what this interpreter takes."""
    ok = any(v in here for v in wheel)
    return Check(name, "pass" if ok else "fail", f"{'.'.join(sorted(wheel))} (this interpreter takes {_some(here)})")


def _version_row(version: Version, expect_version: str) -> Check:
    try:
        ok = version == Version(expect_version)
    except InvalidVersion:
        ok = False
    return Check("version", "pass" if ok else "fail", f"{version} (expected {expect_version})")


def tag_checks(wheel_name: str, expect_version: str, supported: Sequence[Tag] | None = None) -> list[Check]:
    """The wheel's version against the profile, and its python, abi and platform tags against the
    tags this interpreter installs (`supported`, default supported_tags()): a wheel installs here
    iff one of its tags is supported, so the rows pass iff it does."""
    _, version, _, wheel_tags = parse_wheel_filename(wheel_name)
    here = supported if supported is not None else supported_tags()
    checks = [_version_row(version, expect_version)] if expect_version else []
    checks += [
        _tag_row("python tag", {t.interpreter for t in wheel_tags}, [t.interpreter for t in here]),
        _tag_row("abi tag", {t.abi for t in wheel_tags}, [t.abi for t in here]),
        _tag_row("platform tag", {t.platform for t in wheel_tags}, [t.platform for t in here]),
    ]
    if all(c.status == "pass" for c in checks[-3:]) and not wheel_tags & set(here):
        wanted = ", ".join(sorted(map(str, wheel_tags)))
        checks.append(Check("tag combination", "fail", f"{wanted}: each part is supported here, no combination is"))
    return checks


_SITE_DIRS = (
    "import os, sys; "
    "print('\\n'.join(p for p in sys.path if p.endswith(('site-packages', 'dist-packages')) and os.path.isdir(p)))"
)


def _site_paths(python: str = sys.executable) -> list[str]:
    """The interpreter's package directories, as its sys.path has them: the fresh venv sees
    them for dependencies only. Those of a base that is itself a venv with the system's
    packages (python_system_site_packages: Debian's numpy, pytest, expecttest) included: the
    verify venv's torch then runs PyTorch's own tests with them, as the build's interpreter would."""
    out = run_captured([python, "-c", _SITE_DIRS], timeout=QUERY_TIMEOUT).checked()
    return list(dict.fromkeys(line for line in out.splitlines() if line))


def torch_expectations(spec: BuildSpec, version: str) -> dict[str, Any]:
    """What probe.py's torch checks compare against: the profile's build configuration."""
    return {
        "version": version,
        "distributed": bool(spec.distributed),
        "gloo": "gloo" in spec.distributed,
        "mpi": "mpi" in spec.distributed,
        "nccl": "nccl" in spec.distributed,
        "cuda_version": spec.cuda_version,
        "cuda_arch_list": list(spec.cuda_arch_list),
        "blas": {"openblas": "OpenBLAS", "mkl": "MKL", "generic": "", "eigen": "Eigen"}.get(spec.blas, spec.blas),
    }


def _probe(python: str, name: str, spec: BuildSpec, version: str) -> list[Check]:
    """probe.py in `python`, by path; its checks from the JSON on its last line of stdout."""
    if name == "torch":
        args = [python, str(PROBE), "torch", json.dumps(torch_expectations(spec, version))]
    else:
        args = [python, str(PROBE), "package", name, version]
    proc = run_captured(args, cwd=tempfile.gettempdir())
    lines = proc.stdout.strip().splitlines()
    try:
        return [Check(**c) for c in json.loads(lines[-1])]
    except (IndexError, ValueError, TypeError):
        return [Check(f"probe {name}", "fail", (proc.stdout + proc.stderr).strip()[-500:])]


def _fresh_venv(root: Path, base: str = sys.executable) -> str:
    """A venv of `base` without pip under root that sees base's packages (for dependencies
    only); returns its python. CalledProcessError or OSError when it cannot be made."""
    venv = root / "venv"
    run_captured([base, "-m", "venv", "--without-pip", str(venv)]).checked()
    python = str(venv / "bin" / "python")
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = run_captured([python, "-c", code], timeout=QUERY_TIMEOUT).checked().strip()
    Path(purelib, "torchbuild-deps.pth").write_text("\n".join(_site_paths(base)) + "\n")
    return python


def _install(wheel: Path, root: Path, base: str = sys.executable) -> tuple[str, str]:
    """Install the wheel alone into a fresh venv of base under root: (its python, "") or ("", why not)."""
    try:
        python = _fresh_venv(root, base)
        # pip reads a requirement, not a path: "; " starts an environment marker, so a wheel
        # under a directory named "a; b" would not install. A link with a plain name would.
        plain = root / "wheel" / wheel.name
        plain.parent.mkdir()
        plain.symlink_to(wheel.absolute())
        # a site's pip constraint (torch==<the site's>) would refuse the wheel: pin it instead
        name, version, _, _ = parse_wheel_filename(wheel.name)
        env = {**os.environ}
        env.update(pipenv.keep_built(root / "constraints.txt", {name: str(version)}, sys.executable, env))
        proc = run_captured(
            [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", "--", str(plain)],
            env=env,
        )  # fmt: skip
    except subprocess.CalledProcessError as exc:
        return "", f"no fresh venv: {exc.stderr or exc}"
    except (OSError, TorchbuildError, subprocess.TimeoutExpired) as exc:  # TimeoutExpired: a query past its deadline
        return "", f"no fresh venv: {exc}"
    return (python, "") if proc.returncode == 0 else ("", proc.stderr)


def comms_checks(torch_lib: Path | None, comms: Mapping[str, Any]) -> list[Check]:
    """Without a GPU: the plugin `invoke comms` built loads and exports the ncclNetPlugin_v*
    symbols NCCL looks up, `ldd` resolves its libfabric and CUDA dependencies, and torch's
    libtorch_cuda loads the NCCL built there (its path, and ncclGetVersion of that library)."""
    from torchbuild.runtime.environment import comms_runtime_env
    from torchbuild.runtime.libraries import nccl_version_of, plugin_symbols_in, unresolved

    if comms.get("error"):
        return [Check("NCCL and plugin of `invoke comms`", "fail", comms["error"])]
    prefix, m = Path(comms["prefix"]), comms["manifest"]
    # lib/ and the site dependencies the plugin carries (deps/lib), as a job's runtime env has them
    ours = comms_runtime_env(str(prefix), m)["LD_LIBRARY_PATH"]
    lib_env = {**os.environ, "LD_LIBRARY_PATH": ":".join(filter(None, [ours, os.environ.get("LD_LIBRARY_PATH")]))}
    checks = []
    if m.get("plugin"):
        plugin = prefix / m["plugin"]["library"]
        missing = unresolved(plugin, lib_env) if plugin.exists() else [str(plugin)]
        checks.append(
            Check("nccl plugin: ldd resolves its libraries", "fail" if missing else "pass",
                  f"missing: {', '.join(missing)}" if missing else f"{plugin.name} against libfabric {m['plugin']['libfabric_version']}")
        )  # fmt: skip
        try:
            symbols = plugin_symbols_in(plugin, lib_env)
        except (OSError, CommsFailed) as exc:
            checks.append(Check("nccl plugin: loads, exports ncclNetPlugin_v*", "fail", str(exc)[-300:]))
        else:
            checks.append(
                Check("nccl plugin: loads, exports ncclNetPlugin_v*", "pass" if symbols else "fail",
                      ", ".join(symbols) or f"{plugin.name} exports no ncclNetPlugin_v* symbol")
            )  # fmt: skip
    if m.get("nccl"):
        checks.append(_linked_nccl(torch_lib, prefix, m["nccl"], nccl_version_of))
    return checks


def _linked_nccl(torch_lib: Path | None, prefix: Path, nccl: Mapping[str, Any], version_of: Any) -> Check:
    name = "torch links the NCCL comms built"
    cuda_libs = sorted(torch_lib.glob("libtorch_cuda*.so")) if torch_lib else []
    if not cuda_libs:
        return Check(name, "fail", f"no libtorch_cuda*.so in {torch_lib}: not a CUDA build")
    proc = run_captured(["ldd", str(cuda_libs[0])], timeout=QUERY_TIMEOUT)
    if re.search(r"libnccl\.so\.2 => not found", proc.stdout):
        return Check(
            name, "fail", f"{cuda_libs[0].name} needs libnccl.so.2: not found (no rpath or LD_LIBRARY_PATH leads to it)"
        )
    found = re.search(r"libnccl\.so\.2 => (\S+)", proc.stdout)
    if not found:
        return Check(name, "fail", f"{cuda_libs[0].name} does not load libnccl.so.2 (static or bundled NCCL)")
    loaded = Path(found[1]).resolve()
    if loaded.parent != (prefix / "lib").resolve():
        return Check(name, "fail", f"{cuda_libs[0].name} loads {loaded}, not the NCCL in {prefix}/lib")
    code = version_of(loaded)
    ok = code == nccl["version_code"]
    return Check(name, "pass" if ok else "fail", f"{loaded} (ncclGetVersion {code}, built {nccl['version']})")


def _torch_lib(site: Path) -> Path | None:
    found = sorted(site.glob("lib/python*/site-packages/torch/lib"))
    return found[0] if found else None


def verify_wheel(
    wheel: Path,
    spec: BuildSpec,
    expect_version: str,
    comms: Mapping[str, Any] | None = None,
    python: str = "",
    tests_dir: str = "",
    results: dict[str, Any] | None = None,
) -> list[Check]:
    """Tags, then install into a fresh venv (dependencies from this interpreter) and probe;
    with comms, the NCCL and plugin checks (comms_checks) against the venv's torch; with
    tests_dir (the source's test/), the profile's subset of PyTorch's own tests, whose counts go
    into results["tests"]. WheelError (or PathError) first when the file is not a readable wheel."""
    check_wheel_file(wheel)
    base = interpreter(python)
    checks = tag_checks(wheel.name, expect_version, supported_tags(python=python) if python else None)
    checks.append(floor_check(wheel, spec, results if results is not None else {}))
    name = parse_wheel_filename(wheel.name)[0].replace("-", "_")  # the import name, by convention
    with named_os_errors(tempfile.gettempdir(), "verify: a folder for the fresh venv"):
        root = Path(tempfile.mkdtemp(prefix="torchbuild-verify-"))
    try:
        venv_python, error = _install(wheel, root, base)
        if error:
            return [*checks, Check("install into a fresh venv", "fail", error.strip()[-500:])]
        checks.append(Check("install into a fresh venv", "pass", f"{wheel.name} (Python of {base})"))
        checks += _probe(venv_python, name, spec, expect_version)
        if comms:
            checks += comms_checks(_torch_lib(root / "venv"), comms)
        if tests_dir:
            checks += _upstream(venv_python, Path(tests_dir), spec, results if results is not None else {})
        return checks
    finally:
        shutil.rmtree(root, ignore_errors=True)


def floor_check(wheel: Path, spec: BuildSpec, results: dict[str, Any]) -> Check:
    """The wheel's ELF floor (its manifest's where that is of this wheel, else measured now with
    auditwheel: elffloor.recorded_or_measured) against the profile's glibc_floor and
    libstdcxx_floor: a fail names what is above; the floor goes into results."""
    from torchbuild.core import records
    from torchbuild.runtime import elffloor

    floored = bool(spec.glibc_floor or spec.libstdcxx_floor)
    try:
        floor = elffloor.recorded_or_measured(wheel)
    except Exception as exc:  # auditwheel missing, a damaged wheel, an ELF file it cannot read: said in the row
        why = exc.message if isinstance(exc, TorchbuildError) else f"{type(exc).__name__}: {exc}"
        return Check("ELF floor", "fail" if floored else "skip", f"not measured: {why}")
    floor = dataclasses.replace(floor, tag=".".join(elffloor.platform_tags(wheel.name)))
    results["floor"] = records.to_dict(floor)
    above = elffloor.problems(floor, spec.glibc_floor, spec.libstdcxx_floor)
    wanted = " and ".join(
        f"{k} {v}" for k, v in (("glibc_floor", spec.glibc_floor), ("libstdcxx_floor", spec.libstdcxx_floor)) if v
    )
    if above:
        return Check("ELF floor", "fail", f"{'; '.join(above)} ({floor.summary()})")
    return Check("ELF floor", "pass", floor.summary() + (f" (within {wanted})" if wanted else ""))


def _upstream(python: str, tests_dir: Path, spec: BuildSpec, results: dict[str, Any]) -> list[Check]:
    """PyTorch's own tests (upstream_tests.py): one check, pass within the failure budget."""
    outcome = upstream_tests.run(python, tests_dir, spec, platform.machine())
    if outcome is None:
        return []
    results["tests"] = outcome.to_dict()
    budget = spec.verify_tests_max_failures
    status = "skip" if outcome.note and not outcome.timed_out else ("pass" if outcome.ok(budget) else "fail")
    return [Check("PyTorch's own tests", status, outcome.detail(budget))]


def verify_installed(name: str, spec: BuildSpec, expect_version: str) -> list[Check]:
    """The package already installed for this interpreter (e.g. a distribution's torch)."""
    return _probe(sys.executable, name, spec, expect_version)


def render(checks: list[Check]) -> str:
    """The checks as a table, then `N passed, N failed, N skipped` alone on the last line."""
    rows = [(c.status.upper(), c.name, c.detail) for c in checks]
    failed = sum(c.status == "fail" for c in checks)
    skipped = sum(c.status == "skip" for c in checks)
    summary = f"{len(checks) - failed - skipped} passed, {failed} failed, {skipped} skipped"
    return console.table(["status", "check", "detail"], rows) + "\n" + summary


def report(checks: list[Check], subject: str) -> dict[str, Any]:
    return {
        "subject": subject,
        "ok": not any(c.status == "fail" for c in checks),
        "checks": [c.to_dict() for c in checks],
        "python": sys.version.split()[0],
        "machine": platform.machine(),
    }


@dataclasses.dataclass(frozen=True)
class Request:
    """The verify step's request: a wheel (its path as the step sees it) or an installed
    package, the profile it was built from, and where the JSON report goes ("" for none)."""

    spec: BuildSpec
    expect_version: str = ""
    installed: str = ""  # a package already installed for the step's interpreter
    wheel: str = ""
    report: str = ""
    python: str = ""  # the interpreter the fresh venv is made of ("" for the step's own)
    comms: Optional[dict[str, Any]] = None  # host.comms_for_verify: the NCCL the wheel was built with
    tests_dir: str = ""  # the source's test/ as the step sees it: PyTorch's own tests (verify_tests)


def request(
    spec: BuildSpec,
    *,
    wheel: Path | None,
    installed: str,
    expect_version: str,
    report: Path | None,
    python: str = "",
    comms: Mapping[str, Any] | None = None,
    tests_dir: str = "",
) -> Request:
    """A verify request; the report is <wheel>.verify.json unless given."""
    if report is None and wheel is not None:
        report = Path(f"{wheel}.verify.json")
    return Request(
        spec=spec,
        expect_version=expect_version or spec.build_version,
        installed=installed,
        wheel=str(wheel) if wheel is not None else "",
        report=str(report) if report is not None else "",
        python=python,
        comms=dict(comms) if comms is not None else None,
        tests_dir=tests_dir,
    )


def run_request(req: Request) -> int:
    """Run a verify request here: checks, table, JSON report; VerifyFailed on any failure."""
    from torchbuild.core.errors import VerifyFailed

    if not (req.wheel or req.installed):
        raise UsageError(
            "the verify request names neither a wheel nor a package",
            hint="write requests with verify.request(); `invoke verify` does",
        )
    results: dict[str, Any] = {}
    if req.installed:
        subject = f"installed {req.installed}"
        checks = verify_installed(req.installed, req.spec, req.expect_version)
    else:
        subject = Path(req.wheel).name
        checks = verify_wheel(
            Path(req.wheel), req.spec, req.expect_version, req.comms, req.python, req.tests_dir, results
        )
    data = {**report(checks, subject), **results}
    if req.python:
        data["python"] = req.python
    print(f"verify {subject} ({data['machine']}, Python {data['python']}):")
    print(render(checks))
    if req.report:
        write_json(Path(req.report), data, "verify report")
        print(f"report: {req.report}")
    if not data["ok"]:
        failed = ", ".join(c.name for c in checks if c.status == "fail")
        raise VerifyFailed(f"{subject}: {failed}")
    return 0
