"""The words of every task's command line (runtime/tasks.py's TorchbuildTask and TaskArgument):
`--help` and `-h` print the task's help wherever they stand and nothing runs; no positional or
option takes a value starting with '-' (but the options whose values are another program's
options); no task has a short flag `-`, `--` or `-h`, nor one short flag twice.

Both programs are run in-process with their executor replaced by a recorder, so a task that
would run is seen (and does nothing) instead of making ./--help; two real `invoke` subprocesses
repeat the reported cases."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO
from invoke.main import program as invoke_program
from invoke.program import Program

from torchbuild import cli
from torchbuild.runtime.tasks import OPTION_VALUES, RESERVED_SHORT, TorchbuildTask
from torchbuild.tasks import ns

TASKS = sorted(ns.task_names)
HELP_WORDS = ["--help", "-h"]


def _arguments(task: str):
    return ns[task].get_arguments()


def _value_flags(task: str) -> list[str]:
    """The long flag of every option of task that takes a value (str or list)."""
    return ["--" + a.names[0] for a in _arguments(task) if a.takes_value and not a.positional]


def _positionals(task: str) -> list[str]:
    return [a.names[0] for a in _arguments(task) if a.positional]


@pytest.fixture
def ran(monkeypatch):
    """The task contexts a program went on to execute (none, if it stopped at parsing)."""
    executed: list[list[str]] = []
    monkeypatch.setattr(Program, "execute", lambda self: executed.append([t.name for t in self.tasks]))
    return executed


def _run(which: str, args: list[str]) -> int:
    """Run `invoke ARGS` (the real invoke program, loading tasks.py) or `torchbuild ARGS` in-process."""
    if which == "torchbuild":
        return cli.main(args)
    try:
        invoke_program.run(["invoke", "--search-root", str(REPO), *args], exit=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


PROGRAMS = ["invoke", "torchbuild"]


@pytest.mark.parametrize("word", HELP_WORDS)
@pytest.mark.parametrize("which", PROGRAMS)
@pytest.mark.parametrize("task", TASKS)
def test_help_prints_the_tasks_help_and_runs_nothing_wherever_it_stands(
    tmp_path, monkeypatch, capsys, ran, task, which, word
):
    """`TASK --help`, `TASK --OPTION --help` for each option that takes a value, and (for a task
    with positionals) `TASK POS... --help`: each prints TASK's help, exits 0, runs no task and
    creates nothing in the working directory (`invoke wheelhouse --help` made ./--help)."""
    monkeypatch.chdir(tmp_path)
    positionals = _positionals(task)
    lines = [[task, word]]
    if (which, word) in (("invoke", "--help"), ("torchbuild", "-h")):  # the rest once per word (time)
        lines += [[task, flag, word] for flag in _value_flags(task)]
        lines += [[task, *positionals[:n], word] for n in range(1, len(positionals))]
        lines += [[task, word, _value_flags(task)[0], "x"]] if _value_flags(task) else []
    for line in lines:
        code = _run(which, line)
        shown = capsys.readouterr()
        assert code == 0, (line, shown.out, shown.err)
        assert shown.out.startswith("Usage: ") and f" {task} " in shown.out.splitlines()[0], (line, shown.out)
        assert "Options:" in shown.out, line
        assert ran == [], (line, ran)
        assert os.listdir(tmp_path) == [], (line, os.listdir(tmp_path))


# words no task defines as a flag, that git, tar or pip would read as an option
DASHED = ["-Z", "--upload-pack=touch PWNED"]


@pytest.mark.parametrize(("which", "value"), list(zip(PROGRAMS, DASHED)))
@pytest.mark.parametrize("task", TASKS)
def test_no_value_of_a_task_starts_with_a_dash(tmp_path, monkeypatch, capsys, ran, task, which, value):
    """`TASK --OPTION -Z` and `TASK -Z` (a positional) are UsageErrors naming the option: a
    positional or value never takes a word that starts with '-', and the task does not run.
    The options whose values are another program's options take them (OPTION_VALUES)."""
    monkeypatch.chdir(tmp_path)
    lines = [[task, flag, value] for flag in _value_flags(task) if flag[2:].replace("-", "_") not in OPTION_VALUES]
    lines += [[task, value]] if _positionals(task) else []
    for line in lines:
        code = _run(which, line)
        shown = capsys.readouterr()
        assert code == 2, (line, shown.out, shown.err)
        named = line[1] if len(line) == 3 else "--" + _positionals(task)[0]
        # a positional sees `--upload-pack` alone: invoke splits --x=y where no option waits for a value
        assert f"error: UsageError: {named} '{value.split('=')[0]}" in shown.err, (line, shown.err)
        assert "starts with '-'" in shown.err
        assert shown.err.count("\nhint: ") == 1 and "Traceback" not in shown.err
        assert ran == [], (line, ran)
        assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("task", "flag", "value"),
    [
        ("submit", "--directive", "--exclusive"),
        ("image", "--apt-option", "-o Acquire::Retries=3"),
        ("bench", "--args", "-d cpu"),
    ],
)
def test_an_option_whose_values_are_options_takes_them(tmp_path, monkeypatch, capsys, ran, task, flag, value):
    monkeypatch.chdir(tmp_path)
    assert _run("invoke", [task, flag, value]) == 0, capsys.readouterr()
    assert ran == [[task]]


def test_every_task_is_a_torchbuild_task():
    """The guard lives in TorchbuildTask: a task made by invoke's own @task would not have it."""
    for task in TASKS:
        assert isinstance(ns[task], TorchbuildTask), task


@pytest.mark.parametrize("task", TASKS)
def test_no_task_has_a_short_flag_that_is_reserved_or_taken_twice(task):
    """No flag is `-` or `--` (invoke picked '-' for --gpu-type: `--` became an option), none is
    `-h` (that is --help: `invoke submit -h` submitted a preflight job), and no short flag names
    two options of one task."""
    shorts: list[str] = []
    for arg in _arguments(task):
        assert arg.names[0] not in ("", "-"), arg
        shorts += [n for n in arg.names[1:]]
        assert not set(arg.names[1:]) & RESERVED_SHORT, (task, arg.names)
        assert all(len(n) == 1 and n.isalnum() for n in arg.names[1:]), (task, arg.names)
    assert len(shorts) == len(set(shorts)), (task, sorted(shorts))


@pytest.mark.parametrize("which", PROGRAMS)
def test_the_help_of_a_task_keeps_its_option_texts(capsys, which):
    """invoke pops each option's help text as it builds the parser: printing a task's help a
    second time in one process still shows them."""
    for _ in range(2):
        assert _run(which, ["wheelhouse", "--help"]) == 0
        assert "the wheelhouse directory (created if missing" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["wheelhouse", "--help"], ["install", "-h"], ["submit", "-h"]])
def test_invoke_help_as_a_user_types_it_makes_nothing(tmp_path, args):
    """The reported cases, with the real `invoke` in a fresh directory holding tasks.py's copy."""
    (tmp_path / "tasks.py").write_text((REPO / "tasks.py").read_text())
    res = subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("Usage: inv[oke] [--core-opts] " + args[0])
    assert sorted(os.listdir(tmp_path)) in (["tasks.py"], ["__pycache__", "tasks.py"])
