"""--engine has one meaning, checked in one place (issue 27 item 34): where the step runs,
native, docker (the toolchain image) or apptainer (the SIF), in build and the other launch
tasks, in config and in submit (where the job builds on its node). --in-container stays
short for --engine docker; the tasks differ only in their default (submit: apptainer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchbuild.batch.host import Runtime
from torchbuild.core.errors import UsageError
from torchbuild.profile.config import resolve
from torchbuild.runtime.backends import ENGINES, engine_for

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("engine", "in_container", "default", "runs"),
    [
        ("", False, "native", "native"),
        ("", True, "native", "docker"),
        ("docker", False, "native", "docker"),
        ("docker", True, "native", "docker"),
        ("apptainer", False, "native", "apptainer"),
        ("apptainer", True, "native", "apptainer"),
        ("native", False, "native", "native"),
        ("", False, "apptainer", "apptainer"),
        ("native", False, "apptainer", "native"),
    ],
)
def test_engine_values_mean_the_same_everywhere(engine, in_container, default, runs):
    assert engine_for(engine, in_container, default) == runs


# (the value, --in-container, the words the message must hold)
BAD_ENGINES = [
    ("podman", False, ["unknown --engine 'podman'"]),
    ("Docker", False, ["unknown --engine 'Docker'", "did you mean 'docker'"]),
    ("singularity", True, ["unknown --engine 'singularity'"]),
    ("native", True, ["--in-container and --engine native"]),
    ("-x", False, ["unknown --engine '-x'"]),
]


@pytest.mark.parametrize(("engine", "in_container", "words"), BAD_ENGINES, ids=[c[0] for c in BAD_ENGINES])
def test_a_bad_engine_is_one_usage_error(engine, in_container, words):
    with pytest.raises(UsageError) as exc:
        engine_for(engine, in_container)
    for word in words:
        assert word in exc.value.message
    if "unknown" in words[0]:
        assert all(e in exc.value.hint for e in ENGINES)


def test_submit_checks_engine_like_build(tmp_path):
    with pytest.raises(UsageError) as from_submit:
        Runtime("podman").args(resolve("cpu"))
    with pytest.raises(UsageError) as from_build:
        engine_for("podman")
    assert (from_submit.value.message, from_submit.value.hint) == (from_build.value.message, from_build.value.hint)


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, cwd=REPO)


def test_every_task_says_the_same_for_an_unknown_engine(tmp_path):
    lines = set()
    for args in (
        ["config", "--engine", "podman"],
        ["build", "--source", str(tmp_path), "--out", str(tmp_path / "out"), "--engine", "podman"],
        ["submit", "--source", str(tmp_path), "--out", str(tmp_path / "out"), "--engine", "podman", "--dry-run"],
    ):
        res = _invoke(*args)
        assert res.returncode == 2, (args, res.stderr)
        lines.add(res.stderr.strip())
    assert len(lines) == 1 and "UsageError: unknown --engine 'podman'" in lines.pop()
    assert not (tmp_path / "out").exists()


def test_config_engine_apptainer_needs_no_in_container(tmp_path):
    res = _invoke("config", "--engine", "apptainer", "--set", f"cache_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    assert "# environment the build sees on apptainer" in res.stdout
