"""What the command line says of words it cannot take (issue 41, items 8, 21 and 22): a value
an int or float option cannot be, an option left without its value (`--prefix -c`, a bare
`--set`), an unknown word. Each is `error: UsageError: ...`, one hint, exit 2, no traceback and
no internal names, from both programs (`invoke` loading tasks.py, and `torchbuild`); the task
never runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from invoke.exceptions import Exit
from invoke.main import program as invoke_program
from invoke.program import Program

from torchbuild import cli

PROGRAMS = ["invoke", "torchbuild"]


@pytest.fixture
def ran(monkeypatch):
    """The tasks a program went on to execute (none, if it stopped at parsing)."""
    executed: list[list[str]] = []
    monkeypatch.setattr(Program, "execute", lambda self: executed.append([t.name for t in self.tasks]))
    return executed


def _run(which: str, args: list[str]) -> int:
    if which == "torchbuild":
        return cli.main(args)
    try:
        invoke_program.run(["invoke", "--search-root", str(REPO), *args], exit=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def _one_usage_error(err: str) -> str:
    assert err.startswith("error: UsageError: "), err
    assert err.count("\nhint: ") == 1, err
    assert "Traceback" not in err and "Argument" not in err, err
    return err.splitlines()[0]


NUMBER_OPTIONS = [
    ("submit", "--nodes", "a whole number"),
    ("verify", "--nodes", "a whole number"),
    ("verify", "--tasks-per-node", "a whole number"),
    ("verify", "--timeout", "a number"),
]
NOT_NUMBERS = [
    (task, flag, kind, value)
    for task, flag, kind in NUMBER_OPTIONS
    for value in ("2.5", "abc", "")
    if not (kind == "a number" and value == "2.5")  # a float option takes 2.5
]


@pytest.mark.parametrize("which", PROGRAMS)
@pytest.mark.parametrize(("task", "flag", "kind", "value"), NOT_NUMBERS)
def test_a_value_a_number_option_cannot_take_is_a_usage_error(capsys, ran, which, task, flag, kind, value):
    """Item 8: `submit --nodes 2.5` ended in int()'s ValueError traceback."""
    code = _run(which, [task, flag, value])
    line = _one_usage_error(capsys.readouterr().err)
    assert code == 2
    assert line == f"error: UsageError: {flag} {value!r} is not {kind}"
    assert ran == []


@pytest.mark.parametrize("which", PROGRAMS)
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["install", "--prefix", "-c"], "install: --prefix needs a value"),
        (["config", "--profile"], "config: --profile needs a value"),
        (["wheelhouse"], "wheelhouse: the argument 'dest' is missing"),
        (["nosuchtask"], "no option or task 'nosuchtask'"),
        (["config", "--no-such-option"], "config: no option or task '--no-such-option'"),
    ],
)
def test_a_line_the_parser_cannot_read_is_a_usage_error_naming_the_option(capsys, ran, which, args, said):
    """Item 22: invoke's own parse errors exited 1 with `Flag <TaskArgument: prefix (r) *> needed
    value and was not given one!` and no hint."""
    code = _run(which, args)
    line = _one_usage_error(capsys.readouterr().err)
    assert code == 2
    assert said in line, line
    assert ran == []


@pytest.mark.parametrize("which", PROGRAMS)
@pytest.mark.parametrize(
    "args",
    [
        ["config", "--set"],
        ["config", "--set", "--profile", "cpu"],
        ["config", "-s"],
        ["build", "--target"],
        ["config", "--set", "max_jobs=2", "--set"],
        ["config", "--set", "max_jobs=2", "--set", "--profile", "cpu"],
        ["build", "--target", "c10", "--target"],
    ],
)
def test_a_repeatable_option_without_its_value_is_refused(capsys, ran, which, args):
    """Item 21: a bare `--set` (any repeatable option) was silently ignored."""
    flag = {"-s": "--set"}.get(args[1], args[1])
    code = _run(which, args)
    line = _one_usage_error(capsys.readouterr().err)
    assert code == 2
    assert f"{flag} needs a value" in line, line
    assert ran == []


def test_a_repeatable_option_keeps_every_value(ran, monkeypatch):
    """The values of --set still arrive, in order (raw_value now starts unset)."""
    seen = {}

    def execute(self):
        seen.update(self.tasks[0].args["set_"].value and {"set": self.tasks[0].args["set_"].value})

    monkeypatch.setattr(Program, "execute", execute)
    assert _run("invoke", ["config", "--set", "a=1", "-s", "b=2"]) == 0
    assert seen == {"set": ["a=1", "b=2"]}


def test_the_real_invoke_reports_a_missing_value_as_a_usage_error(tmp_path):
    """The reported case, with the real `invoke` in a fresh directory holding tasks.py's copy."""
    (tmp_path / "tasks.py").write_text((REPO / "tasks.py").read_text())
    res = subprocess.run(
        [sys.executable, "-m", "invoke", "install", "--prefix", "-c"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 2, res.stderr
    assert _one_usage_error(res.stderr) == "error: UsageError: invoke install: --prefix needs a value"


# Issue 41 item 17: a reader that closed the pipe early (`invoke config | head -1`) gave
# `PathError: invoke config: .: Broken pipe`, exit 15 (and invoke's own --list a traceback).
# Now nothing is printed and the status is a SIGPIPE'd tool's, 141, as the shell shows for
# `yes | head -1`. The reader here closes before the program writes a byte, so it always hits.
@pytest.mark.parametrize(
    "argv",
    [
        ["invoke", "config"],
        ["torchbuild", "config"],
        ["invoke", "config", "--keys"],
        ["invoke", "--list"],
        ["invoke", "--help", "build"],
    ],
)
def test_a_reader_that_closed_the_pipe_ends_the_program_quietly(tmp_path, argv):
    (tmp_path / "tasks.py").write_text((REPO / "tasks.py").read_text())
    program = (
        [sys.executable, "-m", "invoke"] if argv[0] == "invoke" else [str(Path(sys.executable).with_name("torchbuild"))]
    )
    proc = subprocess.Popen([*program, *argv[1:]], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


def test_a_broken_pipe_that_is_not_stdout_is_still_a_named_error(tmp_path, capsys):
    """A BrokenPipeError from writing to a child's stdin, with stdout fine, is a real fault."""
    from torchbuild.runtime.tasks import handles_errors

    @handles_errors
    def task() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(Exit) as done:
        task()
    assert done.value.code == 15 and "error: PathError" in capsys.readouterr().err
