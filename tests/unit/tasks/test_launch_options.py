"""The command line of the launch path: one set of options for `invoke` and `torchbuild`, and
every option a build cannot take refused by name before anything runs (no engine needed)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO, run_invoke


def _options(*cmd: str) -> set[str]:
    res = subprocess.run([*cmd, "--help", "build"], capture_output=True, text=True, cwd=REPO, check=True)
    return set(re.findall(r"--[a-z][a-z-]*", res.stdout))


def test_torchbuild_and_invoke_take_the_same_build_options():
    """What `apptainer run torch-build.sif build ...` (the torchbuild script) accepts is what
    `invoke build` accepts on the host: one definition of the command line."""
    invoke_opts = _options(sys.executable, "-m", "invoke")
    torchbuild_opts = _options(sys.executable, "-m", "torchbuild.cli")
    assert {"--no-retry", "--jobs", "--in-container", "--preflight", "--no-verify"} <= invoke_opts
    assert torchbuild_opts == invoke_opts


LAUNCH_TASKS = ["build", "verify", "install", "mpi-check"]


def _short_flags(task: str) -> dict[str, str]:
    """--long -> -x, as `invoke --help TASK` lists them."""
    res = subprocess.run([sys.executable, "-m", "invoke", "--help", task], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    return {long: short for short, long in re.findall(r"^  (-\S)(?: STRING)?, (--[a-z-]+)", res.stdout, re.M)}


@pytest.mark.parametrize("task", LAUNCH_TASKS)
def test_every_launching_task_takes_the_launch_options_with_the_same_short_flags(task):
    """`-s` is --set and `-p` --profile in every task: a short flag that means --source in one
    task and --set in another would turn `-s key=value` into a source path."""
    flags = _short_flags(task)
    assert {k: flags.get(k) for k in BUILD_LAUNCH_FLAGS} == BUILD_LAUNCH_FLAGS
    assert "--user" in _options_of(task)
    assert "--" not in flags.values()  # invoke would take "-" for --no-retry, making `--` an option


# build's short flags before the launch options were shared; scripts may use them
BUILD_LAUNCH_FLAGS = {
    "--profile": "-p", "--arch": "-a", "--set": "-s", "--in-container": "-i", "--engine": "-e", "--sif": "-f",
    "--apptainer": "-t", "--nv": "-n", "--memory": "-m", "--rebuild-image": "-b",
}  # fmt: skip


def test_builds_own_short_flags_did_not_move():
    flags = _short_flags("build")
    assert {k: flags[k] for k in ("--source", "--ref", "--out", "--preflight", "--target", "--canary", "--jobs")} == {
        "--source": "-o", "--ref": "-r", "--out": "-u", "--preflight": "-l", "--target": "-g", "--canary": "-c",
        "--jobs": "-j",
    }  # fmt: skip


def _options_of(task: str) -> set[str]:
    res = subprocess.run([sys.executable, "-m", "invoke", "--help", task], capture_output=True, text=True, cwd=REPO)
    return set(re.findall(r"--[a-z][a-z-]*", res.stdout))


def test_a_task_gets_the_launch_options_as_keywords(tmp_path):
    """Each --set reaches the profile through the shared option set, the first one too."""
    res = run_invoke(
        "mpi-check", "--profile", "cpu", "--set", "mpi=bogus", "--set", "python_version=3.12", "--out", str(tmp_path)
    )
    assert res.returncode == 2 and "ProfileError" in res.stderr and "bogus" in res.stderr, res.stderr


BAD_OPTIONS = [
    ("jobs zero", ["--jobs", "0"], "--jobs"),
    ("jobs negative", ["--jobs", "-2"], "--jobs"),
    ("jobs not a number", ["--jobs", "many"], "--jobs"),
    ("jobs a float", ["--jobs", "1.5"], "--jobs"),
    ("memory natively", ["--memory", "4g"], "--memory"),
    ("user natively", ["--user", "1000:1000"], "--user"),
    ("sif natively", ["--sif", "x.sif"], "--sif"),
    ("nv natively", ["--nv"], "--nv"),
    ("engine native in a container", ["--in-container", "--engine", "native"], "--engine native"),
    ("unknown engine", ["--in-container", "--engine", "podman"], "podman"),
    ("unknown engine alone", ["--engine", "podman"], "podman"),
    ("sif with docker", ["--engine", "docker", "--sif", "x.sif"], "--sif"),
    ("apptainer choice natively", ["--apptainer", "host"], "--apptainer"),
    ("user with apptainer", ["--in-container", "--engine", "apptainer", "--user", "1:1"], "--user"),
    ("nv with docker", ["--in-container", "--nv"], "--nv"),
    ("unknown progress", ["--progress", "fancy"], "--progress"),
]


@pytest.mark.parametrize(("case", "args", "named"), BAD_OPTIONS, ids=[c[0] for c in BAD_OPTIONS])
def test_a_bad_build_option_is_a_usage_error_naming_it(tmp_path, case, args, named):
    res = run_invoke("build", "--source", str(tmp_path), "--out", str(tmp_path / "out"), *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "UsageError" in res.stderr and named in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


def test_ref_with_a_local_tree_is_refused(tmp_path):
    (tmp_path / "setup.py").write_text("")
    res = run_invoke("build", "--source", str(tmp_path), "--ref", "v2.6.0", "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "--ref" in res.stderr, res.stdout + res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


BAD_PATHS = [
    ("out is a file", lambda t: ["--out", str(t / "file")], "PathError", 15, "not a directory"),
    ("out under a file", lambda t: ["--out", str(t / "file" / "out")], "PathError", 15, "not a directory"),
    ("out name too long", lambda t: ["--out", str(t / ("x" * 300))], "PathError", 15, "too long"),
    ("cache_dir is a file", lambda t: ["--set", f"cache_dir={t / 'file'}"], "PathError", 15, "cache_dir"),
    ("cache_dir name too long", lambda t: ["--set", f"cache_dir={t / ('c' * 300)}"], "PathError", 15, "too long"),
]


@pytest.mark.parametrize(("case", "args", "error", "code", "words"), BAD_PATHS, ids=[c[0] for c in BAD_PATHS])
def test_an_unusable_output_or_cache_path_is_named(tmp_path, case, args, error, code, words):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    (tmp_path / "file").write_text("a file, not a directory\n")
    sets = ["--set", "patches=none"]
    if not any(a.startswith("cache_dir=") for a in args(tmp_path)):
        sets += ["--set", f"cache_dir={tmp_path / 'cache'}"]
    res = run_invoke("build", "--source", str(tree), *sets, *args(tmp_path))
    assert res.returncode == code, res.stdout + res.stderr
    assert error in res.stderr and words in res.stderr and "Traceback" not in res.stderr
    assert (tmp_path / "file").read_text() == "a file, not a directory\n"


def test_the_profile_choice_is_declared_once_and_leads_the_launch_options():
    """--profile, --arch and --set are ProfileChoice's fields (runtime/options.py): LaunchOptions
    inherits them as its first three, so build's short flags stay, and the tasks that only resolve
    the profile (config, source, patches without --arch) take them with the same help."""
    from torchbuild.core.options import flags
    from torchbuild.runtime.options import LaunchOptions, ProfileChoice
    from torchbuild.tasks import ns

    choice = flags(ProfileChoice)
    assert [f.name for f in choice] == ["profile", "arch", "set_"]
    assert flags(LaunchOptions)[:3] == choice
    helps = {f.name: f.help for f in choice}
    for task, names in {"config": choice, "source": choice, "patches": choice[::2]}.items():
        args = {a.name: a for a in ns[task].get_arguments()}
        assert {n.name: args[n.name].help for n in names} == {n.name: helps[n.name] for n in names}, task
        assert ("arch" in args) == (task != "patches")
