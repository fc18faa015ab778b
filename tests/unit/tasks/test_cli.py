"""The command lines a user types, run as subprocesses (no engine needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from helpers import FIXTURES, REPO, TEST_TORCH, run_invoke

from torchbuild import __version__
from torchbuild.tasks import ns


def test_invoke_list_shows_every_task_with_help():
    res = run_invoke("--list")
    assert res.returncode == 0, res.stderr
    listed = dict(re.findall(r"^  (\S+)\s+(\S.*)$", res.stdout, re.M))
    assert set(listed) == set(ns.task_names), listed
    assert all(len(help_) > 10 for help_ in listed.values())


def test_config_gh200_shows_arch_list_and_flags():
    res = run_invoke("config", "--profile", "gh200", "--set", TEST_TORCH)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "TORCH_CUDA_ARCH_LIST=9.0" in lines
    assert "CXXFLAGS='-ffunction-sections -fdata-sections -flax-vector-conversions -Wno-nonnull'" in lines
    assert "USE_PRIORITIZED_TEXT_FOR_LD=1" in lines
    assert "PYTORCH_BUILD_VERSION=2.6.0+gh200" in lines


def test_config_json_is_machine_readable():
    res = run_invoke("config", "--profile", "cuda", "--format", "json", "--set", "max_jobs=7")
    data = json.loads(res.stdout)
    assert data["env"]["MAX_JOBS"] == "7"
    assert data["origins"]["max_jobs"] == "--set"
    assert data["values"]["cuda_arch_list"] == ["8.0", "9.0"]


def test_misspelled_key_exits_nonzero_with_file_and_suggestion():
    profile = FIXTURES / "profiles" / "typo.yaml"
    res = run_invoke("config", "--profile", str(profile))
    assert res.returncode == 2
    assert f"{profile}:3" in res.stderr
    assert "did you mean 'cuda_arch_list'" in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 2  # error line + hint line


def test_engine_unavailable_is_named_with_a_hint():
    res = run_invoke("image", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert res.returncode == 3
    assert "EngineUnavailable" in res.stderr and "/nonexistent/docker.sock" in res.stderr
    assert res.stderr.splitlines()[-1].startswith("hint: start the engine")
    assert "Traceback" not in res.stderr


def test_debug_shows_the_traceback():
    res = run_invoke("--debug", "config", "--profile", "nope")
    assert res.returncode != 0 and "Traceback" in res.stderr


def test_console_script_version_and_config():
    out = subprocess.run(
        [sys.executable, "-m", "torchbuild.cli", "--version"], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == f"torchbuild {__version__}"
    bad = subprocess.run(
        [sys.executable, "-m", "torchbuild.cli", "config", "--set", "arch=sparc"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "ProfileError" in bad.stderr


def test_patch_conflict_from_the_command_line_leaves_the_tree_as_it_was(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("print('hello')\n")
    series = tmp_path / "series"
    series.mkdir()
    (series / "01-bad.patch").write_text(
        "Does not match.\n\ndiff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n"
        "@@ -1 +1 @@\n-print('goodbye')\n+print('bye')\n"
    )
    before = {p.name: p.read_bytes() for p in tree.iterdir()}
    res = run_invoke("source", "--source", str(tree), "--set", f"patches={series}")
    assert res.returncode == 9, res.stdout + res.stderr
    assert "PatchConflict" in res.stderr and "01-bad.patch" in res.stderr and "setup.py:1" in res.stderr
    assert {p.name: p.read_bytes() for p in tree.iterdir()} == before
