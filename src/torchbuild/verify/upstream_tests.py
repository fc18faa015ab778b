"""PyTorch's own tests against the wheel just installed, as EasyBuild runs them: a bounded
subset of the source's test/ (profile keys verify_tests, verify_tests_timeout_s,
verify_tests_max_failures, verify_tests_skip), run with pytest from the test/ directory (so the
installed torch is imported, never the source tree's), its results read from pytest's JUnit XML.

The time bound is a whole-run bound: at it, pytest gets SIGINT and writes the results of what
ran (a KeyboardInterrupt ends its session cleanly), then SIGKILL after a grace. pytest-timeout
bounds single tests only, and xdist is not in every image, so neither is used. That SIGINT is
why pytest is started here with subprocess, not through core/process.py, whose groups get SIGTERM.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchbuild.core.safeio import MiB, read_bytes

GRACE_S = 60
JUNIT_LIMIT = 256 * MiB
SHOWN_FAILURES = 20


@dataclasses.dataclass(frozen=True)
class Outcome:
    passed: int
    failed: int  # failures and errors
    skipped: int
    seconds: float
    timed_out: bool
    selected: tuple[str, ...]
    deselected: tuple[str, ...]
    failures: tuple[str, ...]  # the first SHOWN_FAILURES test ids that failed
    note: str = ""  # why nothing ran (no test/ directory, no pytest), else ""

    def ok(self, budget: int) -> bool:
        return not self.note and not self.timed_out and self.failed <= budget and self.passed > 0

    def detail(self, budget: int) -> str:
        if self.note:
            return self.note
        text = f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped in {self.seconds:.0f} s"
        text += f" ({', '.join(self.selected)}; failure budget {budget})"
        if self.timed_out:
            text += ": stopped at the time bound"
        if self.failures:
            text += "; failed: " + ", ".join(self.failures[:5])
        return text

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def selection(tests_dir: Path, wanted: Sequence[str]) -> tuple[list[str], list[str]]:
    """The wanted node ids whose file is in tests_dir, and those whose file is not."""
    present: list[str] = []
    missing: list[str] = []
    for node in wanted:
        (present if (tests_dir / node.split("::", 1)[0]).is_file() else missing).append(node)
    return present, missing


def command(python: str, tests_dir: Path, tmp: Path, selected: Sequence[str], deselected: Sequence[str]) -> list[str]:
    """pytest with test/ as its root (node ids as the profile writes them: test_torch.py::...) and
    an empty configuration: the source's own pytest.ini sets its CI's options (addopts, plugins)."""
    ini = tmp / "pytest.ini"
    ini.write_text("[pytest]\n")
    args = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini), f"--rootdir={tests_dir}"]
    args.append(f"--junitxml={tmp / 'junit.xml'}")
    args += [f"--deselect={node}" for node in deselected]
    return [*args, "--", *selected]


def read_junit(path: Path) -> tuple[int, int, int, list[str]]:
    """(passed, failed, skipped, failed test ids) from pytest's JUnit XML."""
    root = ET.fromstring(read_bytes(path, JUNIT_LIMIT, "reading the tests' results"))
    passed = failed = skipped = 0
    failures: list[str] = []
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
            if len(failures) < SHOWN_FAILURES:
                failures.append(f"{case.get('classname', '')}::{case.get('name', '')}")
        elif "skipped" in kinds:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def _run_bounded(args: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> tuple[bool, str]:
    """Run args in its own group; at the bound SIGINT (pytest reports what ran), then SIGKILL."""
    proc = subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return False, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return True, out


def run(python: str, tests_dir: Path, spec: Any, machine: str) -> Outcome | None:
    """The profile's subset of tests_dir against `python`'s torch; None when the profile asks for
    none or the source has no test/ at all (not PyTorch's tree: a companion's, a fixture's). An
    Outcome with a note when nothing could run (none of the tests in test/, no pytest)."""
    wanted = tuple(spec.verify_tests)
    if not wanted or not tests_dir.is_dir():
        return None
    deselected = tuple(dict(spec.verify_tests_skip).get(machine, "").split())
    present, _ = selection(tests_dir, wanted)
    if not present:
        note = f"none of {', '.join(wanted)} is in {tests_dir}: the source has no such tests"
        return Outcome(0, 0, 0, 0.0, False, wanted, deselected, (), note=note)
    with tempfile.TemporaryDirectory(prefix="torchbuild-tests-") as tmp:
        junit = Path(tmp) / "junit.xml"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": tmp}
        t0 = time.monotonic()
        timed_out, output = _run_bounded(
            command(python, tests_dir, Path(tmp), present, deselected), tests_dir, spec.verify_tests_timeout_s, env
        )
        seconds = time.monotonic() - t0
        if not junit.is_file():
            note = "pytest wrote no results: " + " ".join(output.split()[-40:])
            return Outcome(0, 0, 0, seconds, timed_out, tuple(present), deselected, (), note=note)
        passed, failed, skipped, failures = read_junit(junit)
    return Outcome(passed, failed, skipped, round(seconds, 1), timed_out, tuple(present), deselected, tuple(failures))
