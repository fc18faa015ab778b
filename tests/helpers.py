"""Shared test helpers (tests/ is on sys.path through pytest's pythonpath)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Suite of the local base images the integration tests build on (no registry here).
SUITE = os.environ.get("TORCHBUILD_TEST_SUITE", "trixie")
SUITE_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}[SUITE]
FIXTURES = REPO / "tests" / "fixtures"


def run_invoke(*args: str, env: dict[str, str] | None = None, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """Run `invoke ARGS` from the repository root the way a user does; capture both streams."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def set_args(overrides: list[str]) -> list[str]:
    """["k=v", ...] -> ["--set", "k=v", ...]"""
    return [arg for item in overrides for arg in ("--set", item)]


def manifest_of(stdout: str) -> dict:
    """The manifest named by the `manifest: PATH` line `invoke build` prints at the end."""
    import json

    line = next(ln for ln in stdout.splitlines() if ln.startswith("manifest: "))
    return json.loads(Path(line.split(": ", 1)[1]).read_text())


def image_ok(profile: str, sets: list[str], timeout: int = 3600) -> None:
    """`invoke image --profile PROFILE SETS`, which must succeed."""
    res = run_invoke("image", "--profile", profile, *sets, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr


def preflight_ok(profile: str, source: Path, out: Path, sets: list[str], *extra: str, timeout: int = 3600):
    """`invoke build --in-container --preflight ...`, which must succeed: (stdout, manifest)."""
    res = run_invoke(
        "build",
        "--in-container",
        "--preflight",
        "--profile",
        profile,
        "--source",
        str(source),
        "--out",
        str(out),
        *extra,
        *sets,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    return res.stdout, manifest_of(res.stdout)
